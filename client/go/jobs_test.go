package moebatch

import (
	"encoding/json"
	"strings"
	"testing"

	pb "moebatch/client/go/moebatchv1"
)

func TestStateNames(t *testing.T) {
	var got []string
	for v := int32(1); v <= 7; v++ {
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
		want := name == "JOB_STATE_COMPLETED" || name == "JOB_STATE_FAILED" || name == "JOB_STATE_CANCELLED"
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
		TokensPerSecond: 1234.54, EtaSeconds: 42}
	if got, want := DescribeProgress(p), "in_progress 120/805 done (2 failed), 1234.5 tok/s, ETA 0:42"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	p = &pb.JobProgress{State: pb.JobState_JOB_STATE_VALIDATING}
	if got, want := DescribeProgress(p), "validating 0/0 done (0 failed), 0.0 tok/s, ETA ?"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestViewJobJSON(t *testing.T) {
	job := &pb.Job{Id: "job_1", State: pb.JobState_JOB_STATE_COMPLETED, Model: "tiny",
		Metadata:      map[string]string{"team": "a", "b": "<x>"},
		RequestCounts: &pb.RequestCounts{Total: 3, Completed: 2, Failed: 1},
		CreatedAt:     100, FinishedAt: 110, StartedAt: 101, Tenant: "local"}
	data, err := json.Marshal(ViewJob(job))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"job_1","state":"completed","model":"tiny","metadata":{"b":"\u003cx\u003e","team":"a"},` +
		`"request_counts":{"total":3,"completed":2,"failed":1},"created_at":100,"finished_at":110,"error":"",` +
		`"tenant":"local"}`
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
