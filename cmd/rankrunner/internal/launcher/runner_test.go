package launcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ranktree/ranktree/store"
)

// lockedBuffer is a bytes.Buffer safe for concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// runNodes runs nnodes runners of one job in-process over a shared
// MemStore, each starting one /bin/sh rank running script, and returns
// their exit codes (a *FlagError from loop shows as code 2).
func runNodes(t *testing.T, st store.Store, nnodes, maxRestarts int, script string, out *lockedBuffer) []int {
	codes, _ := runNodesTimed(t, st, nnodes, maxRestarts, script, out)
	return codes
}

// runNodesTimed is runNodes that also returns when each runner returned.
func runNodesTimed(t *testing.T, st store.Store, nnodes, maxRestarts int, script string, out *lockedBuffer) ([]int, []time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	codes := make([]int, nnodes)
	ended := make([]time.Time, nnodes)
	var wg sync.WaitGroup
	for node := 0; node < nnodes; node++ {
		r, err := newRunner(Config{
			Program: "/bin/sh", Args: []string{"-c", script}, NNodes: nnodes, NodeRank: node, NProcPerNode: 1,
			JobID: "j", NATSURL: "nats://unused:1", MaxRestarts: maxRestarts, StopGrace: time.Second,
			FailureGrace: NoFailureGrace, NATSListen: listen(node),
			Stdout: out, Stderr: out, Env: os.Environ(),
		})
		if err != nil {
			t.Fatal(err)
		}
		r.st, r.path, r.url = st, "/bin/sh", "nats://unused:1"
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, err := r.loop(ctx, make(chan os.Signal))
			var fe *FlagError
			if err != nil && !errors.As(err, &fe) {
				t.Errorf("node %d: %v", node, err)
			}
			codes[node], ended[node] = code, time.Now()
		}()
	}
	wg.Wait()
	return codes, ended
}

// listen gives node 0 a --nats-listen so that it plays the server host
// (which lingers for the other runners after a failure).
func listen(node int) string {
	if node == 0 {
		return "127.0.0.1:0"
	}
	return ""
}

// TestRunnersRestartTogether: rank 1 (node 1) fails in attempt 0; node 0
// stops its rank on the abort key; both restart once (the shared counter
// moves exactly once) and succeed.
func TestRunnersRestartTogether(t *testing.T) {
	st := store.NewMemStore()
	var out lockedBuffer
	script := `if [ "$RANKTREE_RESTART_COUNT" = 0 ]; then
  if [ "$RANK" = 1 ]; then sleep 0.2; exit 3; fi
  exec sleep 30
fi
echo ok rank=$RANK attempt=$RANKTREE_RESTART_COUNT world=$WORLD_SIZE group=$GROUP_RANK`
	codes := runNodes(t, st, 2, 2, script, &out)
	if codes[0] != 0 || codes[1] != 0 {
		t.Fatalf("exit codes %v, want [0 0]\n%s", codes, out.String())
	}
	for _, want := range []string{"[rank 0] ok rank=0 attempt=1 world=2 group=0", "[rank 1] ok rank=1 attempt=1 world=2 group=1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	n, err := st.Add(context.Background(), keyRestarts, 0)
	if err != nil || n != 1 {
		t.Fatalf("restart counter %d, %v; want exactly 1", n, err)
	}
	v, err := st.Get(context.Background(), abortKey(0, "node1"))
	if err != nil || !strings.Contains(string(v), `"exit_code":3`) {
		t.Fatalf("abort key of node1: %s, %v", v, err)
	}
}

// TestRunnersBudgetSpent: without restarts both runners exit with the
// failing rank's code, node 1 learning it from the abort key. Node 0 hosts
// the server, so it does not return before node 1 has stopped its rank
// (which ignores SIGTERM and needs the 1 s grace period and SIGKILL).
func TestRunnersBudgetSpent(t *testing.T) {
	st := store.NewMemStore()
	var out lockedBuffer
	script := `if [ "$RANK" = 0 ]; then sleep 0.2; exit 6; fi; trap '' TERM; exec sleep 30`
	codes, ended := runNodesTimed(t, st, 2, 0, script, &out)
	if codes[0] != 6 || codes[1] != 6 {
		t.Fatalf("exit codes %v, want [6 6]\n%s", codes, out.String())
	}
	if ended[0].Before(ended[1].Add(-500 * time.Millisecond)) {
		t.Fatalf("server host returned %v before node 1 stopped its ranks", ended[1].Sub(ended[0]))
	}
}

// TestRunnerBudgetFirstWins: a runner with a different --max-restarts
// obeys the budget already stored for the job.
func TestRunnerBudgetFirstWins(t *testing.T) {
	st := store.NewMemStore()
	ctx := context.Background()
	if err := st.Set(ctx, keyMaxRestarts, []byte("4")); err != nil {
		t.Fatal(err)
	}
	r, err := newRunner(Config{Program: "/bin/true", JobID: "j", MaxRestarts: 1})
	if err != nil {
		t.Fatal(err)
	}
	r.st = st
	if b, err := r.budget(ctx); err != nil || b != 4 {
		t.Fatalf("budget %d, %v; want the stored 4", b, err)
	}
	next, err := r.claimRestart(ctx, 0)
	if err != nil || next != 1 {
		t.Fatalf("claim: %d, %v", next, err)
	}
	// A second runner claiming the same restart gets the same attempt.
	if next, err := r.claimRestart(ctx, 0); err != nil || next != 1 {
		t.Fatalf("second claim: %d, %v", next, err)
	}
}

// TestRunnerRefusesFinishedJob: reusing a finished job's id on the same
// store is refused instead of replaying its abort and done keys.
func TestRunnerRefusesFinishedJob(t *testing.T) {
	st := store.NewMemStore()
	var out lockedBuffer
	if codes := runNodes(t, st, 1, 0, `exit 0`, &out); codes[0] != 0 {
		t.Fatalf("first run: %v\n%s", codes, out.String())
	}
	codes := runNodes(t, st, 1, 0, `echo second run; exit 0`, &out)
	if codes[0] != 2 || strings.Contains(out.String(), "second run") {
		t.Fatalf("rerun of a finished job: exit %v, output:\n%s", codes, out.String())
	}
}

// TestRunnerFailureGraceAndSummary: rank 1 of 3 is killed (SIGKILL); rank
// 0 notices, reports an error and exits 12 during the failure grace
// period, unsignalled; rank 2 waits and is sent SIGTERM only when the
// period ends. The runner exits with the victim's 137, writes the dead
// keys ranktree.Init watches, and prints the summary with the victim first.
func TestRunnerFailureGraceAndSummary(t *testing.T) {
	const grace = time.Second
	st := store.NewMemStore()
	var out lockedBuffer
	dir := t.TempDir()
	script := `case $RANK in
1) echo $$ > ` + dir + `/pid1.tmp; mv ` + dir + `/pid1.tmp ` + dir + `/pid1; kill -9 $$ ;;
0) while [ ! -f ` + dir + `/pid1 ]; do sleep 0.01; done
   while kill -0 $(cat ` + dir + `/pid1) 2>/dev/null; do sleep 0.01; done
   sleep 0.1; echo "rank 0: error: lost rank 1" >&2; exit 12 ;;
2) trap 'exit 143' TERM; while :; do sleep 0.02; done ;;
esac`
	r, err := newRunner(Config{
		Program: "/bin/sh", Args: []string{"-c", script}, NProcPerNode: 3, JobID: "j", NATSURL: "nats://unused:1",
		FailureGrace: grace, StopGrace: time.Second, Stdout: &out, Stderr: &out, Env: os.Environ(),
	})
	if err != nil {
		t.Fatal(err)
	}
	r.st, r.path, r.url = st, "/bin/sh", "nats://unused:1"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, err := r.loop(ctx, make(chan os.Signal))
	if err != nil || code != 137 {
		t.Fatalf("exit %d, %v; want the victim's 137\n%s", code, err, out.String())
	}
	var summary []string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "  [") {
			summary = append(summary, l)
		}
	}
	if len(summary) != 3 ||
		!strings.HasPrefix(summary[0], "  [root cause] rank 1 (local 1, pid ") || !strings.HasSuffix(summary[0], "signal: killed (SIGKILL); error: none reported") ||
		!strings.HasPrefix(summary[1], "  [failed +") || !strings.HasSuffix(summary[1], "exit code 12; error: rank 0: error: lost rank 1") ||
		!strings.HasPrefix(summary[2], "  [stopped +") || !strings.Contains(summary[2], "rank 2 ") {
		t.Fatalf("summary lines %q\n%s", summary, out.String())
	}
	var stoppedAt float64
	if _, err := fmt.Sscanf(strings.TrimPrefix(summary[2], "  [stopped +"), "%fs]", &stoppedAt); err != nil || stoppedAt < grace.Seconds() {
		t.Fatalf("rank 2 stopped %.2fs after the kill (%v), want after the %v failure grace", stoppedAt, err, grace)
	}
	t.Logf("rank 2 stopped %.2fs after rank 1 was killed (failure grace %v)", stoppedAt, grace)
	bg := context.Background()
	if v, err := st.Get(bg, deadKey(0, 1)); err != nil || !strings.Contains(string(v), `"status":"signal: killed (SIGKILL)"`) {
		t.Fatalf("dead key of rank 1: %s, %v", v, err)
	}
	if v, err := st.Get(bg, deadKey(0, 0)); err != nil || !strings.Contains(string(v), `"exit_code":12`) || !strings.Contains(string(v), "lost rank 1") {
		t.Fatalf("dead key of rank 0: %s, %v", v, err)
	}
	if ok, err := st.Check(bg, []string{deadKey(0, 2)}); err != nil || ok {
		t.Fatalf("a rank stopped by the runner got a dead key (%v, %v)", ok, err)
	}
}
