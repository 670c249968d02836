package main

import (
	"fmt"
	"io"
	"time"

	moebatch "moebatch/client/go"
	pb "moebatch/client/go/moebatchv1"
)

// progressDisplay shows a job's progress on stderr: on a terminal one line redrawn in place;
// otherwise a plain line at each state change and at most every interval (logs stay readable).
type progressDisplay struct {
	jobID     string
	w         io.Writer
	tty       bool
	interval  time.Duration
	now       func() time.Time
	lastLine  time.Time
	lastState pb.JobState
	printed   bool // a line was written
}

func newProgressDisplay(jobID string, w io.Writer, tty bool) *progressDisplay {
	return &progressDisplay{jobID: jobID, w: w, tty: tty, interval: 5 * time.Second, now: time.Now}
}

func (d *progressDisplay) update(p *pb.JobProgress) {
	text := fmt.Sprintf("%s: %s %s", prog, d.jobID, moebatch.DescribeProgress(p))
	if d.tty {
		fmt.Fprintf(d.w, "\r\x1b[K%s", text) // carriage return, erase the line
		d.printed = true
		return
	}
	now := d.now()
	if !d.printed || p.GetState() != d.lastState || now.Sub(d.lastLine) >= d.interval {
		fmt.Fprintln(d.w, text)
		d.printed, d.lastLine, d.lastState = true, now, p.GetState()
	}
}

// close ends the redrawn line so that what follows starts on a new one.
func (d *progressDisplay) close() {
	if d.tty && d.printed {
		fmt.Fprintln(d.w)
		d.printed = false
	}
}
