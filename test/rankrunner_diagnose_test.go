package test

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRankrunnerDiagnose: ranks 0 and 1 of a 3-rank job write
// flight-recorder dumps to the store (rank 1 stopped one collective short);
// `rankrunner diagnose` fetches and merges them and names rank 1 (stuck)
// and rank 2 (no dump).
func TestRankrunnerDiagnose(t *testing.T) {
	t.Parallel()
	prog := rrBuildProg(t, "obsprog")
	dir := t.TempDir()
	port := rrFreePort(t)
	job := rrStartRunner(t, "--nproc-per-node", "3", "--job-id", "diagjob", "--nats-listen", fmt.Sprintf("127.0.0.1:%d", port), prog, "trace", dir)
	rrWaitFiles(t, 60*time.Second, filepath.Join(dir, "pid-0-0"), filepath.Join(dir, "pid-0-1"), filepath.Join(dir, "pid-0-2"))
	deadline := time.Now().Add(30 * time.Second)
	for !(strings.Contains(job.stdout.String(), "rank 0 wrote its dump") && strings.Contains(job.stdout.String(), "rank 1 wrote its dump")) {
		if time.Now().After(deadline) {
			t.Fatalf("dumps not written:\n%s", job.stdout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	d := rrRunRunner(t, 60*time.Second, "diagnose", "--job", "diagjob", "--nats", fmt.Sprintf("nats://127.0.0.1:%d", port))
	if d.code != 0 {
		t.Fatalf("diagnose exit code %d\nstdout:\n%s\nstderr:\n%s", d.code, d.stdout, d.stderr)
	}
	out := d.stdout.String()
	for _, want := range []string{"job diagjob, attempt 0", "restart/0/trace/1", "stuck at seq 5", "stuck ranks: [1 2]", "NO DUMP from ranks [2]"} {
		if !strings.Contains(out, want) {
			t.Errorf("diagnose output lacks %q:\n%s", want, out)
		}
	}
	job.cmd.Process.Signal(syscall.SIGTERM)
	job.wait(t, 30*time.Second)
}
