package moebatch

import (
	"fmt"
	"strings"

	pb "moebatch/client/go/moebatchv1"
)

const statePrefix = "JOB_STATE_"

// StateNames are the OpenAI Batch API names of the job states, as the CLI prints and accepts
// them, in the proto's order.
var StateNames = []string{
	"validating", "in_progress", "finalizing", "completed", "failed", "cancelling", "cancelled",
}

// StateName is the OpenAI name of a job state: JOB_STATE_IN_PROGRESS -> "in_progress"; a
// number the proto does not define gives "state_<n>".
func StateName(state pb.JobState) string {
	name, ok := pb.JobState_name[int32(state)]
	if !ok {
		return fmt.Sprintf("state_%d", int32(state))
	}
	return strings.ToLower(strings.TrimPrefix(name, statePrefix))
}

// ParseState reads a job state from its name, case-insensitively, with "-" for "_" and with or
// without the JOB_STATE_ prefix: "completed", "IN_PROGRESS", "in-progress", "JOB_STATE_CANCELLED".
// UNSPECIFIED is refused; the error names the valid names.
func ParseState(text string) (pb.JobState, error) {
	key := strings.ToUpper(strings.ReplaceAll(strings.TrimSpace(text), "-", "_"))
	if !strings.HasPrefix(key, statePrefix) {
		key = statePrefix + key
	}
	if value, ok := pb.JobState_value[key]; ok && pb.JobState(value) != pb.JobState_JOB_STATE_UNSPECIFIED {
		return pb.JobState(value), nil
	}
	return pb.JobState_JOB_STATE_UNSPECIFIED,
		fmt.Errorf("must be one of %s, got %q", strings.Join(StateNames, ", "), text)
}

// IsTerminal reports whether a job in this state never changes again (completed, failed or
// cancelled).
func IsTerminal(state pb.JobState) bool {
	switch state {
	case pb.JobState_JOB_STATE_COMPLETED, pb.JobState_JOB_STATE_FAILED,
		pb.JobState_JOB_STATE_CANCELLED:
		return true
	}
	return false
}

// Counts is the JSON view of RequestCounts.
type Counts struct {
	Total     int64 `json:"total"`
	Completed int64 `json:"completed"`
	Failed    int64 `json:"failed"`
}

// JobView is a JSON-ready view of a Job with its state by name: the object the CLI prints, with
// the same keys as the Python client's job_to_dict.
type JobView struct {
	ID            string            `json:"id"`
	State         string            `json:"state"`
	Model         string            `json:"model"`
	Metadata      map[string]string `json:"metadata"`
	RequestCounts Counts            `json:"request_counts"`
	CreatedAt     int64             `json:"created_at"`
	FinishedAt    int64             `json:"finished_at"`
	Error         string            `json:"error"`
	Tenant        string            `json:"tenant"`
}

func countsOf(c *pb.RequestCounts) Counts {
	return Counts{Total: c.GetTotal(), Completed: c.GetCompleted(), Failed: c.GetFailed()}
}

// ViewJob returns the JSON view of a job (metadata is never nil, so it prints as {}).
func ViewJob(job *pb.Job) JobView {
	metadata := make(map[string]string, len(job.GetMetadata()))
	for k, v := range job.GetMetadata() {
		metadata[k] = v
	}
	return JobView{
		ID:            job.GetId(),
		State:         StateName(job.GetState()),
		Model:         job.GetModel(),
		Metadata:      metadata,
		RequestCounts: countsOf(job.GetRequestCounts()),
		CreatedAt:     job.GetCreatedAt(),
		FinishedAt:    job.GetFinishedAt(),
		Error:         job.GetError(),
		Tenant:        job.GetTenant(),
	}
}

// DescribeProgress is a one-line summary of a progress message:
// "in_progress 120/805 done (2 failed), 1234.5 tok/s, ETA 0:42".
func DescribeProgress(p *pb.JobProgress) string {
	c := p.GetRequestCounts()
	eta := "?"
	if p.GetEtaSeconds() > 0 {
		eta = FormatDuration(p.GetEtaSeconds())
	}
	return fmt.Sprintf("%s %d/%d done (%d failed), %.1f tok/s, ETA %s", StateName(p.GetState()),
		c.GetCompleted()+c.GetFailed(), c.GetTotal(), c.GetFailed(), p.GetTokensPerSecond(), eta)
}

// FormatDuration writes seconds as "m:ss", or "h:mm:ss" from an hour on (negative values as 0).
func FormatDuration(seconds float64) string {
	s := int64(seconds + 0.5)
	if seconds < 0 {
		s = 0
	}
	h, m, sec := s/3600, s%3600/60, s%60
	if h > 0 {
		return fmt.Sprintf("%d:%02d:%02d", h, m, sec)
	}
	return fmt.Sprintf("%d:%02d", m, sec)
}
