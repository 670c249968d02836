package moebatch

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	pb "moebatch/client/go/moebatchv1"
)

func TestStateNames(t *testing.T) {
	var got []string
	for v := int32(1); v <= 8; v++ {
		got = append(got, StateName(pb.JobState(v)))
	}
	if strings.Join(got, ",") != strings.Join(StateNames, ",") {
		t.Errorf("StateName over the enum = %v, StateNames = %v", got, StateNames)
	}
	if StateName(pb.JobState_JOB_STATE_IN_PROGRESS) != "in_progress" {
		t.Error("in_progress")
	}
	if StateName(pb.JobState(42)) != "state_42" {
		t.Errorf("unknown state: %q", StateName(pb.JobState(42)))
	}
}

func TestParseState(t *testing.T) {
	ok := map[string]pb.JobState{
		"completed":            pb.JobState_JOB_STATE_COMPLETED,
		"IN_PROGRESS":          pb.JobState_JOB_STATE_IN_PROGRESS,
		"in-progress":          pb.JobState_JOB_STATE_IN_PROGRESS,
		" cancelled ":          pb.JobState_JOB_STATE_CANCELLED,
		"JOB_STATE_FAILED":     pb.JobState_JOB_STATE_FAILED,
		"job_state_cancelling": pb.JobState_JOB_STATE_CANCELLING,
	}
	for text, want := range ok {
		got, err := ParseState(text)
		if err != nil || got != want {
			t.Errorf("ParseState(%q) = %v, %v; want %v", text, got, err, want)
		}
	}
	for _, text := range []string{"", "unspecified", "JOB_STATE_UNSPECIFIED", "done", "2"} {
		_, err := ParseState(text)
		if err == nil {
			t.Errorf("ParseState(%q) accepted", text)
			continue
		}
		if !strings.Contains(err.Error(), "validating, in_progress, finalizing, completed, failed, cancelling, cancelled") {
			t.Errorf("ParseState(%q) error does not list the states: %v", text, err)
		}
	}
}

func TestIsTerminal(t *testing.T) {
	for v, name := range pb.JobState_name {
		want := name == "JOB_STATE_COMPLETED" || name == "JOB_STATE_FAILED" ||
			name == "JOB_STATE_CANCELLED" || name == "JOB_STATE_EXPIRED"
		if IsTerminal(pb.JobState(v)) != want {
			t.Errorf("IsTerminal(%s) = %v", name, !want)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	cases := map[float64]string{0: "0:00", -3: "0:00", 42.4: "0:42", 59.6: "1:00", 61: "1:01",
		3599: "59:59", 3600: "1:00:00", 3725: "1:02:05", 36000 * 3: "30:00:00"}
	for in, want := range cases {
		if got := FormatDuration(in); got != want {
			t.Errorf("FormatDuration(%g) = %q, want %q", in, got, want)
		}
	}
}

func TestDescribeProgress(t *testing.T) {
	p := &pb.JobProgress{State: pb.JobState_JOB_STATE_IN_PROGRESS,
		RequestCounts:   &pb.RequestCounts{Total: 805, Completed: 118, Failed: 2},
		GeneratedTokens: 70000, MaxTokensTotal: 206080, ElapsedSeconds: 61.6,
		TokensPerSecond: 1234.54, EtaSeconds: 42}
	want := "in_progress 120/805 done (2 failed), 70000/206080 tokens, 34%, 1234.5 tok/s, 1:02 elapsed, ETA 0:42"
	if got := DescribeProgress(p); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	// max_tokens_total unknown (a job from before the daemon's restart): tokens alone.
	p = &pb.JobProgress{State: pb.JobState_JOB_STATE_IN_PROGRESS,
		RequestCounts: &pb.RequestCounts{Total: 4, Completed: 1}, GeneratedTokens: 17}
	want = "in_progress 1/4 done (0 failed), 17 tokens, 25%, 0.0 tok/s, 0:00 elapsed, ETA ?"
	if got := DescribeProgress(p); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	p = &pb.JobProgress{State: pb.JobState_JOB_STATE_VALIDATING}
	want = "validating 0/0 done (0 failed), 0 tokens, 0%, 0.0 tok/s, 0:00 elapsed, ETA ?"
	if got := DescribeProgress(p); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestProgressFraction(t *testing.T) {
	progress := func(state pb.JobState, done, total, generated, maxTokens int64) *pb.JobProgress {
		return &pb.JobProgress{State: state,
			RequestCounts:   &pb.RequestCounts{Total: total, Completed: done},
			GeneratedTokens: generated, MaxTokensTotal: maxTokens}
	}
	running := pb.JobState_JOB_STATE_IN_PROGRESS
	cases := []struct {
		p    *pb.JobProgress
		want float64
	}{
		// Continuous batching: no request done yet, a quarter of the tokens generated.
		{progress(running, 0, 8, 512, 2048), 0.25},
		// Requests that stopped early (EOS): the request fraction leads.
		{progress(running, 6, 8, 100, 2048), 0.75},
		{progress(running, 2, 8, 0, 0), 0.25}, // no token total known
		{progress(running, 0, 0, 0, 0), 0},
		{progress(running, 0, 8, 5000, 2048), 1},                        // clamped
		{progress(pb.JobState_JOB_STATE_COMPLETED, 8, 8, 100, 2048), 1}, // done
		{progress(pb.JobState_JOB_STATE_CANCELLED, 2, 8, 100, 2048), 0.25},
	}
	for i, c := range cases {
		if got := ProgressFraction(c.p); got != c.want {
			t.Errorf("case %d: got %v, want %v", i, got, c.want)
		}
	}
}

func TestJobStart(t *testing.T) {
	now := time.Unix(140, 0)
	cases := []struct {
		job  *pb.Job
		want int64
	}{
		{&pb.Job{CreatedAt: 100, StartedAt: 109, FinishedAt: 110, ElapsedSeconds: 9.4}, 100},
		{&pb.Job{CreatedAt: 100, StartedAt: 130, ElapsedSeconds: 25.5}, 114}, // running
		{&pb.Job{CreatedAt: 100, FinishedAt: 101, ElapsedSeconds: 3}, 100},
		{&pb.Job{CreatedAt: 100, StartedAt: 105, FinishedAt: 105}, 105}, // no clock: the store's
		{&pb.Job{CreatedAt: 100}, 0},
	}
	for i, c := range cases {
		if got := JobStart(c.job, now); got != c.want {
			t.Errorf("case %d: got %d, want %d", i, got, c.want)
		}
	}
}

func TestDescribeJob(t *testing.T) {
	started := time.Date(2026, 11, 27, 14, 3, 9, 0, time.Local)
	job := &pb.Job{Id: "job_1", State: pb.JobState_JOB_STATE_COMPLETED,
		RequestCounts: &pb.RequestCounts{Total: 805, Completed: 803, Failed: 2},
		CreatedAt:     started.Unix() - 5, StartedAt: started.Unix(), FinishedAt: started.Unix() + 10,
		PromptTokens: 9630, GeneratedTokens: 15360, TokensPerSecond: 1626.93, ElapsedSeconds: 9.441}
	zone := started.Format("MST")
	want := "job_1 completed: 805/805 done (2 failed); started 2026-11-27 14:03:09 " + zone +
		", ran 9.44s, finished 2026-11-27 14:03:19 " + zone +
		"; 9630 prompt tokens, 15360 generated tokens, 1626.9 tok/s"
	if got := DescribeJob(job); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	queued := &pb.Job{Id: "job_2", State: pb.JobState_JOB_STATE_IN_PROGRESS,
		RequestCounts: &pb.RequestCounts{Total: 3}, CreatedAt: started.Unix()}
	want = "job_2 in_progress: 0/3 done (0 failed); not started (created 2026-11-27 14:03:09 " + zone +
		"); 0 prompt tokens, 0 generated tokens, 0.0 tok/s"
	if got := DescribeJob(queued); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	failed := &pb.Job{Id: "job_3", State: pb.JobState_JOB_STATE_FAILED, Error: "engine failed"}
	if got := DescribeJob(failed); !strings.HasSuffix(got, "; error: engine failed") {
		t.Errorf("got %q", got)
	}
}

func TestViewJobJSON(t *testing.T) {
	job := &pb.Job{Id: "job_1", State: pb.JobState_JOB_STATE_COMPLETED, Model: "tiny",
		Metadata:      map[string]string{"team": "a", "b": "<x>"},
		RequestCounts: &pb.RequestCounts{Total: 3, Completed: 2, Failed: 1},
		CreatedAt:     100, FinishedAt: 110, StartedAt: 101, Tenant: "local",
		PromptTokens: 30, GeneratedTokens: 12, TokensPerSecond: 4.8, ElapsedSeconds: 2.5}
	data, err := json.Marshal(ViewJob(job))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"job_1","state":"completed","model":"tiny","metadata":{"b":"\u003cx\u003e","team":"a"},` +
		`"request_counts":{"total":3,"completed":2,"failed":1},"created_at":100,"finished_at":110,"error":"",` +
		`"tenant":"local","started_at":101,"prompt_tokens":30,"generated_tokens":12,"tokens_per_second":4.8,` +
		`"elapsed_seconds":2.5}`
	if string(data) != want {
		t.Errorf("got  %s\nwant %s", data, want)
	}
	// No metadata prints as {}, not null; a job without counts as zeros.
	data, _ = json.Marshal(ViewJob(&pb.Job{Id: "j"}))
	if !strings.Contains(string(data), `"metadata":{}`) || !strings.Contains(string(data), `"total":0`) ||
		!strings.Contains(string(data), `"state":"unspecified"`) {
		t.Errorf("empty job: %s", data)
	}
}
