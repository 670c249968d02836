// Package moebatch is the Go client of moebatchd, the moebatch batch-inference daemon: the
// moebatch.v1.BatchService gRPC API (proto/moebatch/v1/batch.proto; the generated messages are in
// package moebatch/client/go/moebatchv1).
//
//	client, err := moebatch.Dial(moebatch.DefaultServerAddr(), moebatch.Options{})
//	if err != nil { ... }
//	defer client.Close()
//	job, err := client.CreateJobJSONL(ctx, data, moebatch.JobOptions{})
//	job, last, err := client.WaitJob(ctx, job.GetId(), moebatch.WaitOptions{})
//	results, err := client.Results(ctx, job.GetId(), false)
//
// Unary calls (CreateJob, GetJob, ListJobs, CancelJob) run under the client's timeout; streams
// (WatchJob, GetResults, WaitJob) only under their context, since a job may run for hours. Every
// failed call returns an *Error with the gRPC status code and the daemon's message.
package moebatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"

	pb "moebatch/client/go/moebatchv1"
)

// Version is the version of this client and of the moebatch-go CLI.
const Version = "0.1.0"

// ErrStop, returned by a WatchJob or GetResults callback, ends the stream early without an
// error: the method returns nil.
var ErrStop = errors.New("moebatch: stop the stream")

// Client is a connection to moebatchd. It is safe for concurrent use; Close it when done.
type Client struct {
	addr    string
	conn    *grpc.ClientConn
	service pb.BatchServiceClient
	timeout time.Duration
	ownConn bool
}

// Dial connects to the daemon at addr ("host:port"; empty means DefaultServerAddr()). Like
// grpc.Dial it does not wait for the connection (see WaitReady); it fails only on bad options,
// e.g. a TLS file that cannot be read.
func Dial(addr string, opts Options) (*Client, error) {
	if addr == "" {
		addr = DefaultServerAddr()
	}
	dialOpts, err := opts.dialOptions()
	if err != nil {
		return nil, err
	}
	conn, err := grpc.Dial(addr, dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return &Client{addr: addr, conn: conn, service: pb.NewBatchServiceClient(conn),
		timeout: opts.timeout(), ownConn: true}, nil
}

// NewClient wraps an existing connection (which Close then leaves open); timeout is the deadline
// of each unary call, 0 for none.
func NewClient(conn *grpc.ClientConn, timeout time.Duration) *Client {
	return &Client{addr: conn.Target(), conn: conn, service: pb.NewBatchServiceClient(conn),
		timeout: timeout}
}

// Addr is the address the client connects to.
func (c *Client) Addr() string { return c.addr }

// Conn is the client's gRPC connection.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Service is the generated stub, for calls with options this package does not offer.
func (c *Client) Service() pb.BatchServiceClient { return c.service }

// Close closes the connection (unless it came from NewClient).
func (c *Client) Close() error {
	if !c.ownConn {
		return nil
	}
	return c.conn.Close()
}

// WaitReady blocks until the connection is up (e.g. while the daemon starts), or returns an
// Unavailable *Error when ctx ends first.
func (c *Client) WaitReady(ctx context.Context) error {
	for {
		state := c.conn.GetState()
		switch state {
		case connectivity.Ready:
			return nil
		case connectivity.Idle:
			// gRPC >= 1.41 leaves an idle channel idle until asked; older ones connect anyway.
			if conn, ok := interface{}(c.conn).(interface{ Connect() }); ok {
				conn.Connect()
			}
		case connectivity.Shutdown:
			return &Error{Code: codes.Unavailable, Message: "the client is closed"}
		}
		if !c.conn.WaitForStateChange(ctx, state) {
			return &Error{Code: codes.Unavailable,
				Message: fmt.Sprintf("no server answered at %s: %v", c.addr, ctx.Err())}
		}
	}
}

// unaryContext applies the client's timeout to a unary call.
func (c *Client) unaryContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.timeout > 0 {
		return context.WithTimeout(ctx, c.timeout)
	}
	return context.WithCancel(ctx)
}

// JobOptions are the optional parts of a new job.
type JobOptions struct {
	// Metadata are free-form string pairs kept with the job.
	Metadata map[string]string
	// Model is empty or the daemon's model name.
	Model string
}

// CreateJob submits a job of inline requests (see ChatRequest, CompletionRequest,
// TokenIDsRequest). They are sent as they are: the daemon validates them and refuses the whole
// job with InvalidArgument listing every bad request ("line N", 1-based, and the field; bounded
// to the first 20). Returns the accepted job, stored durably before the daemon answers.
func (c *Client) CreateJob(ctx context.Context, requests []*pb.BatchRequest, opts JobOptions) (*pb.Job, error) {
	return c.createJob(ctx, &pb.CreateJobRequest{
		Source:   &pb.CreateJobRequest_Requests{Requests: &pb.RequestList{Requests: requests}},
		Metadata: opts.Metadata,
		Model:    opts.Model,
	})
}

// CreateJobJSONL submits an OpenAI batch input file (one JSON request per line, docs/api.md),
// sent verbatim: the daemon validates it and names the line of every error, including text that
// is not UTF-8 (blank lines are skipped but counted in line numbers).
func (c *Client) CreateJobJSONL(ctx context.Context, jsonl []byte, opts JobOptions) (*pb.Job, error) {
	if jsonl == nil {
		jsonl = []byte{} // the oneof must be set even for an empty file
	}
	return c.createJob(ctx, &pb.CreateJobRequest{
		Source:   &pb.CreateJobRequest_Jsonl{Jsonl: jsonl},
		Metadata: opts.Metadata,
		Model:    opts.Model,
	})
}

func (c *Client) createJob(ctx context.Context, req *pb.CreateJobRequest) (*pb.Job, error) {
	ctx, cancel := c.unaryContext(ctx)
	defer cancel()
	job, err := c.service.CreateJob(ctx, req)
	return job, wrapError(err)
}

// GetJob returns the job with this id (NotFound for an unknown id).
func (c *Client) GetJob(ctx context.Context, jobID string) (*pb.Job, error) {
	ctx, cancel := c.unaryContext(ctx)
	defer cancel()
	job, err := c.service.GetJob(ctx, &pb.GetJobRequest{JobId: jobID})
	return job, wrapError(err)
}

// CancelJob cancels the job (a no-op on a finished one) and returns it, typically CANCELLING.
func (c *Client) CancelJob(ctx context.Context, jobID string) (*pb.Job, error) {
	ctx, cancel := c.unaryContext(ctx)
	defer cancel()
	job, err := c.service.CancelJob(ctx, &pb.CancelJobRequest{JobId: jobID})
	return job, wrapError(err)
}

// ListOptions select a page of jobs.
type ListOptions struct {
	// State filters the jobs; JOB_STATE_UNSPECIFIED (the zero value) means all.
	State pb.JobState
	// PageSize is the number of jobs per page; 0 means the daemon's default (20), at most 1000.
	PageSize int32
	// PageToken is the previous page's NextPageToken; empty for the first page.
	PageToken string
	// Tenant, for an admin token, lists only this tenant's jobs (empty: every tenant's); other
	// tokens may give only their own tenant (PermissionDenied otherwise).
	Tenant string
}

// ListJobs returns one page of jobs, newest first (see Jobs and ListAllJobs for all pages).
func (c *Client) ListJobs(ctx context.Context, opts ListOptions) (*pb.ListJobsResponse, error) {
	ctx, cancel := c.unaryContext(ctx)
	defer cancel()
	page, err := c.service.ListJobs(ctx, &pb.ListJobsRequest{
		PageSize: opts.PageSize, PageToken: opts.PageToken, State: opts.State, Tenant: opts.Tenant})
	return page, wrapError(err)
}

// JobIterator walks the jobs page by page, newest first:
//
//	it := client.Jobs(ctx, moebatch.ListOptions{PageSize: 100})
//	for it.Next() {
//		fmt.Println(it.Job().GetId())
//	}
//	if err := it.Err(); err != nil { ... }
type JobIterator struct {
	client *Client
	ctx    context.Context
	opts   ListOptions
	page   []*pb.Job
	job    *pb.Job
	err    error
	last   bool
}

// Jobs returns an iterator over the jobs that opts select (its State and Tenant), fetching pages
// of opts.PageSize as iteration goes on, from opts.PageToken on.
func (c *Client) Jobs(ctx context.Context, opts ListOptions) *JobIterator {
	return &JobIterator{client: c, ctx: ctx, opts: opts}
}

// Next advances to the next job, fetching the next page when needed; false at the end or on an
// error (see Err).
func (it *JobIterator) Next() bool {
	for len(it.page) == 0 {
		if it.last || it.err != nil {
			it.job = nil
			return false
		}
		resp, err := it.client.ListJobs(it.ctx, it.opts)
		if err != nil {
			it.err = err
			it.job = nil
			return false
		}
		it.page = resp.GetJobs()
		next := resp.GetNextPageToken()
		// The last page has no token; a token that repeats would loop forever.
		it.last = next == "" || next == it.opts.PageToken
		it.opts.PageToken = next
	}
	it.job, it.page = it.page[0], it.page[1:]
	return true
}

// Job is the current job (after Next returned true).
func (it *JobIterator) Job() *pb.Job { return it.job }

// Err is the error that ended the iteration, nil at a normal end.
func (it *JobIterator) Err() error { return it.err }

// ListAllJobs returns the jobs that opts select, newest first, fetched in pages of
// opts.PageSize; at most limit jobs when limit > 0.
func (c *Client) ListAllJobs(ctx context.Context, opts ListOptions, limit int) ([]*pb.Job, error) {
	var jobs []*pb.Job
	it := c.Jobs(ctx, opts)
	for (limit <= 0 || len(jobs) < limit) && it.Next() {
		jobs = append(jobs, it.Job())
	}
	return jobs, it.Err()
}

// receive runs a server stream to its end, handing each message to fn. A callback error ends the
// stream and is returned as it is (ErrStop: nil); a stream error comes back as an *Error.
func receive[T any](recv func() (T, error), fn func(T) error) error {
	for {
		msg, err := recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return wrapError(err)
		}
		if err := fn(msg); err != nil {
			if errors.Is(err, ErrStop) {
				return nil
			}
			return err
		}
	}
}

// WatchJob calls fn with the job's progress now and at every change until the job is terminal
// (the last message carries the terminal state). It returns when the stream ends, when fn
// returns an error (ErrStop: stop without one), or when ctx ends. There is no deadline besides
// ctx's.
func (c *Client) WatchJob(ctx context.Context, jobID string, fn func(*pb.JobProgress) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the stream when fn broke off
	stream, err := c.service.WatchJob(ctx, &pb.WatchJobRequest{JobId: jobID})
	if err != nil {
		return wrapError(err)
	}
	return receive(stream.Recv, fn)
}

// GetResults calls fn with the job's results in input order. Without wait: the results committed
// so far (all of them once the job is finished). With wait: follows the job until it is terminal.
// Requests dropped by a cancel have no result. It returns as WatchJob does.
func (c *Client) GetResults(ctx context.Context, jobID string, wait bool, fn func(*pb.Result) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.service.GetResults(ctx, &pb.GetResultsRequest{JobId: jobID, Wait: wait})
	if err != nil {
		return wrapError(err)
	}
	return receive(stream.Recv, fn)
}

// Results collects GetResults' messages, checking that their indexes increase.
func (c *Client) Results(ctx context.Context, jobID string, wait bool) ([]*pb.Result, error) {
	var results []*pb.Result
	err := c.GetResults(ctx, jobID, wait, func(r *pb.Result) error {
		if n := len(results); n > 0 && r.GetIndex() <= results[n-1].GetIndex() {
			return &Error{Code: codes.Internal, Message: fmt.Sprintf(
				"results of %s out of order: index %d after %d", jobID, r.GetIndex(),
				results[n-1].GetIndex())}
		}
		results = append(results, r)
		return nil
	})
	return results, err
}

// WaitOptions tune WaitJob.
type WaitOptions struct {
	// OnProgress, when not nil, is called with every progress message.
	OnProgress func(*pb.JobProgress)
	// ReconnectTimeout is how long WaitJob keeps reconnecting while the daemon is unavailable
	// (e.g. restarting); 0 means 60 s, a negative value not at all.
	ReconnectTimeout time.Duration
}

// WaitJob watches the job until it is terminal and returns the final job and the last progress
// message (nil if none came). If the daemon goes away (Unavailable, or the stream ends before the
// job is terminal) it reconnects with backoff for up to ReconnectTimeout, so a wait survives a
// daemon restart. Other errors, and ctx's end, return at once.
func (c *Client) WaitJob(ctx context.Context, jobID string, opts WaitOptions) (*pb.Job, *pb.JobProgress, error) {
	reconnect := opts.ReconnectTimeout
	if reconnect == 0 {
		reconnect = 60 * time.Second
	}
	var last *pb.JobProgress
	var deadline time.Time
	delay := 200 * time.Millisecond
	for {
		err := c.WatchJob(ctx, jobID, func(p *pb.JobProgress) error {
			deadline, delay = time.Time{}, 200*time.Millisecond
			last = p
			if opts.OnProgress != nil {
				opts.OnProgress(p)
			}
			return nil
		})
		if err == nil {
			job, getErr := c.GetJob(ctx, jobID)
			if getErr == nil && IsTerminal(job.GetState()) {
				return job, last, nil
			}
			err = getErr
			if err == nil {
				err = &Error{Code: codes.Unavailable,
					Message: fmt.Sprintf("the progress stream of %s ended early", jobID)}
			}
		}
		if ctx.Err() != nil || ErrorCode(err) != codes.Unavailable || reconnect < 0 {
			return nil, last, err
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(reconnect)
		}
		if !now.Before(deadline) {
			return nil, last, err
		}
		select {
		case <-ctx.Done():
			return nil, last, wrapError(ctx.Err())
		case <-time.After(delay):
		}
		if delay *= 2; delay > 5*time.Second {
			delay = 5 * time.Second
		}
	}
}
