// Package testserver is an in-memory moebatch.v1.BatchService for the Go client's unit tests: a
// real gRPC server on loopback (plaintext or TLS, optionally requiring a bearer token or a client
// certificate) whose jobs complete on demand with made-up results. It checks only what the tests
// need (custom_id present and unique, lines that are JSON objects), with the daemon's messages.
package testserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "moebatch/client/go/moebatchv1"
)

// Options configure a Server.
type Options struct {
	// Token, when not empty, is required as "authorization: Bearer <Token>" on every call
	// (Unauthenticated otherwise, as moebatchd does with a tokens file).
	Token string
	// TLS, when not nil, serves TLS with this configuration (set ClientAuth and ClientCAs for
	// mutual TLS).
	TLS *tls.Config
	// AutoComplete completes a running job when a client watches it or waits for its results;
	// without it a job stays in progress until Complete or a cancel.
	AutoComplete bool
	// UnavailableWatches is how many WatchJob calls fail with Unavailable before they work (to
	// test reconnecting).
	UnavailableWatches int
}

type job struct {
	pb      *pb.Job
	ids     []string
	changed chan struct{} // closed and replaced at every change
}

// Server is the fake daemon. Its methods are safe for concurrent use.
type Server struct {
	pb.UnimplementedBatchServiceServer
	opts     Options
	grpc     *grpc.Server
	listener net.Listener

	mu          sync.Mutex
	jobs        []*job // in creation order
	auth        []string
	unavailable int
	lastCreate  *pb.CreateJobRequest
}

// Start serves on a free loopback port until Stop.
func Start(opts Options) (*Server, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts, listener: lis, unavailable: opts.UnavailableWatches}
	var serverOpts []grpc.ServerOption
	if opts.TLS != nil {
		serverOpts = append(serverOpts, grpc.Creds(credentials.NewTLS(opts.TLS)))
	}
	serverOpts = append(serverOpts,
		grpc.UnaryInterceptor(func(ctx context.Context, req interface{}, _ *grpc.UnaryServerInfo,
			handler grpc.UnaryHandler) (interface{}, error) {
			if err := s.authorize(ctx); err != nil {
				return nil, err
			}
			return handler(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv interface{}, ss grpc.ServerStream, _ *grpc.StreamServerInfo,
			handler grpc.StreamHandler) error {
			if err := s.authorize(ss.Context()); err != nil {
				return err
			}
			return handler(srv, ss)
		}))
	s.grpc = grpc.NewServer(serverOpts...)
	pb.RegisterBatchServiceServer(s.grpc, s)
	go func() { _ = s.grpc.Serve(lis) }()
	return s, nil
}

// Addr is the server's "127.0.0.1:port".
func (s *Server) Addr() string { return s.listener.Addr().String() }

// Stop stops the server, ending open streams.
func (s *Server) Stop() { s.grpc.Stop() }

// Authorizations are the authorization metadata values of every call so far ("" for a call
// without one).
func (s *Server) Authorizations() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.auth...)
}

// LastCreate is the last CreateJob request received.
func (s *Server) LastCreate() *pb.CreateJobRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastCreate
}

func (s *Server) authorize(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	value := ""
	if v := md.Get("authorization"); len(v) > 0 {
		value = v[0]
	}
	s.mu.Lock()
	s.auth = append(s.auth, value)
	s.mu.Unlock()
	if s.opts.Token == "" {
		return nil
	}
	if value == "" {
		return status.Error(codes.Unauthenticated, "missing bearer token")
	}
	if value != "Bearer "+s.opts.Token {
		return status.Error(codes.Unauthenticated, "invalid bearer token")
	}
	return nil
}

func invalid(format string, args ...interface{}) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// customIDs checks a JSONL payload the way the tests need: every non-blank line a JSON object
// with a non-empty string custom_id, unique in the job.
func customIDs(data []byte) ([]string, error) {
	var ids []string
	for i, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(line, &obj); err != nil {
			return nil, invalid("line %d: invalid JSON: %v", i+1, err)
		}
		var id string
		if err := json.Unmarshal(obj["custom_id"], &id); err != nil || id == "" {
			return nil, invalid("line %d: custom_id: must be a non-empty string", i+1)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// CreateJob stores the job, in progress (or refuses it with InvalidArgument).
func (s *Server) CreateJob(ctx context.Context, req *pb.CreateJobRequest) (*pb.Job, error) {
	var ids []string
	switch src := req.GetSource().(type) {
	case *pb.CreateJobRequest_Jsonl:
		var err error
		if ids, err = customIDs(src.Jsonl); err != nil {
			return nil, err
		}
	case *pb.CreateJobRequest_Requests:
		for i, r := range src.Requests.GetRequests() {
			if r.GetCustomId() == "" {
				return nil, invalid("line %d: custom_id: must be a non-empty string", i+1)
			}
			ids = append(ids, r.GetCustomId())
		}
	}
	if len(ids) == 0 {
		return nil, invalid("requests: the job has no requests")
	}
	seen := map[string]bool{}
	for i, id := range ids {
		if seen[id] {
			return nil, invalid("line %d: custom_id: '%s' is used twice", i+1, id)
		}
		seen[id] = true
	}
	if req.GetModel() != "" && req.GetModel() != "tiny" {
		return nil, invalid("model: the daemon serves tiny, got %q", req.GetModel())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastCreate = req
	j := &job{
		pb: &pb.Job{
			Id:            fmt.Sprintf("job_%d", len(s.jobs)+1),
			State:         pb.JobState_JOB_STATE_IN_PROGRESS,
			Model:         "tiny",
			Metadata:      req.GetMetadata(),
			RequestCounts: &pb.RequestCounts{Total: int64(len(ids))},
			CreatedAt:     1700000000 + int64(len(s.jobs)),
			Tenant:        "local",
		},
		ids:     ids,
		changed: make(chan struct{}),
	}
	s.jobs = append(s.jobs, j)
	return cloneJob(j.pb), nil
}

func cloneJob(j *pb.Job) *pb.Job {
	return proto.Clone(j).(*pb.Job)
}

// find returns the job; the caller holds s.mu.
func (s *Server) find(id string) (*job, error) {
	for _, j := range s.jobs {
		if j.pb.Id == id {
			return j, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "job %s not found", id)
}

// setState changes a job's state; the caller holds s.mu.
func (j *job) setState(state pb.JobState) {
	j.pb.State = state
	if state == pb.JobState_JOB_STATE_COMPLETED {
		j.pb.RequestCounts.Completed = j.pb.RequestCounts.Total
		j.pb.StartedAt = j.pb.CreatedAt + 1
		j.pb.FinishedAt = j.pb.CreatedAt + 10
		j.pb.PromptTokens = j.pb.RequestCounts.Total
		j.pb.GeneratedTokens = 3 * j.pb.RequestCounts.Total
		j.pb.ElapsedSeconds = 2.25
		j.pb.TokensPerSecond = 2.4
	}
	if state == pb.JobState_JOB_STATE_CANCELLED {
		j.pb.FinishedAt = j.pb.CreatedAt + 5
	}
	close(j.changed)
	j.changed = make(chan struct{})
}

// Complete finishes a running job: every request gets a result.
func (s *Server) Complete(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, err := s.find(id)
	if err != nil {
		return err
	}
	if j.pb.State == pb.JobState_JOB_STATE_IN_PROGRESS {
		j.setState(pb.JobState_JOB_STATE_COMPLETED)
	}
	return nil
}

// GetJob returns the job.
func (s *Server) GetJob(ctx context.Context, req *pb.GetJobRequest) (*pb.Job, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, err := s.find(req.GetJobId())
	if err != nil {
		return nil, err
	}
	return cloneJob(j.pb), nil
}

// CancelJob cancels a running job; a finished one is returned unchanged.
func (s *Server) CancelJob(ctx context.Context, req *pb.CancelJobRequest) (*pb.Job, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, err := s.find(req.GetJobId())
	if err != nil {
		return nil, err
	}
	if j.pb.State == pb.JobState_JOB_STATE_IN_PROGRESS {
		j.setState(pb.JobState_JOB_STATE_CANCELLED)
	}
	return cloneJob(j.pb), nil
}

// ListJobs pages the jobs newest first; the page token is the offset.
func (s *Server) ListJobs(ctx context.Context, req *pb.ListJobsRequest) (*pb.ListJobsResponse, error) {
	size := int(req.GetPageSize())
	if size < 0 || size > 1000 {
		return nil, invalid("page_size: must be in [0, 1000], got %d", size)
	}
	if size == 0 {
		size = 20
	}
	if req.GetTenant() != "" && req.GetTenant() != "local" {
		return nil, status.Errorf(codes.PermissionDenied, "tenant: only the local tenant's jobs, got %q",
			req.GetTenant())
	}
	offset := 0
	if req.GetPageToken() != "" {
		var err error
		if offset, err = strconv.Atoi(req.GetPageToken()); err != nil || offset < 0 {
			return nil, invalid("page_token: invalid")
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var matching []*pb.Job
	for i := len(s.jobs) - 1; i >= 0; i-- {
		j := s.jobs[i]
		if req.GetState() == pb.JobState_JOB_STATE_UNSPECIFIED || j.pb.State == req.GetState() {
			matching = append(matching, cloneJob(j.pb))
		}
	}
	resp := &pb.ListJobsResponse{}
	if offset < len(matching) {
		end := offset + size
		if end > len(matching) {
			end = len(matching)
		}
		resp.Jobs = matching[offset:end]
		if end < len(matching) {
			resp.NextPageToken = strconv.Itoa(end)
		}
	}
	return resp, nil
}

// contextError is the status of a call whose context ended (the client cancelled it or its
// deadline passed).
func contextError(ctx context.Context) error {
	if ctx.Err() == context.DeadlineExceeded {
		return status.Error(codes.DeadlineExceeded, ctx.Err().Error())
	}
	return status.Error(codes.Canceled, ctx.Err().Error())
}

func terminal(state pb.JobState) bool {
	return state == pb.JobState_JOB_STATE_COMPLETED || state == pb.JobState_JOB_STATE_FAILED ||
		state == pb.JobState_JOB_STATE_CANCELLED
}

// snapshot returns the job's progress and its change channel, completing it first under
// AutoComplete when complete is set.
func (s *Server) snapshot(id string, complete bool) (*pb.JobProgress, []string, <-chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, err := s.find(id)
	if err != nil {
		return nil, nil, nil, err
	}
	if complete && s.opts.AutoComplete && j.pb.State == pb.JobState_JOB_STATE_IN_PROGRESS {
		j.setState(pb.JobState_JOB_STATE_COMPLETED)
	}
	counts := proto.Clone(j.pb.RequestCounts).(*pb.RequestCounts)
	// Each request may generate 4 tokens and generates 3.
	p := &pb.JobProgress{JobId: id, State: j.pb.State, RequestCounts: counts,
		GeneratedTokens: 3 * counts.Completed, TokensPerSecond: 12.5,
		MaxTokensTotal: 4 * counts.Total, ElapsedSeconds: 2.25}
	if !terminal(j.pb.State) {
		p.EtaSeconds = 42
	}
	ids := j.ids
	if j.pb.State == pb.JobState_JOB_STATE_CANCELLED {
		ids = nil // cancelled before any result
	}
	return p, ids, j.changed, nil
}

// WatchJob sends the progress now and at every change until the job is terminal.
func (s *Server) WatchJob(req *pb.WatchJobRequest, stream pb.BatchService_WatchJobServer) error {
	s.mu.Lock()
	if s.unavailable > 0 {
		s.unavailable--
		s.mu.Unlock()
		return status.Error(codes.Unavailable, "restarting")
	}
	s.mu.Unlock()
	first := true
	for {
		p, _, changed, err := s.snapshot(req.GetJobId(), !first)
		if err != nil {
			return err
		}
		if err := stream.Send(p); err != nil {
			return err
		}
		if terminal(p.State) {
			return nil
		}
		if !first || !s.opts.AutoComplete {
			select {
			case <-changed:
			case <-stream.Context().Done():
				return contextError(stream.Context())
			}
		}
		first = false
	}
}

// resultLine is a made-up completion output line for request i.
func resultLine(jobID string, i int, customID string) string {
	line := map[string]interface{}{
		"id":        fmt.Sprintf("batch_req_%s_%d", jobID, i),
		"custom_id": customID,
		"response": map[string]interface{}{
			"status_code": 200,
			"request_id":  fmt.Sprintf("req_%s_%d", jobID, i),
			"body": map[string]interface{}{
				"object": "text_completion",
				"model":  "tiny",
				"choices": []interface{}{map[string]interface{}{
					"index": 0, "text": strings.Repeat("x", i+1), "finish_reason": "length",
					"token_ids": []int{i, i + 1, i + 2},
				}},
				"usage": map[string]int{"prompt_tokens": 1, "completion_tokens": 3,
					"total_tokens": 4},
			},
		},
		"error": nil,
	}
	data, err := json.Marshal(line)
	if err != nil {
		panic(err) // maps of strings and numbers always marshal
	}
	return string(data)
}

// GetResults sends the results of a completed job; with wait it first waits for the job to end.
func (s *Server) GetResults(req *pb.GetResultsRequest, stream pb.BatchService_GetResultsServer) error {
	for {
		p, ids, changed, err := s.snapshot(req.GetJobId(), req.GetWait())
		if err != nil {
			return err
		}
		if !terminal(p.State) && req.GetWait() {
			select {
			case <-changed:
				continue
			case <-stream.Context().Done():
				return contextError(stream.Context())
			}
		}
		if p.State != pb.JobState_JOB_STATE_COMPLETED {
			return nil // nothing committed yet, or cancelled before any result
		}
		for i, id := range ids {
			r := &pb.Result{Index: int64(i), CustomId: id, Line: resultLine(req.GetJobId(), i, id)}
			if err := stream.Send(r); err != nil {
				return err
			}
		}
		return nil
	}
}
