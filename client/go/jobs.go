package moebatch

import (
	"fmt"
	"math"
	"strings"
	"time"

	pb "moebatch/client/go/moebatchv1"
)

const statePrefix = "JOB_STATE_"

// StateNames are the OpenAI Batch API names of the job states, as the CLI prints and accepts
// them, in the proto's order.
var StateNames = []string{
	"validating", "in_progress", "finalizing", "completed", "failed", "cancelling", "cancelled",
	"expired",
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

// IsTerminal reports whether a job in this state never changes again (completed, failed,
// cancelled or expired).
func IsTerminal(state pb.JobState) bool {
	switch state {
	case pb.JobState_JOB_STATE_COMPLETED, pb.JobState_JOB_STATE_FAILED,
		pb.JobState_JOB_STATE_CANCELLED, pb.JobState_JOB_STATE_EXPIRED:
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
	StartedAt     int64             `json:"started_at"`
	// Tokens of the requests with a result; the rate and time of the daemon's job clock.
	PromptTokens    int64   `json:"prompt_tokens"`
	GeneratedTokens int64   `json:"generated_tokens"`
	TokensPerSecond float64 `json:"tokens_per_second"`
	ElapsedSeconds  float64 `json:"elapsed_seconds"`
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
		ID:              job.GetId(),
		State:           StateName(job.GetState()),
		Model:           job.GetModel(),
		Metadata:        metadata,
		RequestCounts:   countsOf(job.GetRequestCounts()),
		CreatedAt:       job.GetCreatedAt(),
		FinishedAt:      job.GetFinishedAt(),
		Error:           job.GetError(),
		Tenant:          job.GetTenant(),
		StartedAt:       job.GetStartedAt(),
		PromptTokens:    job.GetPromptTokens(),
		GeneratedTokens: job.GetGeneratedTokens(),
		TokensPerSecond: job.GetTokensPerSecond(),
		ElapsedSeconds:  job.GetElapsedSeconds(),
	}
}

// ProgressFraction is how much of the job is done, in [0, 1]: the larger of the fraction of
// requests done and the fraction of max_tokens_total generated (requests run side by side for
// most of a job, so the request fraction lags; requests that stop early make the token fraction
// lag). 1 once the job completed.
func ProgressFraction(p *pb.JobProgress) float64 {
	if p.GetState() == pb.JobState_JOB_STATE_COMPLETED {
		return 1
	}
	c := p.GetRequestCounts()
	fraction := 0.0
	if c.GetTotal() > 0 {
		fraction = float64(c.GetCompleted()+c.GetFailed()) / float64(c.GetTotal())
	}
	if p.GetMaxTokensTotal() > 0 {
		fraction = math.Max(fraction, float64(p.GetGeneratedTokens())/float64(p.GetMaxTokensTotal()))
	}
	return math.Min(1, math.Max(0, fraction))
}

// DescribeProgress is a one-line summary of a progress message: "in_progress 120/805 done
// (2 failed), 15360/206080 tokens, 34%, 1234.5 tok/s, 0:12 elapsed, ETA 0:42" (tokens generated,
// of max_tokens_total when the daemon knows it; the ProgressFraction; rate, elapsed time and ETA
// of the job clock).
func DescribeProgress(p *pb.JobProgress) string {
	c := p.GetRequestCounts()
	eta := "?"
	if p.GetEtaSeconds() > 0 {
		eta = FormatDuration(p.GetEtaSeconds())
	}
	tokens := fmt.Sprintf("%d tokens", p.GetGeneratedTokens())
	if p.GetMaxTokensTotal() > 0 {
		tokens = fmt.Sprintf("%d/%d tokens", p.GetGeneratedTokens(), p.GetMaxTokensTotal())
	}
	return fmt.Sprintf("%s %d/%d done (%d failed), %s, %.0f%%, %.1f tok/s, %s elapsed, ETA %s",
		StateName(p.GetState()), c.GetCompleted()+c.GetFailed(), c.GetTotal(), c.GetFailed(),
		tokens, 100*ProgressFraction(p), p.GetTokensPerSecond(),
		FormatDuration(p.GetElapsedSeconds()), eta)
}

// LocalTime writes Unix seconds as local time, "2026-11-27 14:03:09 CET"; "-" for 0.
func LocalTime(seconds int64) string {
	if seconds <= 0 {
		return "-"
	}
	return time.Unix(seconds, 0).Format("2006-01-02 15:04:05 MST")
}

// JobStart is when the job started running, Unix seconds (0: not yet): its end (finished_at, or
// now while it runs) less the daemon's elapsed_seconds, so from the job clock (the store's
// started_at is the time of the first result); started_at when the daemon has no clock for it.
func JobStart(job *pb.Job, now time.Time) int64 {
	if job.GetElapsedSeconds() > 0 {
		end := float64(job.GetFinishedAt())
		if job.GetFinishedAt() <= 0 {
			end = float64(now.UnixNano()) / 1e9
		}
		start := int64(end - job.GetElapsedSeconds())
		if start < job.GetCreatedAt() {
			start = job.GetCreatedAt()
		}
		return start
	}
	return job.GetStartedAt()
}

// DescribeJob is a job in one line for people, times local: "job_x in_progress: 120/805 done
// (2 failed); started 2026-11-27 14:03:09 CET, ran 42.10s; 9630 prompt tokens, 15360 generated
// tokens, 364.8 tok/s". Tokens are those of the requests with a result; the rate is the daemon's.
func DescribeJob(job *pb.Job) string {
	c := job.GetRequestCounts()
	text := fmt.Sprintf("%s %s: %d/%d done (%d failed)", job.GetId(), StateName(job.GetState()),
		c.GetCompleted()+c.GetFailed(), c.GetTotal(), c.GetFailed())
	if start := JobStart(job, time.Now()); start > 0 {
		text += fmt.Sprintf("; started %s, ran %.2fs", LocalTime(start), job.GetElapsedSeconds())
	} else {
		text += fmt.Sprintf("; not started (created %s)", LocalTime(job.GetCreatedAt()))
	}
	if job.GetFinishedAt() > 0 {
		text += ", finished " + LocalTime(job.GetFinishedAt())
	}
	text += fmt.Sprintf("; %d prompt tokens, %d generated tokens, %.1f tok/s",
		job.GetPromptTokens(), job.GetGeneratedTokens(), job.GetTokensPerSecond())
	if job.GetError() != "" {
		text += "; error: " + job.GetError()
	}
	return text
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
