package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	moebatch "moebatch/client/go"
	"moebatch/client/go/internal/testserver"
	pb "moebatch/client/go/moebatchv1"
)

// result is one run of the command.
type result struct {
	code           int
	stdout, stderr string
}

func runCLI(ctx context.Context, getenv func(string) string, stdin string, args ...string) result {
	var stdout, stderr bytes.Buffer
	c := &cli{stdin: strings.NewReader(stdin), stdout: &stdout, stderr: &stderr, getenv: getenv}
	code := c.run(ctx, args)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

func startServer(t *testing.T, opts testserver.Options) *testserver.Server {
	t.Helper()
	srv, err := testserver.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return srv
}

const jsonl = `{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}
{"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": {"prompt": "y"}}
`

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func decodeJob(t *testing.T, text string) moebatch.JobView {
	t.Helper()
	var job moebatch.JobView
	if err := json.Unmarshal([]byte(text), &job); err != nil {
		t.Fatalf("not a job as JSON: %q: %v", text, err)
	}
	return job
}

func TestEndToEndAgainstAFakeDaemon(t *testing.T) {
	srv := startServer(t, testserver.Options{AutoComplete: true})
	ctx := context.Background()
	getenv := env(moebatch.ServerEnv, srv.Addr()) // the address from the environment
	input := writeFile(t, "in.jsonl", jsonl)

	r := runCLI(ctx, getenv, "", "submit", input, "--wait", "--no-progress", "--metadata", "team=go")
	if r.code != 0 {
		t.Fatalf("submit: %+v", r)
	}
	job := decodeJob(t, r.stdout)
	if job.State != "completed" || job.RequestCounts.Completed != 2 || job.Metadata["team"] != "go" {
		t.Errorf("submitted job %+v", job)
	}
	if !strings.HasPrefix(r.stderr, "moebatch-go: submitted job_1 (2 requests)\n") ||
		!strings.Contains(r.stderr, "moebatch-go: job_1 completed: 2 completed, 0 failed of 2 requests in ") {
		t.Errorf("submit stderr %q", r.stderr)
	}
	if !strings.HasPrefix(r.stdout, "{\n  \"id\": \"job_1\",\n  \"state\": \"completed\",") {
		t.Errorf("the job is printed indented: %q", r.stdout)
	}

	r = runCLI(ctx, getenv, "", "status", "job_1")
	if r.code != 0 || decodeJob(t, r.stdout).ID != "job_1" {
		t.Errorf("status: %+v", r)
	}

	r = runCLI(ctx, getenv, jsonl, "submit", "-") // from stdin, not waiting
	if r.code != 0 || decodeJob(t, r.stdout).State != "in_progress" {
		t.Errorf("submit -: %+v", r)
	}

	r = runCLI(ctx, getenv, "", "list")
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if r.code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "ID     STATE        DONE/TOTAL  FAILED  CREATED") ||
		!strings.HasPrefix(lines[1], "job_2  in_progress  0/2         0       ") ||
		!strings.HasPrefix(lines[2], "job_1  completed    2/2         0       ") {
		t.Errorf("list: %+v", r)
	}
	r = runCLI(ctx, getenv, "", "list", "--json", "--state", "completed")
	if r.code != 0 || strings.Count(r.stdout, "\n") != 1 || decodeJob(t, r.stdout).ID != "job_1" {
		t.Errorf("list --json --state completed: %+v", r)
	}
	r = runCLI(ctx, getenv, "", "list", "--limit", "1", "--page-size", "1")
	if r.code != 0 || strings.Count(r.stdout, "\n") != 2 || !strings.Contains(r.stdout, "job_2") {
		t.Errorf("list --limit 1: %+v", r)
	}

	r = runCLI(ctx, getenv, "", "list", "--json", "--tenant", "local")
	if r.code != 0 || strings.Count(r.stdout, "\n") != 2 || decodeJob(t, r.stdout[:strings.Index(r.stdout, "\n")]).Tenant != "local" {
		t.Errorf("list --tenant local: %+v", r)
	}
	r = runCLI(ctx, getenv, "", "list", "--tenant", "other")
	if r.code != 1 || !strings.HasPrefix(r.stderr, "moebatch-go: PERMISSION_DENIED: tenant: ") {
		t.Errorf("list --tenant other: %+v", r)
	}

	r = runCLI(ctx, getenv, "", "results", "job_1")
	outLines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if r.code != 0 || len(outLines) != 2 || r.stderr != "moebatch-go: 2 results\n" {
		t.Fatalf("results: %+v", r)
	}
	parsed, err := moebatch.ReadOutputLines(strings.NewReader(r.stdout))
	if err != nil || *parsed[0].CustomID != "a" || *parsed[1].CustomID != "b" {
		t.Errorf("result lines %v %v", parsed, err)
	}

	dir := t.TempDir()
	out := filepath.Join(dir, "out.jsonl")
	r = runCLI(ctx, getenv, "", "results", "job_1", "-o", out)
	written, err := os.ReadFile(out)
	if r.code != 0 || err != nil || string(written) != strings.Join(outLines, "\n")+"\n" {
		t.Errorf("results -o: %+v, file %q %v", r, written, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("a temporary file was left: %v", entries)
	}
	r = runCLI(ctx, getenv, "", "results", "job_1", "-o", filepath.Join(dir, "no", "such", "dir.jsonl"))
	if r.code != 2 || !strings.Contains(r.stderr, "no directory") {
		t.Errorf("results -o into a missing directory: %+v", r)
	}

	r = runCLI(ctx, getenv, "", "cancel", "job_2")
	if r.code != 0 || decodeJob(t, r.stdout).State != "cancelled" {
		t.Errorf("cancel: %+v", r)
	}
	r = runCLI(ctx, getenv, "", "cancel", "job_1") // finished: a no-op
	if r.code != 0 || decodeJob(t, r.stdout).State != "completed" {
		t.Errorf("cancel of a finished job: %+v", r)
	}
}

func TestServerErrorsExitOne(t *testing.T) {
	srv := startServer(t, testserver.Options{})
	ctx := context.Background()
	getenv := env()
	for _, command := range []string{"status", "cancel", "results"} {
		r := runCLI(ctx, getenv, "", command, "job_nope", "--server", srv.Addr())
		if r.code != 1 || r.stderr != "moebatch-go: NOT_FOUND: job job_nope not found\n" || r.stdout != "" {
			t.Errorf("%s of an unknown job: %+v", command, r)
		}
	}
	bad := writeFile(t, "bad.jsonl", jsonl+"{not json\n")
	r := runCLI(ctx, getenv, "", "submit", bad, "--server", srv.Addr())
	if r.code != 1 || !strings.HasPrefix(r.stderr, "moebatch-go: INVALID_ARGUMENT: line 3: invalid JSON") {
		t.Errorf("a bad line: %+v", r)
	}
	r = runCLI(ctx, getenv, "", "submit", filepath.Join(t.TempDir(), "missing.jsonl"), "--server", srv.Addr())
	if r.code != 2 || !strings.HasSuffix(r.stderr, "missing.jsonl: no such file or directory\n") {
		t.Errorf("a missing file: %+v", r)
	}
	// Nobody listens on a stopped server's port.
	down := startServer(t, testserver.Options{})
	addr := down.Addr()
	down.Stop()
	r = runCLI(ctx, getenv, "", "status", "job_1", "--server", addr, "--timeout", "5")
	if r.code != 1 || !strings.HasPrefix(r.stderr, "moebatch-go: UNAVAILABLE: ") {
		t.Errorf("no daemon: %+v", r)
	}
}

func TestUsageExitsTwo(t *testing.T) {
	for _, args := range [][]string{{}, {"frobnicate"}, {"status"}, {"list", "--state", "done"}} {
		r := runCLI(context.Background(), env(), "", args...)
		if r.code != 2 || !strings.HasPrefix(r.stderr, "moebatch-go: ") || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%q: %+v", args, r)
		}
	}
	r := runCLI(context.Background(), env(), "", "status", "j", "--tls-ca", "/nonexistent/ca.pem")
	if r.code != 2 || !strings.Contains(r.stderr, "TLS CA file") {
		t.Errorf("an unreadable CA file: %+v", r)
	}
	r = runCLI(context.Background(), env(), "", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "Commands:") || r.stderr != "" {
		t.Errorf("--help: %+v", r)
	}
	r = runCLI(context.Background(), env(), "", "--version")
	if r.code != 0 || r.stdout != "moebatch-go "+moebatch.Version+"\n" {
		t.Errorf("--version: %+v", r)
	}
}

func TestWaitedForJobCancelledExitsOne(t *testing.T) {
	srv := startServer(t, testserver.Options{})
	input := writeFile(t, "in.jsonl", jsonl)
	done := make(chan result, 1)
	go func() {
		done <- runCLI(context.Background(), env(), "", "--server", srv.Addr(), "submit", input, "--wait")
	}()
	client, err := moebatch.Dial(srv.Addr(), moebatch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// Cancel once the command watches the job (its second call, after CreateJob).
	deadline := time.Now().Add(10 * time.Second)
	for len(srv.Authorizations()) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the command never watched the job")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := client.CancelJob(context.Background(), "job_1"); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.code != 1 || !strings.HasSuffix(r.stderr, "moebatch-go: job job_1 was cancelled\n") ||
		decodeJob(t, r.stdout).State != "cancelled" {
		t.Errorf("%+v", r)
	}
	// The progress went to stderr (not a terminal: plain lines).
	if !strings.Contains(r.stderr, "moebatch-go: job_1 in_progress 0/2 done (0 failed)") {
		t.Errorf("no progress line in %q", r.stderr)
	}
}

func TestInterruptedWaitExits130(t *testing.T) {
	srv := startServer(t, testserver.Options{})
	input := writeFile(t, "in.jsonl", jsonl)
	// As on SIGINT: the context is cancelled while the command waits.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(300*time.Millisecond, cancel)
	r := runCLI(ctx, env(), "", "--server", srv.Addr(), "submit", input, "--wait", "--no-progress")
	if r.code != 130 || !strings.Contains(r.stderr, "stopped waiting; job_1 goes on (`moebatch-go cancel job_1` stops it)") {
		t.Errorf("%+v", r)
	}
	job, err := func() (*pb.Job, error) {
		c, err := moebatch.Dial(srv.Addr(), moebatch.Options{})
		if err != nil {
			return nil, err
		}
		defer c.Close()
		return c.GetJob(context.Background(), "job_1")
	}()
	if err != nil || job.GetState() != pb.JobState_JOB_STATE_IN_PROGRESS {
		t.Errorf("the job must go on: %v %v", job, err)
	}
}

func TestTokenAndTLSFlags(t *testing.T) {
	certs, err := testserver.NewCerts(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	mutual, err := certs.ServerTLS(true)
	if err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, testserver.Options{Token: "s3cret", TLS: mutual})
	ctx := context.Background()
	tlsArgs := []string{"--server", srv.Addr(), "--tls-ca", certs.CAFile, "--tls-cert", certs.ClientCertFile,
		"--tls-key", certs.ClientKeyFile}
	r := runCLI(ctx, env(moebatch.TokenEnv, "s3cret"), "", append([]string{"list"}, tlsArgs...)...)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "ID") {
		t.Errorf("token from the environment, mutual TLS: %+v", r)
	}
	r = runCLI(ctx, env(), "", append([]string{"list", "--token", "s3cret"}, tlsArgs...)...)
	if r.code != 0 {
		t.Errorf("token from the flag: %+v", r)
	}
	r = runCLI(ctx, env(), "", append([]string{"list"}, tlsArgs...)...)
	if r.code != 1 || r.stderr != "moebatch-go: UNAUTHENTICATED: missing bearer token\n" {
		t.Errorf("no token: %+v", r)
	}
	r = runCLI(ctx, env(), "", "list", "--token", "s3cret", "--server", srv.Addr(), "--tls-ca", certs.CAFile,
		"--timeout", "3")
	if r.code != 1 || !strings.HasPrefix(r.stderr, "moebatch-go: UNAVAILABLE: ") {
		t.Errorf("mutual TLS without a client certificate: %+v", r)
	}
	for _, a := range srv.Authorizations() {
		if a != "" && a != "Bearer s3cret" {
			t.Errorf("authorization %q", a)
		}
	}
}

func TestProgressDisplay(t *testing.T) {
	var buf bytes.Buffer
	clock := time.Unix(1000, 0)
	d := newProgressDisplay("job_1", &buf, false)
	d.now = func() time.Time { return clock }
	p := func(state pb.JobState, done int64) *pb.JobProgress {
		return &pb.JobProgress{State: state, RequestCounts: &pb.RequestCounts{Total: 10, Completed: done}}
	}
	d.update(p(pb.JobState_JOB_STATE_IN_PROGRESS, 1)) // the first: printed
	clock = clock.Add(time.Second)
	d.update(p(pb.JobState_JOB_STATE_IN_PROGRESS, 2)) // 1 s later, same state: not
	clock = clock.Add(5 * time.Second)
	d.update(p(pb.JobState_JOB_STATE_IN_PROGRESS, 5)) // 5 s after the last line: printed
	d.update(p(pb.JobState_JOB_STATE_COMPLETED, 10))  // a new state: printed
	d.close()
	want := "moebatch-go: job_1 in_progress 1/10 done (0 failed), 0 tokens, 10%, 0.0 tok/s, 0:00 elapsed, ETA ?\n" +
		"moebatch-go: job_1 in_progress 5/10 done (0 failed), 0 tokens, 50%, 0.0 tok/s, 0:00 elapsed, ETA ?\n" +
		"moebatch-go: job_1 completed 10/10 done (0 failed), 0 tokens, 100%, 0.0 tok/s, 0:00 elapsed, ETA ?\n"
	if buf.String() != want {
		t.Errorf("got\n%s\nwant\n%s", buf.String(), want)
	}

	buf.Reset()
	d = newProgressDisplay("job_2", &buf, true)
	d.update(p(pb.JobState_JOB_STATE_IN_PROGRESS, 1))
	// Continuous batching: no more requests done, but tokens: the bar moves.
	tokens := p(pb.JobState_JOB_STATE_IN_PROGRESS, 1)
	tokens.GeneratedTokens, tokens.MaxTokensTotal, tokens.TokensPerSecond = 600, 1000, 312.5
	tokens.ElapsedSeconds, tokens.EtaSeconds = 1.92, 1.28
	d.update(tokens)
	d.close()
	want = "\r\x1b[Kmoebatch-go: job_2 |##                  | in_progress 1/10 done (0 failed), 0 tokens, 10%, 0.0 tok/s, 0:00 elapsed, ETA ?" +
		"\r\x1b[Kmoebatch-go: job_2 |############        | in_progress 1/10 done (0 failed), 600/1000 tokens, 60%, 312.5 tok/s, 0:02 elapsed, ETA 0:01\n"
	if buf.String() != want {
		t.Errorf("terminal: got %q want %q", buf.String(), want)
	}
}

func TestWatch(t *testing.T) {
	srv := startServer(t, testserver.Options{})
	ctx := context.Background()
	getenv := env(moebatch.ServerEnv, srv.Addr())
	// A job another process submitted.
	r := runCLI(ctx, getenv, jsonl, "submit", "-")
	if r.code != 0 {
		t.Fatalf("submit: %+v", r)
	}
	done := make(chan result, 1)
	go func() { done <- runCLI(ctx, getenv, "", "watch", "job_1") }()
	deadline := time.Now().Add(10 * time.Second)
	for len(srv.Authorizations()) < 3 { // CreateJob, then watch's GetJob and WatchJob
		if time.Now().After(deadline) {
			t.Fatal("watch never watched the job")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if err := srv.Complete("job_1"); err != nil {
		t.Fatal(err)
	}
	r = <-done
	if r.code != 0 || decodeJob(t, r.stdout).State != "completed" {
		t.Fatalf("watch: %+v", r)
	}
	for _, want := range []string{
		"moebatch-go: watching job_1 (2 requests)\n",
		"moebatch-go: job_1 in_progress 0/2 done (0 failed), 0/8 tokens, 0%, 12.5 tok/s, 0:02 elapsed, ETA 0:42\n",
		"moebatch-go: job_1 completed 2/2 done (0 failed), 6/8 tokens, 100%, 12.5 tok/s, 0:02 elapsed, ETA ?\n",
		"moebatch-go: job_1 completed: 2 completed, 0 failed of 2 requests in 2.25s; 0 prompt tokens, 6 generated tokens, 12.5 tok/s\n",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("watch stderr %q lacks %q", r.stderr, want)
		}
	}
	if strings.Contains(r.stderr, "since submission") {
		t.Errorf("watch knows no submission time: %q", r.stderr)
	}

	// A finished job: its final state at once, no "watching" line.
	r = runCLI(ctx, getenv, "", "watch", "job_1", "--no-progress")
	if r.code != 0 || strings.Contains(r.stderr, "watching") ||
		!strings.HasPrefix(r.stderr, "moebatch-go: job_1 completed: 2 completed") {
		t.Errorf("watch a finished job: %+v", r)
	}
	// A cancelled one: exit 1, as submit -wait.
	runCLI(ctx, getenv, jsonl, "submit", "-")
	if r = runCLI(ctx, getenv, "", "cancel", "job_2"); r.code != 0 {
		t.Fatalf("cancel: %+v", r)
	}
	r = runCLI(ctx, getenv, "", "watch", "job_2")
	if r.code != 1 || !strings.HasSuffix(r.stderr, "moebatch-go: job job_2 was cancelled\n") ||
		decodeJob(t, r.stdout).State != "cancelled" {
		t.Errorf("watch a cancelled job: %+v", r)
	}
	r = runCLI(ctx, getenv, "", "watch", "job_9")
	if r.code != 1 || r.stderr != "moebatch-go: NOT_FOUND: job job_9 not found\n" {
		t.Errorf("watch an unknown job: %+v", r)
	}
}

func TestStatusSummary(t *testing.T) {
	srv := startServer(t, testserver.Options{})
	ctx := context.Background()
	getenv := env(moebatch.ServerEnv, srv.Addr())
	runCLI(ctx, getenv, jsonl, "submit", "-")
	if err := srv.Complete("job_1"); err != nil {
		t.Fatal(err)
	}
	r := runCLI(ctx, getenv, "", "status", "job_1")
	job := decodeJob(t, r.stdout)
	if r.code != 0 || job.StartedAt != 1700000001 || job.GeneratedTokens != 6 || job.PromptTokens != 2 ||
		job.TokensPerSecond != 2.4 || job.ElapsedSeconds != 2.25 {
		t.Errorf("status: %+v", r)
	}
	// The start from the job clock: finished_at less elapsed_seconds (2.25 s).
	want := "moebatch-go: job_1 completed: 2/2 done (0 failed); started " + moebatch.LocalTime(1700000007) +
		", ran 2.25s, finished " + moebatch.LocalTime(1700000010) +
		"; 2 prompt tokens, 6 generated tokens, 2.4 tok/s\n"
	if r.stderr != want {
		t.Errorf("status stderr %q, want %q", r.stderr, want)
	}
}

func TestFormatTable(t *testing.T) {
	got := formatTable([][]string{{"ID", "STATE", "X"}, {"job_10", "ok", ""}, {"j", "cancelled", "ü"}})
	want := "ID      STATE      X\njob_10  ok\nj       cancelled  ü\n"
	if got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
}
