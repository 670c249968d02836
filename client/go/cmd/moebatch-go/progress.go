package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	moebatch "moebatch/client/go"
	pb "moebatch/client/go/moebatchv1"
)

// progressDisplay shows a job's progress on stderr: on a terminal one line with a bar, redrawn in
// place; otherwise a plain line at each state change and at most every interval (logs stay
// readable). The bar fills with moebatch.ProgressFraction: tokens as well as requests, so it
// moves while requests run.
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
		// carriage return, erase the line
		fmt.Fprintf(d.w, "\r\x1b[K%s: %s |%s| %s", prog, d.jobID,
			progressBar(moebatch.ProgressFraction(p), barWidth), moebatch.DescribeProgress(p))
		d.printed = true
		return
	}
	now := d.now()
	if !d.printed || p.GetState() != d.lastState || now.Sub(d.lastLine) >= d.interval {
		fmt.Fprintln(d.w, text)
		d.printed, d.lastLine, d.lastState = true, now, p.GetState()
	}
}

const barWidth = 20

// progressBar draws fraction (in [0, 1]) as `width` cells: "#" done, " " to do.
func progressBar(fraction float64, width int) string {
	done := int(fraction*float64(width) + 0.5)
	if done < 0 {
		done = 0
	}
	if done > width {
		done = width
	}
	return strings.Repeat("#", done) + strings.Repeat(" ", width-done)
}

// close ends the redrawn line so that what follows starts on a new one.
func (d *progressDisplay) close() {
	if d.tty && d.printed {
		fmt.Fprintln(d.w)
		d.printed = false
	}
}
