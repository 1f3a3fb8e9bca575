package test

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRankrunnerEvents: while a job's ranks publish work events,
// `rankrunner events --lines` prints a line per event and ends with a
// table that marks the lagging rank 1 as a straggler and the silent rank 2
// (of --world-size 3) as missing; every event published meanwhile validates
// against docs/events.schema.json.
func TestRankrunnerEvents(t *testing.T) {
	t.Parallel()
	prog := rrBuildProg(t, "obsprog")
	dir := t.TempDir()
	port := rrFreePort(t)
	job := rrStartRunner(t, "--nproc-per-node", "2", "--job-id", "evjob", "--nats-listen", fmt.Sprintf("127.0.0.1:%d", port), prog, "events", dir)
	rrWaitFiles(t, 60*time.Second, filepath.Join(dir, "pid-0-0"), filepath.Join(dir, "pid-0-1"))
	// Every event seen meanwhile also validates against the schema.
	collect := spSubscribe(t, fmt.Sprintf("nats://127.0.0.1:%d", port), "evjob")
	ev := rrRunRunner(t, 60*time.Second, "events", "--job", "evjob", "--nats", fmt.Sprintf("nats://127.0.0.1:%d", port),
		"--duration", "2s", "--lines", "--world-size", "3")
	if ev.code != 0 {
		t.Fatalf("events exit code %d; stderr:\n%s", ev.code, ev.stderr)
	}
	out := ev.stdout.String()
	for _, want := range []string{"rank=0 kind=work group=world", "rank=1 kind=work group=world", "op=ALLREDUCE state=completed"} {
		if !strings.Contains(out, want) {
			t.Errorf("events output lacks %q:\n%s", want, out)
		}
	}
	var r1, r2 string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) > 1 && f[0] == "1" && f[1] == "world" {
			r1 = l
		}
		if len(f) > 0 && f[0] == "2" {
			r2 = l
		}
	}
	if !strings.Contains(r1, "STRAGGLER") {
		t.Errorf("rank 1 row %q not marked as a straggler:\n%s", r1, out)
	}
	if !strings.Contains(r2, "MISSING") {
		t.Errorf("rank 2 row %q not marked missing:\n%s", r2, out)
	}
	if evs := collect(); len(evs) == 0 {
		t.Error("no event received directly from NATS")
	}
	job.cmd.Process.Signal(syscall.SIGTERM)
	if c := job.wait(t, 30*time.Second); c != 128+int(syscall.SIGTERM) {
		t.Errorf("job exit code %d after SIGTERM", c)
	}
}
