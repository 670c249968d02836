package main

import (
	"reflect"
	"strings"
	"testing"
	"time"

	moebatch "moebatch/client/go"
	pb "moebatch/client/go/moebatchv1"
)

func env(pairs ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(pairs); i += 2 {
		m[pairs[i]] = pairs[i+1]
	}
	return func(key string) string { return m[key] }
}

func mustParse(t *testing.T, getenv func(string) string, args ...string) *invocation {
	t.Helper()
	inv, err := parseArgs(args, getenv)
	if err != nil {
		t.Fatalf("parseArgs(%q): %v", args, err)
	}
	return inv
}

func TestSubmitArguments(t *testing.T) {
	inv := mustParse(t, env(), "submit", "in.jsonl", "--wait", "--metadata", "a=1", "--metadata",
		"b=x=y", "-model", "tiny")
	if inv.command != "submit" || inv.file != "in.jsonl" || !inv.wait || inv.noProgress || inv.model != "tiny" {
		t.Errorf("%+v", inv)
	}
	if !reflect.DeepEqual(map[string]string(inv.metadata), map[string]string{"a": "1", "b": "x=y"}) {
		t.Errorf("metadata %v", inv.metadata)
	}
	if inv.server != "127.0.0.1:50051" || inv.options.Token != "" || inv.options.TLS != nil || inv.options.Timeout != 0 {
		t.Errorf("defaults: server %q options %+v", inv.server, inv.options)
	}
	// Flags before the file, and "-" for stdin.
	inv = mustParse(t, env(), "submit", "--no-progress", "--wait", "-")
	if inv.file != "-" || !inv.noProgress || !inv.wait {
		t.Errorf("%+v", inv)
	}
}

func TestWatchArguments(t *testing.T) {
	inv := mustParse(t, env(), "watch", "job_1", "--interval", "0.2", "--no-progress")
	if inv.command != "watch" || inv.job != "job_1" || !inv.noProgress ||
		inv.interval.value != 200*time.Millisecond {
		t.Errorf("%+v", inv)
	}
	if inv = mustParse(t, env(), "watch", "job_1"); inv.interval.value != 0 || inv.noProgress {
		t.Errorf("defaults: %+v", inv)
	}
	if inv = mustParse(t, env(), "submit", "-", "--wait", "--interval", "2s"); inv.interval.value != 2*time.Second {
		t.Errorf("submit -interval: %+v", inv)
	}
	for _, args := range [][]string{{"watch"}, {"watch", "a", "b"}, {"watch", ""}, {"watch", "j", "--interval", "0"}} {
		if _, err := parseArgs(args, env()); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

func TestServerBeforeOrAfterTheCommand(t *testing.T) {
	for _, args := range [][]string{
		{"--server", "h:1", "status", "job_1"},
		{"status", "job_1", "--server", "h:1"},
		{"status", "--server=h:1", "job_1"},
		{"-server", "h:1", "status", "job_1"},
		{"--server", "other:2", "status", "job_1", "--server", "h:1"}, // the later one wins
	} {
		inv := mustParse(t, env(moebatch.ServerEnv, "env:9"), args...)
		if inv.server != "h:1" || inv.job != "job_1" || inv.command != "status" {
			t.Errorf("%q: server %q job %q", args, inv.server, inv.job)
		}
	}
}

func TestEnvironment(t *testing.T) {
	getenv := env(moebatch.ServerEnv, "env:9", moebatch.TokenEnv, "from-env")
	inv := mustParse(t, getenv, "cancel", "job_2")
	if inv.server != "env:9" || inv.options.Token != "from-env" || inv.job != "job_2" {
		t.Errorf("from the environment: %q %+v", inv.server, inv.options)
	}
	inv = mustParse(t, getenv, "cancel", "job_2", "--token", "flag")
	if inv.options.Token != "flag" {
		t.Errorf("-token must win over $%s: %q", moebatch.TokenEnv, inv.options.Token)
	}
}

func TestOtherCommands(t *testing.T) {
	inv := mustParse(t, env(), "list", "--state", "in_progress", "--limit", "5", "--json", "--page-size", "7",
		"--tenant", "team-a")
	if inv.state.value != pb.JobState_JOB_STATE_IN_PROGRESS || inv.limit.value != 5 || !inv.json ||
		inv.pageSize.value != 7 || inv.tenant != "team-a" {
		t.Errorf("list: %+v", inv)
	}
	if mustParse(t, env(), "list", "--state", "COMPLETED").state.value != pb.JobState_JOB_STATE_COMPLETED {
		t.Error("list --state COMPLETED")
	}
	if inv := mustParse(t, env(), "list"); inv.state.value != pb.JobState_JOB_STATE_UNSPECIFIED || inv.limit.value != 0 {
		t.Errorf("list defaults: %+v", inv)
	}
	inv = mustParse(t, env(), "results", "job_1", "-o", "out.jsonl")
	if inv.output != "out.jsonl" || inv.noWait || inv.job != "job_1" {
		t.Errorf("results: %+v", inv)
	}
	if inv := mustParse(t, env(), "results", "--output=x.jsonl", "--no-wait", "job_1"); inv.output != "x.jsonl" || !inv.noWait {
		t.Errorf("results --output: %+v", inv)
	}
	if mustParse(t, env(), "results", "job_1").output != "-" {
		t.Error("results writes to stdout by default")
	}
	if mustParse(t, env(), "status", "--", "-odd-id").job != "-odd-id" {
		t.Error("after --, an argument that looks like a flag is positional")
	}
}

func TestTimeoutAndTLSFlags(t *testing.T) {
	for text, want := range map[string]time.Duration{"2.5": 2500 * time.Millisecond, "90s": 90 * time.Second,
		"2m": 2 * time.Minute, "1": time.Second} {
		if got := mustParse(t, env(), "--timeout", text, "status", "j").options.Timeout; got != want {
			t.Errorf("--timeout %s = %v, want %v", text, got, want)
		}
	}
	inv := mustParse(t, env(), "status", "j", "--tls-ca", "ca.pem", "--tls-cert", "c.pem", "--tls-key",
		"c.key", "--tls-server-name", "daemon.internal")
	want := &moebatch.TLSOptions{CAFile: "ca.pem", CertFile: "c.pem", KeyFile: "c.key", ServerName: "daemon.internal"}
	if !reflect.DeepEqual(inv.options.TLS, want) {
		t.Errorf("TLS %+v", inv.options.TLS)
	}
	if inv := mustParse(t, env(), "--tls", "status", "j"); inv.options.TLS == nil || *inv.options.TLS != (moebatch.TLSOptions{}) {
		t.Errorf("--tls alone: %+v", inv.options.TLS)
	}
}

func TestUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{nil, "a command is needed"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"submit"}, "submit: expected FILE.jsonl, got 0 argument(s)"},
		{[]string{"status"}, "status: expected JOB"},
		{[]string{"status", "a", "b"}, "got 2 argument(s)"},
		{[]string{"status", ""}, "JOB must not be empty"},
		{[]string{"list", "extra"}, "list: expected no arguments, got 1"},
		{[]string{"list", "--state", "done"}, "must be one of validating, in_progress"},
		{[]string{"list", "--limit", "0"}, "must be a positive integer"},
		{[]string{"list", "--page-size", "x"}, "must be a positive integer"},
		{[]string{"--timeout", "0", "status", "j"}, "must be a positive number of seconds"},
		{[]string{"status", "j", "--timeout", "soon"}, "must be a positive number of seconds"},
		{[]string{"submit", "f", "--metadata", "novalue"}, "expected KEY=VALUE"},
		{[]string{"submit", "f", "--metadata", "=v"}, "expected KEY=VALUE"},
		{[]string{"status", "--bogus", "j"}, "flag provided but not defined: -bogus"},
		{[]string{"--bogus", "status", "j"}, "flag provided but not defined: -bogus"},
		{[]string{"status", "j", "--server"}, "flag needs an argument"},
		{[]string{"results", "j", "-o", ""}, "-o must name a file"},
		{[]string{"status", "j", "--tls-cert", "c.pem"}, "-tls-cert and -tls-key go together"},
	}
	for _, c := range cases {
		_, err := parseArgs(c.args, env())
		if _, ok := err.(*usageError); !ok {
			t.Errorf("%q: error %v (%T), want a usage error", c.args, err, err)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %q does not contain %q", c.args, err, c.want)
		}
	}
}

func TestHelp(t *testing.T) {
	_, err := parseArgs([]string{"-h"}, env())
	help, ok := err.(*helpRequested)
	if !ok {
		t.Fatalf("-h: %v", err)
	}
	for _, want := range []string{"Usage: moebatch-go", "submit", "results", "-server HOST:PORT", "Exit codes"} {
		if !strings.Contains(help.text, want) {
			t.Errorf("main help lacks %q:\n%s", want, help.text)
		}
	}
	_, err = parseArgs([]string{"list", "--help"}, env())
	help, ok = err.(*helpRequested)
	if !ok || !strings.Contains(help.text, "Usage: moebatch-go list") || !strings.Contains(help.text, "-state STATE") {
		t.Errorf("list --help: %v", err)
	}
}
