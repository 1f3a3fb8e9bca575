package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/internal/testrank"
)

// TestFaultDemos runs the demo under rankrunner with each fault: the job
// must end successfully in its second attempt, and the first attempt's
// reports must show the typed error the fault should cause.
func TestFaultDemos(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs rankrunner with 2 processes")
	}
	dir := t.TempDir()
	runner := filepath.Join(dir, "rankrunner")
	prog := filepath.Join(dir, "faults")
	for _, b := range [][2]string{{runner, "github.com/ranktree/ranktree/cmd/rankrunner"}, {prog, "github.com/ranktree/ranktree/examples/faults"}} {
		if out, err := exec.Command("go", "build", "-o", b[0], b[1]).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b[1], err, out)
		}
	}
	for _, fault := range []string{"hang", "crash", "mismatch"} {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			out := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, runner, "--nproc-per-node", "2", "--max-restarts", "1", prog,
				"--fault", fault, "--timeout", "1s", "--json-out", filepath.Join(out, "r{rank}-a{attempt}.json"))
			cmd.Env = testrank.LauncherEnv()
			log, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("rankrunner: %v\n%s", err, log)
			}
			read := func(rank, attempt int) (Report, bool) {
				b, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("r%d-a%d.json", rank, attempt)))
				if err != nil {
					return Report{}, false
				}
				var r Report
				if err := json.Unmarshal(b, &r); err != nil {
					t.Fatalf("rank %d attempt %d: %v", rank, attempt, err)
				}
				return r, true
			}
			for rank := range 2 {
				r, ok := read(rank, 1)
				if !ok || r.OpsOK != 20 || r.Err != "" || r.Fault != "" {
					t.Errorf("rank %d, attempt 1: %+v (found %v), want 20 clean all-reduces", rank, r, ok)
				}
			}
			switch fault {
			case "hang":
				named := false
				for rank := range 2 {
					r, ok := read(rank, 0)
					// The first watchdog to fire gives a timeout; its peer
					// sees the remote abort, or the aborted rank's closed
					// connection first.
					if !ok || r.FailedSeq != 5 || r.OpsOK != 4 ||
						!(slices.Contains(r.Is, "timeout") || slices.Contains(r.Is, "remote_abort") || slices.Contains(r.Is, "transport")) {
						t.Errorf("rank %d, attempt 0: %+v, want seq 5 failing with a timeout, a remote abort or a transport error", rank, r)
					}
					if r.ElapsedMS < 900 || r.ElapsedMS > 5000 {
						t.Errorf("rank %d: the hang was reported after %.0f ms, want about the 1 s timeout", rank, r.ElapsedMS)
					}
					named = named || strings.Contains(r.Err, "ranks [1] have not reached seq 5")
				}
				if !named {
					t.Errorf("no error names rank 1 as the one that did not reach seq 5")
				}
			case "crash":
				if !strings.Contains(string(log), "rank 1 exited with code 3") {
					t.Errorf("rankrunner did not report rank 1's exit code 3:\n%s", log)
				}
			case "mismatch":
				for rank := range 2 {
					r, ok := read(rank, 0)
					if !ok || r.FailedSeq != 5 || !slices.Contains(r.Is, "mismatch") || r.ElapsedMS > 1000 ||
						!strings.Contains(r.Err, "Broadcast(float64×1, root 0)") || !strings.Contains(r.Err, "AllReduce(float64×1, sum)") {
						t.Errorf("rank %d, attempt 0: %+v, want ErrMismatch at seq 5 within 1 s describing both ops", rank, r)
					}
				}
			}
			if t.Failed() {
				t.Logf("rankrunner output:\n%s", log)
			}
		})
	}
}
