package moebatch

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"moebatch/client/go/internal/testserver"
	pb "moebatch/client/go/moebatchv1"
)

// start runs a fake daemon and a client connected to it, both closed when the test ends.
func start(t *testing.T, serverOpts testserver.Options, clientOpts Options) (*testserver.Server, *Client) {
	t.Helper()
	srv, err := testserver.Start(serverOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	if clientOpts.Timeout == 0 {
		clientOpts.Timeout = 10 * time.Second
	}
	client, err := Dial(srv.Addr(), clientOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return srv, client
}

func wantCode(t *testing.T, err error, code codes.Code, substr string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T), want an *Error %v", err, err, code)
	}
	if e.Code != code || !strings.Contains(e.Message, substr) {
		t.Fatalf("error %v, want %s containing %q", err, CodeName(code), substr)
	}
}

const twoLines = `{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}
{"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": {"prompt": "y"}}
`

func TestCreateGetCancel(t *testing.T) {
	srv, client := start(t, testserver.Options{}, Options{})
	ctx := context.Background()
	job, err := client.CreateJobJSONL(ctx, []byte(twoLines),
		JobOptions{Metadata: map[string]string{"team": "go"}, Model: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if job.GetRequestCounts().GetTotal() != 2 || job.GetMetadata()["team"] != "go" {
		t.Errorf("job %v", job)
	}
	if got := srv.LastCreate().GetJsonl(); string(got) != twoLines {
		t.Errorf("the JSONL was not sent verbatim: %q", got)
	}
	got, err := client.GetJob(ctx, job.GetId())
	if err != nil || got.GetId() != job.GetId() || got.GetState() != pb.JobState_JOB_STATE_IN_PROGRESS {
		t.Fatalf("GetJob: %v %v", got, err)
	}
	cancelled, err := client.CancelJob(ctx, job.GetId())
	if err != nil || cancelled.GetState() != pb.JobState_JOB_STATE_CANCELLED {
		t.Fatalf("CancelJob: %v %v", cancelled, err)
	}
	_, err = client.GetJob(ctx, "job_nope")
	wantCode(t, err, codes.NotFound, "job job_nope not found")
	_, err = client.CancelJob(ctx, "job_nope")
	wantCode(t, err, codes.NotFound, "job_nope")
}

func TestCreateJobErrorsComeBackWithTheServersMessage(t *testing.T) {
	_, client := start(t, testserver.Options{}, Options{})
	ctx := context.Background()
	_, err := client.CreateJobJSONL(ctx, nil, JobOptions{})
	wantCode(t, err, codes.InvalidArgument, "requests: the job has no requests")
	_, err = client.CreateJobJSONL(ctx, []byte(twoLines+"{oops\n"), JobOptions{})
	wantCode(t, err, codes.InvalidArgument, "line 3: invalid JSON")
	_, err = client.CreateJob(ctx, []*pb.BatchRequest{ChatRequest("x", "hi", Sampling{}),
		ChatRequest("x", "again", Sampling{})}, JobOptions{})
	wantCode(t, err, codes.InvalidArgument, "line 2: custom_id: 'x' is used twice")
}

func TestCreateJobInline(t *testing.T) {
	srv, client := start(t, testserver.Options{}, Options{})
	seed := uint64(7)
	reqs := []*pb.BatchRequest{
		ChatRequest("chat", "Hello", Greedy(16)),
		CompletionRequest("text", "Once", Sampling{Seed: &seed, Stop: []string{"\n"}}),
		TokenIDsRequest("ids", []int32{1, 2, 3}, Sampling{IgnoreEOS: true}),
	}
	job, err := client.CreateJob(context.Background(), reqs, JobOptions{})
	if err != nil || job.GetRequestCounts().GetTotal() != 3 {
		t.Fatalf("CreateJob: %v %v", job, err)
	}
	sent := srv.LastCreate().GetRequests().GetRequests()
	if len(sent) != 3 {
		t.Fatalf("sent %d requests", len(sent))
	}
	chat := sent[0]
	if chat.GetChat().GetMessages()[0].GetContent() != "Hello" || chat.GetChat().GetMessages()[0].GetRole() != "user" ||
		chat.GetSampling().Temperature == nil || chat.GetSampling().GetTemperature() != 0 ||
		chat.GetSampling().GetMaxTokens() != 16 || chat.GetSampling().TopP != nil {
		t.Errorf("chat request %v", chat)
	}
	if sent[1].GetPrompt() != "Once" || sent[1].GetSampling().GetSeed() != 7 ||
		!reflect.DeepEqual(sent[1].GetSampling().GetStop(), []string{"\n"}) || sent[1].GetSampling().Temperature != nil {
		t.Errorf("completion request %v", sent[1])
	}
	if !reflect.DeepEqual(sent[2].GetPromptTokenIds().GetIds(), []int32{1, 2, 3}) || !sent[2].GetSampling().GetIgnoreEos() {
		t.Errorf("token ids request %v", sent[2])
	}
}

func TestListJobsPagesAndFilters(t *testing.T) {
	_, client := start(t, testserver.Options{}, Options{})
	ctx := context.Background()
	var ids []string
	for i := 0; i < 5; i++ {
		job, err := client.CreateJobJSONL(ctx, []byte(fmt.Sprintf(`{"custom_id": "r%d"}`, i)), JobOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append([]string{job.GetId()}, ids...) // newest first
	}
	if _, err := client.CancelJob(ctx, ids[1]); err != nil {
		t.Fatal(err)
	}
	page, err := client.ListJobs(ctx, ListOptions{PageSize: 2})
	if err != nil || len(page.GetJobs()) != 2 || page.GetNextPageToken() == "" {
		t.Fatalf("first page: %v %v", page, err)
	}
	all, err := client.ListAllJobs(ctx, ListOptions{PageSize: 2}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, j := range all {
		got = append(got, j.GetId())
	}
	if !reflect.DeepEqual(got, ids) {
		t.Errorf("all pages: %v, want %v", got, ids)
	}
	limited, err := client.ListAllJobs(ctx, ListOptions{PageSize: 2}, 3)
	if err != nil || len(limited) != 3 || limited[2].GetId() != ids[2] {
		t.Errorf("limit 3: %v %v", limited, err)
	}
	cancelled, err := client.ListAllJobs(ctx, ListOptions{State: pb.JobState_JOB_STATE_CANCELLED}, 0)
	if err != nil || len(cancelled) != 1 || cancelled[0].GetId() != ids[1] {
		t.Errorf("cancelled: %v %v", cancelled, err)
	}
	it := client.Jobs(ctx, ListOptions{PageSize: 1000000})
	if it.Next() {
		t.Error("a page size the daemon refuses gave a job")
	}
	wantCode(t, it.Err(), codes.InvalidArgument, "page_size")
}

func TestWatchAndResults(t *testing.T) {
	_, client := start(t, testserver.Options{AutoComplete: true}, Options{})
	ctx := context.Background()
	job, err := client.CreateJobJSONL(ctx, []byte(twoLines), JobOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var states []string
	err = client.WatchJob(ctx, job.GetId(), func(p *pb.JobProgress) error {
		states = append(states, StateName(p.GetState()))
		return nil
	})
	if err != nil || strings.Join(states, ",") != "in_progress,completed" {
		t.Fatalf("WatchJob: %v %v", states, err)
	}
	results, err := client.Results(ctx, job.GetId(), false)
	if err != nil || len(results) != 2 {
		t.Fatalf("Results: %v %v", results, err)
	}
	line, err := ParseResult(results[1])
	if err != nil || *line.CustomID != "b" || !reflect.DeepEqual(line.TokenIDs(), []int32{1, 2, 3}) {
		t.Errorf("second result %v %v", line, err)
	}
	// A callback error stops the stream and comes back as it is; ErrStop stops it quietly.
	calls := 0
	stop := errors.New("enough")
	err = client.GetResults(ctx, job.GetId(), true, func(*pb.Result) error { calls++; return stop })
	if err != stop || calls != 1 {
		t.Errorf("callback error: %v after %d calls", err, calls)
	}
	calls = 0
	err = client.WatchJob(ctx, job.GetId(), func(*pb.JobProgress) error { calls++; return ErrStop })
	if err != nil || calls != 1 {
		t.Errorf("ErrStop: %v after %d calls", err, calls)
	}
	err = client.WatchJob(ctx, "job_nope", func(*pb.JobProgress) error { return nil })
	wantCode(t, err, codes.NotFound, "job_nope")
	err = client.GetResults(ctx, "job_nope", true, func(*pb.Result) error { return nil })
	wantCode(t, err, codes.NotFound, "job_nope")
}

func TestResultsWaitFollowsTheJob(t *testing.T) {
	srv, client := start(t, testserver.Options{}, Options{})
	ctx := context.Background()
	job, err := client.CreateJobJSONL(ctx, []byte(twoLines), JobOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if results, err := client.Results(ctx, job.GetId(), false); err != nil || len(results) != 0 {
		t.Fatalf("no results while running: %v %v", results, err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = srv.Complete(job.GetId())
	}()
	results, err := client.Results(ctx, job.GetId(), true)
	if err != nil || len(results) != 2 {
		t.Fatalf("waited results: %v %v", results, err)
	}
}

func TestWaitJobReconnects(t *testing.T) {
	_, client := start(t, testserver.Options{AutoComplete: true, UnavailableWatches: 2}, Options{})
	ctx := context.Background()
	job, err := client.CreateJobJSONL(ctx, []byte(twoLines), JobOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var seen int
	final, last, err := client.WaitJob(ctx, job.GetId(), WaitOptions{OnProgress: func(*pb.JobProgress) { seen++ }})
	if err != nil {
		t.Fatal(err)
	}
	if final.GetState() != pb.JobState_JOB_STATE_COMPLETED || last.GetState() != pb.JobState_JOB_STATE_COMPLETED || seen != 2 {
		t.Errorf("final %v last %v after %d messages", final, last, seen)
	}
}

func TestWaitJobGivesUp(t *testing.T) {
	_, client := start(t, testserver.Options{AutoComplete: true, UnavailableWatches: 100}, Options{})
	ctx := context.Background()
	job, err := client.CreateJobJSONL(ctx, []byte(twoLines), JobOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = client.WaitJob(ctx, job.GetId(), WaitOptions{ReconnectTimeout: -1})
	wantCode(t, err, codes.Unavailable, "restarting")
	began := time.Now()
	_, _, err = client.WaitJob(ctx, job.GetId(), WaitOptions{ReconnectTimeout: 500 * time.Millisecond})
	wantCode(t, err, codes.Unavailable, "restarting")
	if d := time.Since(began); d < 400*time.Millisecond || d > 5*time.Second {
		t.Errorf("gave up after %v, want about 0.5 s", d)
	}
	ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, _, err = client.WaitJob(ctx, job.GetId(), WaitOptions{})
	if ErrorCode(err) != codes.DeadlineExceeded && ErrorCode(err) != codes.Unavailable {
		t.Errorf("a context deadline: %v", err)
	}
}

func TestWaitJobNotFound(t *testing.T) {
	_, client := start(t, testserver.Options{}, Options{})
	_, _, err := client.WaitJob(context.Background(), "job_nope", WaitOptions{})
	wantCode(t, err, codes.NotFound, "job_nope")
}

func TestBearerTokenOverPlaintext(t *testing.T) {
	ctx := context.Background()
	srv, client := start(t, testserver.Options{Token: "s3cret"}, Options{Token: "s3cret"})
	if _, err := client.ListJobs(ctx, ListOptions{}); err != nil {
		t.Fatalf("with the token: %v", err)
	}
	if err := client.WatchJob(ctx, "job_nope", func(*pb.JobProgress) error { return nil }); ErrorCode(err) != codes.NotFound {
		t.Fatalf("a stream with the token: %v", err)
	}
	for _, auth := range srv.Authorizations() {
		if auth != "Bearer s3cret" {
			t.Errorf("authorization %q", auth)
		}
	}
	noToken, err := Dial(srv.Addr(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer noToken.Close()
	_, err = noToken.ListJobs(ctx, ListOptions{})
	wantCode(t, err, codes.Unauthenticated, "missing bearer token")
	wrong, err := Dial(srv.Addr(), Options{Token: "guess"})
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	_, err = wrong.GetJob(ctx, "job_1")
	wantCode(t, err, codes.Unauthenticated, "invalid bearer token")
}

func TestTLSAndMutualTLS(t *testing.T) {
	ctx := context.Background()
	certs, err := testserver.NewCerts(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	serverTLS, err := certs.ServerTLS(false)
	if err != nil {
		t.Fatal(err)
	}
	srv, client := start(t, testserver.Options{TLS: serverTLS, Token: "tok"},
		Options{Token: "tok", TLS: &TLSOptions{CAFile: certs.CAFile}})
	if _, err := client.ListJobs(ctx, ListOptions{}); err != nil {
		t.Fatalf("TLS with the right CA: %v", err)
	}
	// The certificate names localhost and 127.0.0.1; another name fails, as does another CA or
	// plaintext.
	for name, opts := range map[string]Options{
		"server name":  {Token: "tok", Timeout: 2 * time.Second, TLS: &TLSOptions{CAFile: certs.CAFile, ServerName: "other.example"}},
		"another CA":   {Token: "tok", Timeout: 2 * time.Second, TLS: &TLSOptions{CAFile: certs.OtherCAFile}},
		"plaintext":    {Token: "tok", Timeout: 2 * time.Second},
		"system roots": {Token: "tok", Timeout: 2 * time.Second, TLS: &TLSOptions{}},
	} {
		c, err := Dial(srv.Addr(), opts)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.ListJobs(ctx, ListOptions{})
		c.Close()
		if ErrorCode(err) != codes.Unavailable {
			t.Errorf("%s: %v, want UNAVAILABLE", name, err)
		}
	}
	c, err := Dial("localhost:"+strings.Split(srv.Addr(), ":")[1],
		Options{Token: "tok", TLS: &TLSOptions{CAFile: certs.CAFile, ServerName: "localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ListJobs(ctx, ListOptions{})
	c.Close()
	if err != nil {
		t.Errorf("by name with ServerName: %v", err)
	}

	mutual, err := certs.ServerTLS(true)
	if err != nil {
		t.Fatal(err)
	}
	mtls, withCert := start(t, testserver.Options{TLS: mutual}, Options{TLS: &TLSOptions{
		CAFile: certs.CAFile, CertFile: certs.ClientCertFile, KeyFile: certs.ClientKeyFile}})
	if _, err := withCert.ListJobs(ctx, ListOptions{}); err != nil {
		t.Fatalf("mutual TLS with a client certificate: %v", err)
	}
	noCert, err := Dial(mtls.Addr(), Options{Timeout: 2 * time.Second, TLS: &TLSOptions{CAFile: certs.CAFile}})
	if err != nil {
		t.Fatal(err)
	}
	defer noCert.Close()
	if _, err := noCert.ListJobs(ctx, ListOptions{}); ErrorCode(err) != codes.Unavailable {
		t.Errorf("mutual TLS without a client certificate: %v, want UNAVAILABLE", err)
	}
}

func TestWaitReady(t *testing.T) {
	_, client := start(t, testserver.Options{}, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := client.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady: %v", err)
	}
	srv, err := testserver.Start(testserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr()
	srv.Stop() // nothing listens there now
	down, err := Dial(addr, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	wantCode(t, down.WaitReady(ctx), codes.Unavailable, "no server answered at "+addr)
	_, err = down.GetJob(context.Background(), "job_1")
	wantCode(t, err, codes.Unavailable, "")
}
