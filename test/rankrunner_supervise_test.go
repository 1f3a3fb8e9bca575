package test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// rrStopBound is the bound: after a rank fails, every rank is gone
// within 5 s once the stopping starts. The tests that measure it pass
// --failure-grace 0, which stops the ranks at once; the grace period adds to
// the bound (rankrunner_failure_test.go tests it).
const rrStopBound = 5 * time.Second

// rrFailedAt reads the time rankprog's failing rank exited.
func rrFailedAt(t *testing.T, dir string) time.Time {
	t.Helper()
	return rrReadTime(t, filepath.Join(dir, "failed-at"))
}

// rrReadTime reads a time file (unix ns) written by rankprog.
func rrReadTime(t *testing.T, path string) time.Time {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return time.Unix(0, ns)
}

// TestRankrunnerFailureStopsAll: rank 1 of 3 exits 7; the other ranks are
// stopped (SIGTERM), the runner exits 7 within 5 s and no rank survives.
func TestRankrunnerFailureStopsAll(t *testing.T) {
	t.Parallel()
	_, prog := rrBuild(t)
	dir := t.TempDir()
	p := rrStartRunner(t, "--nproc-per-node", "3", "--failure-grace", "0", prog, "fail", dir, "1", "7", "300ms")
	rrWaitFiles(t, 60*time.Second, filepath.Join(dir, "failed-at"))
	gone := rrRanksGone(t, dir, 30*time.Second)
	if d := gone.Sub(rrFailedAt(t, dir)); d > rrStopBound {
		t.Errorf("ranks gone %v after rank 1 failed, want < %v", d, rrStopBound)
	} else {
		t.Logf("all ranks gone %v after rank 1 failed", d)
	}
	if code := p.wait(t, 30*time.Second); code != 7 {
		t.Fatalf("exit code %d, want the failing rank's 7", code)
	}
	for _, r := range []string{"0", "2"} {
		if _, err := os.Stat(filepath.Join(dir, "term-"+r)); err != nil {
			t.Errorf("rank %s was not sent SIGTERM: %v", r, err)
		}
	}
	rrAssertNoOrphans(t, dir, time.Second)
	if !strings.Contains(p.stderr.String(), "rank 1 exited with code 7") {
		t.Errorf("runner log does not name the failing rank:\n%s", p.stderr)
	}
}

// TestRankrunnerFailureKillsStubbornRanks: the surviving ranks ignore
// SIGTERM; they are SIGKILLed after the grace period, still within 5 s.
func TestRankrunnerFailureKillsStubbornRanks(t *testing.T) {
	t.Parallel()
	_, prog := rrBuild(t)
	dir := t.TempDir()
	p := rrStartRunner(t, "--nproc-per-node", "2", "--failure-grace", "0", prog, "fail", dir, "0", "9", "300ms", "ignore-term")
	rrWaitFiles(t, 60*time.Second, filepath.Join(dir, "failed-at"))
	gone := rrRanksGone(t, dir, 30*time.Second)
	if d := gone.Sub(rrFailedAt(t, dir)); d > rrStopBound {
		t.Errorf("ranks gone %v after rank 0 failed, want < %v", d, rrStopBound)
	} else {
		t.Logf("stubborn rank killed %v after rank 0 failed", d)
	}
	if code := p.wait(t, 30*time.Second); code != 9 {
		t.Fatalf("exit code %d, want 9", code)
	}
	if _, err := os.Stat(filepath.Join(dir, "term-1")); err != nil {
		t.Errorf("rank 1 was not sent SIGTERM first: %v", err)
	}
	rrAssertNoOrphans(t, dir, time.Second)
}

// TestRankrunnerMaxRestarts: with --max-restarts 2 a job whose rank always
// fails runs exactly 3 attempts (RANKTREE_RESTART_COUNT 0, 1, 2), then
// exits with the rank's code.
func TestRankrunnerMaxRestarts(t *testing.T) {
	t.Parallel()
	_, prog := rrBuild(t)
	dir := t.TempDir()
	p := rrRunRunner(t, 90*time.Second, "--nproc-per-node", "2", "--max-restarts", "2", "--failure-grace", "0", prog, "fail", dir, "0", "3", "100ms")
	if p.code != 3 {
		t.Fatalf("exit code %d, want 3", p.code)
	}
	got, _ := filepath.Glob(filepath.Join(dir, "attempt-*"))
	if len(got) != 6 {
		t.Errorf("attempt files %v, want 3 attempts × 2 ranks", got)
	}
	for n := 0; n < 3; n++ {
		for r := 0; r < 2; r++ {
			if _, err := os.Stat(filepath.Join(dir, "attempt-"+strconv.Itoa(n)+"-rank-"+strconv.Itoa(r))); err != nil {
				t.Errorf("attempt %d rank %d did not run", n, r)
			}
		}
	}
	rrAssertNoOrphans(t, dir, time.Second)
}

// TestRankrunnerRestartRecovers: the job fails in attempt 0 only; the
// restart succeeds and the runner exits 0.
func TestRankrunnerRestartRecovers(t *testing.T) {
	t.Parallel()
	_, prog := rrBuild(t)
	dir := t.TempDir()
	p := rrRunRunner(t, 60*time.Second, "--nproc-per-node", "2", "--max-restarts", "3", prog, "fail", dir, "1", "4", "100ms", "until=1")
	if p.code != 0 {
		t.Fatalf("exit code %d, want 0 after one restart", p.code)
	}
	if _, err := os.Stat(filepath.Join(dir, "attempt-2-rank-0")); err == nil {
		t.Error("a third attempt ran after the second succeeded")
	}
	if !strings.Contains(p.stdout.String(), "[rank 1] rank 1 succeeds in attempt 1") {
		t.Errorf("attempt 1 did not run to success:\n%s", p.stdout)
	}
}

// TestRankrunnerSignalForwarded: SIGTERM and SIGINT to the runner reach
// every rank; the runner exits 128+signal and no rank is left.
func TestRankrunnerSignalForwarded(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			_, prog := rrBuild(t)
			dir := t.TempDir()
			p := rrStartRunner(t, "--nproc-per-node", "2", prog, "sleep", dir)
			rrWaitFiles(t, 60*time.Second, filepath.Join(dir, "pid-0-0"), filepath.Join(dir, "pid-0-1"))
			if err := p.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			if code := p.wait(t, 30*time.Second); code != 128+int(sig) {
				t.Errorf("exit code %d, want %d", code, 128+int(sig))
			}
			if sig == syscall.SIGTERM {
				for _, r := range []string{"0", "1"} {
					if _, err := os.Stat(filepath.Join(dir, "term-"+r)); err != nil {
						t.Errorf("SIGTERM was not forwarded to rank %s", r)
					}
				}
			}
			rrAssertNoOrphans(t, dir, time.Second)
		})
	}
}

// TestRankrunnerNoOrphansOnRunnerKill: SIGKILL of the runner (which it
// cannot handle) still takes every rank with it (Pdeathsig), even ranks
// that ignore SIGTERM.
func TestRankrunnerNoOrphansOnRunnerKill(t *testing.T) {
	t.Parallel()
	_, prog := rrBuild(t)
	dir := t.TempDir()
	p := rrStartRunner(t, "--nproc-per-node", "2", prog, "sleep", dir, "ignore-term")
	rrWaitFiles(t, 60*time.Second, filepath.Join(dir, "pid-0-0"), filepath.Join(dir, "pid-0-1"))
	// Let the runner's spawner thread go idle for a while first: Pdeathsig
	// must hold however long the ranks have run.
	time.Sleep(300 * time.Millisecond)
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.wait(t, 10*time.Second)
	rrAssertNoOrphans(t, dir, rrStopBound)
}
