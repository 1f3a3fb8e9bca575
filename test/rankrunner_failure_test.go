package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// rrSummary returns the lines of rankrunner's failure summary in stderr:
// the header "rankrunner: job ... failed ..." and the "  [...]" lines after it.
func rrSummary(t *testing.T, stderr string) []string {
	t.Helper()
	var out []string
	in := false
	for _, l := range strings.Split(stderr, "\n") {
		switch {
		case strings.HasPrefix(l, "rankrunner: job ") && strings.Contains(l, "root cause first"):
			in, out = true, []string{l}
		case in && strings.HasPrefix(l, "  ["):
			out = append(out, l)
		default:
			in = false
		}
	}
	if len(out) == 0 {
		t.Fatalf("no failure summary in stderr:\n%s", stderr)
	}
	return out
}

// rrOffset parses the "+1.23s" offset of a summary line.
func rrOffset(t *testing.T, line string) time.Duration {
	t.Helper()
	_, rest, ok := strings.Cut(line, " +")
	var s float64
	if _, err := fmt.Sscanf(rest, "%fs]", &s); !ok || err != nil {
		t.Fatalf("no offset in %q", line)
	}
	return time.Duration(s * float64(time.Second))
}

// TestRankrunnerFailureGraceSummary: rank 1 of 3 is SIGKILLed. The
// survivors notice 200 ms later and print their error; rank 0 exits 12 by
// itself and is never signalled, rank 2 stays and gets SIGTERM only when
// the 1.5 s failure grace ends. The summary lists rank 1 first with its
// signal, then rank 0 with the error it printed; the runner exits 137.
func TestRankrunnerFailureGraceSummary(t *testing.T) {
	t.Parallel()
	const grace = 1500 * time.Millisecond
	_, prog := rrBuild(t)
	dir := t.TempDir()
	p := rrStartRunner(t, "--nproc-per-node", "3", "--failure-grace", grace.String(), prog, "crash", dir, "1", "200ms", "stay=2")
	if code := p.wait(t, 60*time.Second); code != 137 {
		t.Fatalf("exit code %d, want 137 (rank 1's SIGKILL)", code)
	}
	killed := rrFailedAt(t, dir)
	for _, r := range []string{"0", "2"} {
		want := "[rank " + r + "] rankprog: rank " + r + ": error: lost rank 1"
		if !strings.Contains(p.stderr.String(), want) {
			t.Errorf("survivor's report %q missing from stderr", want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "term-0")); err == nil {
		t.Error("rank 0 exited during the failure grace period but was sent SIGTERM")
	}
	if _, err := os.Stat(filepath.Join(dir, "term-2")); err != nil {
		t.Fatalf("rank 2 never got SIGTERM: %v", err)
	}
	termAfter := rrReadTime(t, filepath.Join(dir, "term-2")).Sub(killed)
	if termAfter < grace || termAfter > grace+3*time.Second {
		t.Errorf("rank 2 got SIGTERM %v after the kill, want the %v failure grace (+ < 3s)", termAfter, grace)
	}
	sum := rrSummary(t, p.stderr.String())
	if len(sum) != 3 {
		t.Fatalf("summary %q: want the header and ranks 1 and 0 (rank 2 exited 0 on SIGTERM)", sum)
	}
	if !strings.Contains(sum[0], "attempt 0 failed (exit code 137)") ||
		!strings.HasPrefix(sum[1], "  [root cause] rank 1 (local 1, pid ") || !strings.HasSuffix(sum[1], "signal: killed (SIGKILL); error: none reported") ||
		!strings.HasPrefix(sum[2], "  [failed +") || !strings.Contains(sum[2], "rank 0 (local 0") ||
		!strings.HasSuffix(sum[2], "exit code 12; error: rankprog: rank 0: error: lost rank 1 (connection reset by peer)") {
		t.Fatalf("summary:\n%s", strings.Join(sum, "\n"))
	}
	t.Logf("rank 0 reported and exited %v after the kill; rank 2 got SIGTERM %v after it (failure grace %v)", rrOffset(t, sum[2]), termAfter, grace)
}

// TestRankrunnerInitRankDies: rank 1 of 3 is SIGKILLed before it calls
// ranktree.Init. The runner records it dead in the store, and ranks 0 and
// 2, waiting in Init's barrier (store timeout 5 min), fail within 5 s with
// an error naming rank 1, which the summary shows from their error files.
func TestRankrunnerInitRankDies(t *testing.T) {
	t.Parallel()
	prog := rrBuildProg(t, "initprog")
	p := rrStartRunner(t, "--nproc-per-node", "3", prog, "die-before-init", "1")
	if code := p.wait(t, 60*time.Second); code != 137 {
		t.Fatalf("exit code %d, want 137 (rank 1's SIGKILL)", code)
	}
	sum := rrSummary(t, p.stderr.String())
	if len(sum) != 4 || !strings.HasPrefix(sum[1], "  [root cause] rank 1 (local 1") || !strings.Contains(sum[1], "signal: killed (SIGKILL)") {
		t.Fatalf("summary:\n%s", strings.Join(sum, "\n"))
	}
	for _, l := range sum[2:] {
		// The error file holds Init's own error (stderr would add "initprog: ").
		if !strings.HasPrefix(l, "  [failed +") || !strings.Contains(l, "exit code 70; error: ranktree: rank ") ||
			!strings.Contains(l, ": init barrier: rank 1 (signal: killed (SIGKILL)) died") {
			t.Fatalf("survivor line %q does not name rank 1\n%s", l, strings.Join(sum, "\n"))
		}
		if d := rrOffset(t, l); d > 5*time.Second {
			t.Errorf("survivor failed %v after rank 1 died, want < 5s: %s", d, l)
		} else {
			t.Logf("survivor failed Init %v after rank 1 was killed", d)
		}
	}
}
