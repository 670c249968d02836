// Command moebatch-go submits batch jobs to moebatchd and fetches their results: the Go twin of
// the Python client's `moebatch` command.
//
//	moebatch-go submit prompts.jsonl -wait      # progress on stderr, the final job on stdout
//	moebatch-go watch JOB                       # the same progress for any job
//	moebatch-go status JOB                      # the job as JSON; a summary on stderr
//	moebatch-go list [-state completed]
//	moebatch-go results JOB -o results.jsonl
//	moebatch-go cancel JOB
//
// Every command takes -server HOST:PORT (default $MOEBATCH_SERVER, else 127.0.0.1:50051),
// -token (default $MOEBATCH_TOKEN), -tls-ca / -tls-cert / -tls-key / -tls-server-name and
// -timeout; flags may be written -flag or --flag, before or after the command. Exit codes: 0 ok;
// 1 the server refused or failed the call, or a waited-for (or watched) job ended failed or
// cancelled (message
// on stderr, e.g. "moebatch-go: NOT_FOUND: job job_x not found"); 2 bad usage or an unreadable
// input file; 130 interrupted.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	moebatch "moebatch/client/go"
	pb "moebatch/client/go/moebatchv1"
)

const prog = "moebatch-go"

// Exit codes, as the Python CLI's.
const (
	exitOK          = 0
	exitServer      = 1
	exitUsage       = 2
	exitInterrupted = 130
)

// jobEndedBadly: a waited-for job ended failed or cancelled (exit code 1).
type jobEndedBadly struct{ msg string }

func (e *jobEndedBadly) Error() string { return e.msg }

// cli is the command's environment (the process's in main, fakes in the tests).
type cli struct {
	stdin     io.Reader
	stdout    io.Writer
	stderr    io.Writer
	getenv    func(string) string
	stderrTTY bool // draw the progress line in place
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	c := &cli{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv,
		stderrTTY: isTerminal(os.Stderr)}
	code := c.run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

func isTerminal(f *os.File) bool {
	info, err := f.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}

func (c *cli) errorf(format string, args ...interface{}) {
	fmt.Fprintf(c.stderr, prog+": "+format+"\n", args...)
}

// run executes a command line and returns the exit code.
func (c *cli) run(ctx context.Context, args []string) int {
	inv, err := parseArgs(args, c.getenv)
	if err != nil {
		var help *helpRequested
		if errors.As(err, &help) {
			fmt.Fprint(c.stdout, help.text)
			return exitOK
		}
		c.errorf("%v", err)
		return exitUsage
	}
	if inv.version {
		fmt.Fprintf(c.stdout, "%s %s\n", prog, moebatch.Version)
		return exitOK
	}
	client, err := moebatch.Dial(inv.server, inv.options)
	if err != nil { // options that cannot be used: an unreadable TLS file, a bad token
		c.errorf("%v", err)
		return exitUsage
	}
	defer client.Close()

	switch inv.command {
	case "submit":
		err = c.submit(ctx, client, inv)
	case "watch":
		err = c.watch(ctx, client, inv)
	case "status":
		err = c.status(ctx, client, inv)
	case "list":
		err = c.list(ctx, client, inv)
	case "results":
		err = c.results(ctx, client, inv)
	case "cancel":
		err = c.printJob(client.CancelJob(ctx, inv.job))
	}
	if err == nil {
		return exitOK
	}
	if ctx.Err() != nil { // interrupted (SIGINT, SIGTERM)
		return exitInterrupted
	}
	c.errorf("%v", err)
	var usage *usageError
	if errors.As(err, &usage) {
		return exitUsage
	}
	return exitServer
}

func (c *cli) printJob(job *pb.Job, err error) error {
	if err != nil {
		return err
	}
	enc := json.NewEncoder(c.stdout)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(moebatch.ViewJob(job))
}

func (c *cli) submit(ctx context.Context, client *moebatch.Client, inv *invocation) error {
	var data []byte
	var err error
	if inv.file == "-" {
		if data, err = io.ReadAll(c.stdin); err != nil {
			return usagef("cannot read standard input: %v", err)
		}
	} else if data, err = moebatch.ReadJSONLFile(inv.file); err != nil {
		return &usageError{msg: err.Error()}
	}
	started := time.Now()
	job, err := client.CreateJobJSONL(ctx, data,
		moebatch.JobOptions{Metadata: inv.metadata, Model: inv.model})
	if err != nil {
		return err
	}
	if !inv.wait {
		return c.printJob(job, nil)
	}
	c.errorf("submitted %s (%d requests)", job.GetId(), job.GetRequestCounts().GetTotal())
	return c.follow(ctx, client, job.GetId(), inv, started)
}

// watch follows any job (another process's, running or finished) as submit -wait does.
func (c *cli) watch(ctx context.Context, client *moebatch.Client, inv *invocation) error {
	job, err := client.GetJob(ctx, inv.job) // NOT_FOUND before any display
	if err != nil {
		return err
	}
	if !moebatch.IsTerminal(job.GetState()) {
		c.errorf("watching %s (%d requests)", job.GetId(), job.GetRequestCounts().GetTotal())
	}
	return c.follow(ctx, client, job.GetId(), inv, time.Time{})
}

// status prints the job as JSON on stdout and a summary for people on stderr.
func (c *cli) status(ctx context.Context, client *moebatch.Client, inv *invocation) error {
	job, err := client.GetJob(ctx, inv.job)
	if err != nil {
		return err
	}
	c.errorf("%s", moebatch.DescribeJob(job))
	return c.printJob(job, nil)
}

// follow waits for the job to end with a progress display (unless inv.noProgress; plain lines
// every inv.interval), then prints a summary on stderr and the final job on stdout; a job that
// failed or was cancelled is a jobEndedBadly. since: when the job was submitted (zero: not
// known).
func (c *cli) follow(ctx context.Context, client *moebatch.Client, jobID string, inv *invocation, since time.Time) error {
	display := newProgressDisplay(jobID, c.stderr, c.stderrTTY)
	if inv.interval.value > 0 {
		display.interval = inv.interval.value
	}
	opts := moebatch.WaitOptions{}
	if !inv.noProgress {
		opts.OnProgress = display.update
	}
	final, last, err := client.WaitJob(ctx, jobID, opts)
	display.close()
	if err != nil {
		if ctx.Err() != nil {
			c.errorf("stopped waiting; %s goes on (`%s cancel %s` stops it)", jobID, prog, jobID)
		}
		return err
	}
	counts := final.GetRequestCounts()
	summary := fmt.Sprintf("%s %s: %d completed, %d failed of %d requests in %.2fs", final.GetId(),
		moebatch.StateName(final.GetState()), counts.GetCompleted(), counts.GetFailed(),
		counts.GetTotal(), final.GetElapsedSeconds())
	if !since.IsZero() {
		summary += fmt.Sprintf(" (%.1fs since submission)", time.Since(since).Seconds())
	}
	if last != nil {
		summary += fmt.Sprintf("; %d prompt tokens, %d generated tokens, %.1f tok/s",
			last.GetPromptTokens(), last.GetGeneratedTokens(), last.GetTokensPerSecond())
	}
	c.errorf("%s", summary)
	if err := c.printJob(final, nil); err != nil {
		return err
	}
	switch final.GetState() {
	case pb.JobState_JOB_STATE_FAILED:
		reason := final.GetError()
		if reason == "" {
			reason = "no reason given"
		}
		return &jobEndedBadly{msg: fmt.Sprintf("job %s failed: %s", final.GetId(), reason)}
	case pb.JobState_JOB_STATE_CANCELLED:
		return &jobEndedBadly{msg: fmt.Sprintf("job %s was cancelled", final.GetId())}
	case pb.JobState_JOB_STATE_EXPIRED:
		return &jobEndedBadly{msg: fmt.Sprintf("job %s expired: its completion window passed",
			final.GetId())}
	}
	return nil
}

func timestamp(seconds int64) string {
	if seconds <= 0 {
		return "-"
	}
	return time.Unix(seconds, 0).Format("2006-01-02 15:04:05")
}

func (c *cli) list(ctx context.Context, client *moebatch.Client, inv *invocation) error {
	pageSize := inv.pageSize.value
	if pageSize == 0 {
		pageSize = 100
	}
	if pageSize > 1000 {
		pageSize = 1000 // the daemon's maximum
	}
	jobs, err := client.ListAllJobs(ctx, moebatch.ListOptions{State: inv.state.value,
		PageSize: int32(pageSize), Tenant: inv.tenant}, inv.limit.value)
	if err != nil {
		return err
	}
	if inv.json {
		enc := json.NewEncoder(c.stdout)
		enc.SetEscapeHTML(false)
		for _, job := range jobs {
			if err := enc.Encode(moebatch.ViewJob(job)); err != nil {
				return err
			}
		}
		return nil
	}
	rows := [][]string{{"ID", "STATE", "DONE/TOTAL", "FAILED", "CREATED"}}
	for _, job := range jobs {
		n := job.GetRequestCounts()
		rows = append(rows, []string{job.GetId(), moebatch.StateName(job.GetState()),
			fmt.Sprintf("%d/%d", n.GetCompleted()+n.GetFailed(), n.GetTotal()),
			fmt.Sprint(n.GetFailed()), timestamp(job.GetCreatedAt())})
	}
	_, err = io.WriteString(c.stdout, formatTable(rows))
	return err
}

// formatTable left-aligns columns two spaces apart, without trailing spaces.
func formatTable(rows [][]string) string {
	var widths []int
	for _, row := range rows {
		for i, cell := range row {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			if n := len([]rune(cell)); n > widths[i] {
				widths[i] = n
			}
		}
	}
	var b strings.Builder
	for _, row := range rows {
		var line strings.Builder
		for i, cell := range row {
			if i > 0 {
				line.WriteString("  ")
			}
			line.WriteString(cell + strings.Repeat(" ", widths[i]-len([]rune(cell))))
		}
		b.WriteString(strings.TrimRight(line.String(), " ") + "\n")
	}
	return b.String()
}

// writeResults streams the results to out, one line each, checking their order.
func writeResults(ctx context.Context, client *moebatch.Client, jobID string, wait bool, out io.Writer) (int, error) {
	count, previous := 0, int64(-1)
	err := client.GetResults(ctx, jobID, wait, func(r *pb.Result) error {
		if r.GetIndex() <= previous {
			return fmt.Errorf("results of %s out of order: index %d after %d", jobID, r.GetIndex(), previous)
		}
		previous = r.GetIndex()
		if _, err := io.WriteString(out, strings.TrimRight(r.GetLine(), "\n")+"\n"); err != nil {
			return err
		}
		count++
		return nil
	})
	return count, err
}

func (c *cli) results(ctx context.Context, client *moebatch.Client, inv *invocation) error {
	wait := !inv.noWait
	if inv.output == "-" {
		count, err := writeResults(ctx, client, inv.job, wait, c.stdout)
		if err != nil {
			return err
		}
		c.errorf("%d results", count)
		return nil
	}
	target, err := filepath.Abs(inv.output)
	if err != nil {
		return usagef("cannot write %s: %v", inv.output, err)
	}
	dir := filepath.Dir(target)
	if info, err := os.Stat(dir); err != nil || !info.IsDir() {
		return usagef("cannot write %s: no directory %s", inv.output, dir)
	}
	// Written to a temporary file beside the target, renamed when complete.
	tmp, err := os.CreateTemp(dir, ".moebatch-results-*.tmp")
	if err != nil {
		return usagef("cannot write %s: %v", inv.output, err)
	}
	count, err := writeResults(ctx, client, inv.job, wait, tmp)
	if closeErr := tmp.Close(); err == nil && closeErr != nil {
		err = fmt.Errorf("cannot write %s: %w", inv.output, closeErr)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), target)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return err
	}
	c.errorf("wrote %d results to %s", count, inv.output)
	return nil
}
