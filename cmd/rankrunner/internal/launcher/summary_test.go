package launcher

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestFailureSummaryRootCauseFirst: one line per failed rank, the local
// root cause first with its signal, the others with their offsets, codes
// and reported errors.
func TestFailureSummaryRootCauseFirst(t *testing.T) {
	o := Outcome{Kind: Failed, Rank: 1, ExitCode: 137, Reason: "rank 1 died", Failures: []RankFailure{
		{Rank: 1, Local: 1, PID: 11, Code: 137, Signal: syscall.SIGKILL, At: t0},
		{Rank: 0, Local: 0, PID: 10, Code: 12, Error: "lost rank 1", At: t0.Add(250 * time.Millisecond)},
		{Rank: 2, Local: 2, PID: 12, Code: 143, At: t0.Add(3 * time.Second), Stopped: true},
	}}
	got := failureSummary("j1", 0, o)
	want := `rankrunner: job j1 attempt 0 failed (exit code 137); failed ranks, root cause first:
  [root cause] rank 1 (local 1, pid 11): signal: killed (SIGKILL); error: none reported
  [failed +0.25s] rank 0 (local 0, pid 10): exit code 12; error: lost rank 1
  [stopped +3.00s] rank 2 (local 2, pid 12): exit code 143; error: none reported
`
	if got != want {
		t.Fatalf("summary:\n%s\nwant:\n%s", got, want)
	}
}

// TestFailureSummaryRemoteRootCause: a root cause on another runner is
// the first line, from the abort's reason and error.
func TestFailureSummaryRemoteRootCause(t *testing.T) {
	o := Outcome{Kind: Failed, Rank: 5, ExitCode: 7, Remote: true, Reason: "runner node1 aborted the attempt: rank 5 exited with code 7",
		Error: "oom", Failures: []RankFailure{{Rank: 0, Code: 143, Stopped: true}}}
	lines := strings.Split(strings.TrimSpace(failureSummary("j", 2, o)), "\n")
	if len(lines) != 3 || !strings.Contains(lines[1], "[root cause] runner node1 aborted the attempt: rank 5 exited with code 7; error: oom") ||
		!strings.Contains(lines[2], "[stopped] rank 0") {
		t.Fatalf("summary lines %q", lines)
	}
}
