package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	moebatch "moebatch/client/go"
	pb "moebatch/client/go/moebatchv1"
)

// usageError is bad input from the user: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...interface{}) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// helpRequested carries the help text asked for with -h (printed on stdout, exit code 0).
type helpRequested struct{ text string }

func (h *helpRequested) Error() string { return "help requested" }

// invocation is a parsed command line.
type invocation struct {
	command string
	server  string
	options moebatch.Options
	version bool // --version

	// submit
	file       string
	wait       bool
	noProgress bool
	interval   timeoutFlag // progress lines when stderr is not a terminal (0: the default)
	metadata   metadataFlag
	model      string
	// watch, status, results, cancel
	job string
	// list
	state    stateFlag
	limit    positiveInt
	pageSize positiveInt
	json     bool
	tenant   string
	// results
	output string
	noWait bool
}

// connFlags are the connection flags, accepted before and after the command (a value given
// after the command wins).
type connFlags struct {
	server        string
	token         string
	tls           bool
	tlsCA         string
	tlsCert       string
	tlsKey        string
	tlsServerName string
	timeout       timeoutFlag
}

func (c *connFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.server, "server", c.server,
		"moebatchd's `HOST:PORT` (default: $"+moebatch.ServerEnv+" or "+moebatch.DefaultServer+")")
	fs.StringVar(&c.token, "token", c.token,
		"bearer `TOKEN` sent with every call (default: $"+moebatch.TokenEnv+")")
	fs.BoolVar(&c.tls, "tls", c.tls, "connect over TLS (implied by the -tls-* flags; "+
		"without -tls-ca the system's CAs are trusted)")
	fs.StringVar(&c.tlsCA, "tls-ca", c.tlsCA, "PEM `FILE` of the CA that signed the server's certificate")
	fs.StringVar(&c.tlsCert, "tls-cert", c.tlsCert, "PEM `FILE` of the client certificate (mutual TLS)")
	fs.StringVar(&c.tlsKey, "tls-key", c.tlsKey, "PEM `FILE` of the client certificate's key")
	fs.StringVar(&c.tlsServerName, "tls-server-name", c.tlsServerName,
		"`NAME` to check the server's certificate against (default: the host of -server)")
	fs.Var(&c.timeout, "timeout", "deadline of each single call, in `SECONDS` or a Go duration "+
		"such as 90s (default 60); waiting for a job has none")
}

// options resolves the flags and the environment into a server address and client options.
func (c *connFlags) options(getenv func(string) string) (string, moebatch.Options, error) {
	server := c.server
	if server == "" {
		server = getenv(moebatch.ServerEnv)
	}
	if server == "" {
		server = moebatch.DefaultServer
	}
	opts := moebatch.Options{Timeout: c.timeout.value, Token: c.token}
	if opts.Token == "" {
		opts.Token = getenv(moebatch.TokenEnv)
	}
	if c.tls || c.tlsCA != "" || c.tlsCert != "" || c.tlsKey != "" || c.tlsServerName != "" {
		if (c.tlsCert == "") != (c.tlsKey == "") {
			return "", opts, usagef("-tls-cert and -tls-key go together")
		}
		opts.TLS = &moebatch.TLSOptions{CAFile: c.tlsCA, CertFile: c.tlsCert, KeyFile: c.tlsKey,
			ServerName: c.tlsServerName}
	}
	return server, opts, nil
}

// metadataFlag collects repeated KEY=VALUE pairs.
type metadataFlag map[string]string

func (m *metadataFlag) String() string {
	if m == nil || *m == nil {
		return ""
	}
	keys := make([]string, 0, len(*m))
	for k := range *m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	pairs := make([]string, len(keys))
	for i, k := range keys {
		pairs[i] = k + "=" + (*m)[k]
	}
	return strings.Join(pairs, ",")
}

func (m *metadataFlag) Set(text string) error {
	key, value, ok := strings.Cut(text, "=")
	if !ok || key == "" {
		return fmt.Errorf("expected KEY=VALUE, got %q", text)
	}
	if *m == nil {
		*m = metadataFlag{}
	}
	(*m)[key] = value
	return nil
}

// stateFlag is a job state by name; the zero value (UNSPECIFIED) means none given.
type stateFlag struct{ value pb.JobState }

func (s *stateFlag) String() string {
	if s == nil || s.value == pb.JobState_JOB_STATE_UNSPECIFIED {
		return ""
	}
	return moebatch.StateName(s.value)
}

func (s *stateFlag) Set(text string) error {
	state, err := moebatch.ParseState(text)
	if err != nil {
		return err
	}
	s.value = state
	return nil
}

// positiveInt is an integer >= 1; 0 means not given.
type positiveInt struct{ value int }

func (p *positiveInt) String() string {
	if p == nil || p.value == 0 {
		return ""
	}
	return strconv.Itoa(p.value)
}

func (p *positiveInt) Set(text string) error {
	n, err := strconv.Atoi(text)
	if err != nil || n < 1 {
		return fmt.Errorf("must be a positive integer, got %q", text)
	}
	p.value = n
	return nil
}

// timeoutFlag is a positive duration: seconds ("2.5") or a Go duration ("90s", "2m").
type timeoutFlag struct{ value time.Duration }

func (t *timeoutFlag) String() string {
	if t == nil || t.value == 0 {
		return ""
	}
	return t.value.String()
}

func (t *timeoutFlag) Set(text string) error {
	d, err := parseTimeout(text)
	if err != nil {
		return err
	}
	t.value = d
	return nil
}

func parseTimeout(text string) (time.Duration, error) {
	var d time.Duration
	if seconds, err := strconv.ParseFloat(text, 64); err == nil {
		if seconds > 0 && seconds < 1e9 {
			d = time.Duration(seconds * float64(time.Second))
		}
	} else if parsed, err := time.ParseDuration(text); err == nil {
		d = parsed
	}
	if d <= 0 {
		return 0, fmt.Errorf("must be a positive number of seconds or a duration such as 90s, got %q", text)
	}
	return d, nil
}

// commands, in the order the help lists them.
var commands = []struct{ name, args, summary string }{
	{"submit", "FILE.jsonl", "submit an OpenAI batch input file (one request per line, - for stdin) " +
		"as a job; prints the job as JSON"},
	{"watch", "JOB", "follow a job (any job: running or finished) with progress on stderr until " +
		"it ends; prints the final job as JSON; exit 0 when it completed, 1 when it failed or " +
		"was cancelled"},
	{"status", "JOB", "print a job as JSON, and a summary on stderr (start time, tokens, rate)"},
	{"list", "", "list jobs, newest first"},
	{"results", "JOB", "write a job's OpenAI batch output lines in input order; waits for the " +
		"job to finish unless -no-wait"},
	{"cancel", "JOB", "cancel a job; prints it as JSON"},
}

const exitCodesHelp = "Exit codes: 0 ok; 1 the server refused or failed the call, or a waited-for " +
	"(or watched) job " +
	"ended failed or cancelled; 2 bad usage or an unreadable input file; 130 interrupted."

func flagDefaults(fs *flag.FlagSet) string {
	var b strings.Builder
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	return b.String()
}

func mainHelp(global *flag.FlagSet) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: %s [flags] COMMAND [flags] [ARGS]\n\n", prog)
	b.WriteString("Submit OpenAI-batch JSONL jobs to moebatchd and fetch their results.\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(&b, "\nFlags (-flag and --flag are the same; before or after the command; "+
		"`%s COMMAND -h` shows the command's):\n", prog)
	b.WriteString(flagDefaults(global))
	b.WriteString("\n" + exitCodesHelp + "\n")
	return b.String()
}

// parseArgs parses the command line (without the program name).
func parseArgs(args []string, getenv func(string) string) (*invocation, error) {
	inv := &invocation{}
	var conn connFlags
	global := flag.NewFlagSet(prog, flag.ContinueOnError)
	global.SetOutput(io.Discard)
	conn.register(global)
	global.BoolVar(&inv.version, "version", false, "print the version and exit")
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, &helpRequested{text: mainHelp(global)}
		}
		return nil, usagef("%v (see %s -h)", err, prog)
	}
	if inv.version {
		return inv, nil
	}
	rest := global.Args()
	if len(rest) == 0 {
		return nil, usagef("a command is needed: submit, watch, status, list, results or cancel (see %s -h)", prog)
	}
	inv.command = rest[0]

	fs := flag.NewFlagSet(prog+" "+inv.command, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	conn.register(fs)
	var positional []string // names of the positional arguments, for the usage line
	switch inv.command {
	case "submit":
		fs.BoolVar(&inv.wait, "wait", false, "wait for the job to finish, with progress on stderr")
		fs.Var(&inv.metadata, "metadata", "`KEY=VALUE` kept with the job (repeatable)")
		fs.StringVar(&inv.model, "model", "", "the daemon's model `NAME` (default: any)")
		fs.BoolVar(&inv.noProgress, "no-progress", false, "with -wait: no progress display")
		fs.Var(&inv.interval, "interval", "with -wait, stderr not a terminal: a progress line at "+
			"most every `SECONDS`, and at each state change (default 5)")
		positional = []string{"FILE.jsonl"}
	case "watch":
		fs.BoolVar(&inv.noProgress, "no-progress", false, "no progress display")
		fs.Var(&inv.interval, "interval", "stderr not a terminal: a progress line at most every "+
			"`SECONDS`, and at each state change (default 5)")
		positional = []string{"JOB"}
	case "status", "cancel":
		positional = []string{"JOB"}
	case "list":
		fs.Var(&inv.state, "state", "only jobs in this `STATE` ("+strings.Join(moebatch.StateNames, ", ")+")")
		fs.Var(&inv.limit, "limit", "at most `N` jobs")
		fs.Var(&inv.pageSize, "page-size", "`N` jobs fetched per call (default 100, at most 1000)")
		fs.BoolVar(&inv.json, "json", false, "one JSON object per job")
		fs.StringVar(&inv.tenant, "tenant", "", "with an admin token: only this `TENANT`'s jobs "+
			"(default: every tenant's)")
	case "results":
		fs.StringVar(&inv.output, "o", "-", "output `FILE` (default: stdout); written whole or not at all")
		fs.StringVar(&inv.output, "output", "-", "same as -o")
		fs.BoolVar(&inv.noWait, "no-wait", false, "only the results committed so far")
		positional = []string{"JOB"}
	default:
		return nil, usagef("unknown command %q: expected submit, watch, status, list, results or cancel", inv.command)
	}
	values, err := parseInterleaved(fs, rest[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, &helpRequested{text: commandHelp(inv.command, positional, fs)}
		}
		return nil, usagef("%s: %v (see %s %s -h)", inv.command, err, prog, inv.command)
	}
	if len(values) != len(positional) {
		want := "no arguments"
		if len(positional) > 0 {
			want = strings.Join(positional, " ")
		}
		return nil, usagef("%s: expected %s, got %d argument(s) (see %s %s -h)", inv.command, want,
			len(values), prog, inv.command)
	}
	switch inv.command {
	case "submit":
		inv.file = values[0]
	case "watch", "status", "cancel", "results":
		inv.job = values[0]
		if inv.job == "" {
			return nil, usagef("%s: JOB must not be empty", inv.command)
		}
	}
	if inv.command == "results" && inv.output == "" {
		return nil, usagef("results: -o must name a file, or - for stdout")
	}
	if inv.server, inv.options, err = conn.options(getenv); err != nil {
		return nil, err
	}
	return inv, nil
}

func commandHelp(command string, positional []string, fs *flag.FlagSet) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: %s %s [flags]", prog, command)
	for _, p := range positional {
		b.WriteString(" " + p)
	}
	b.WriteString("\n\n")
	for _, c := range commands {
		if c.name == command {
			b.WriteString(strings.ToUpper(c.summary[:1]) + c.summary[1:] + ".\n\n")
		}
	}
	b.WriteString("Flags (-flag and --flag are the same; flags may follow the arguments):\n")
	b.WriteString(flagDefaults(fs))
	return b.String()
}

// parseInterleaved parses flags that may come before, between and after the positional
// arguments (the flag package alone stops at the first positional one); after "--" everything is
// positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}
