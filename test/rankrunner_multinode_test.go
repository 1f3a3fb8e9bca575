package test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// rrStartTwoNodes starts a 2-node × 2-rank job over loopback: node 0 serves
// the embedded NATS server on a free port, node 1 connects to it.
func rrStartTwoNodes(t *testing.T, job string, progArgs ...string) (n0, n1 *rrProc) {
	t.Helper()
	_, prog := rrBuild(t)
	return rrStartTwoNodesWith(t, job, nil, [2][]string{}, prog, progArgs...)
}

// rrStartTwoNodesWith is rrStartTwoNodes with extra runner flags, extra
// environment entries per node and a chosen PROGRAM.
func rrStartTwoNodesWith(t *testing.T, job string, flags []string, env [2][]string, prog string, progArgs ...string) (n0, n1 *rrProc) {
	t.Helper()
	port := rrFreePort(t)
	args := func(node string, where ...string) []string {
		a := append([]string{"--nnodes", "2", "--nproc-per-node", "2", "--job-id", job, "--node-rank", node}, flags...)
		return append(append(append(a, where...), prog), progArgs...)
	}
	// Node 1 first: it must wait for node 0's server to come up.
	n1 = rrStartRunnerEnv(t, env[1], args("1", "--nats", fmt.Sprintf("nats://127.0.0.1:%d", port))...)
	time.Sleep(200 * time.Millisecond)
	n0 = rrStartRunnerEnv(t, env[0], args("0", "--nats-listen", fmt.Sprintf("127.0.0.1:%d", port))...)
	return n0, n1
}

// TestRankrunnerTwoNodes: two runners on this machine form one job of 2×2
// ranks with a consistent env contract, and both exit 0 once all ranks did.
func TestRankrunnerTwoNodes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n0, n1 := rrStartTwoNodes(t, "twonode", "env", dir)
	if c := n0.wait(t, 90*time.Second); c != 0 {
		t.Errorf("node 0 exit code %d", c)
	}
	if c := n1.wait(t, 90*time.Second); c != 0 {
		t.Errorf("node 1 exit code %d", c)
	}
	url := ""
	for r := 0; r < 4; r++ {
		b, err := os.ReadFile(filepath.Join(dir, "env-"+strconv.Itoa(r)+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var env map[string]string
		if err := json.Unmarshal(b, &env); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"RANK": strconv.Itoa(r), "WORLD_SIZE": "4", "LOCAL_RANK": strconv.Itoa(r % 2),
			"LOCAL_WORLD_SIZE": "2", "GROUP_RANK": strconv.Itoa(r / 2), "RANKTREE_JOB": "twonode"}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("rank %d: %s=%q, want %q", r, k, env[k], v)
			}
		}
		if url == "" {
			url = env["RANKTREE_NATS_URL"]
		}
		if env["RANKTREE_NATS_URL"] != url || url == "" {
			t.Errorf("rank %d: RANKTREE_NATS_URL=%q, rank 0 has %q", r, env["RANKTREE_NATS_URL"], url)
		}
	}
}

// TestRankrunnerTwoNodesFailure: rank 3 (node 1) exits 5; node 0 sees the
// abort in the store and stops its ranks; both runners exit 5.
func TestRankrunnerTwoNodesFailure(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, prog := rrBuild(t)
	n0, n1 := rrStartTwoNodesWith(t, "twofail", []string{"--failure-grace", "0"}, [2][]string{}, prog, "fail", dir, "3", "5", "200ms")
	rrWaitFiles(t, 90*time.Second, filepath.Join(dir, "failed-at"))
	gone := rrRanksGone(t, dir, 30*time.Second)
	if d := gone.Sub(rrFailedAt(t, dir)); d > rrStopBound {
		t.Errorf("ranks of both nodes gone %v after rank 3 failed, want < %v", d, rrStopBound)
	} else {
		t.Logf("ranks of both nodes gone %v after rank 3 failed", d)
	}
	if c := n1.wait(t, 30*time.Second); c != 5 {
		t.Errorf("node 1 exit code %d, want 5", c)
	}
	if c := n0.wait(t, 30*time.Second); c != 5 {
		t.Errorf("node 0 exit code %d, want 5 (from the remote abort)", c)
	}
	for _, r := range []string{"0", "1", "2"} {
		if _, err := os.Stat(filepath.Join(dir, "term-"+r)); err != nil {
			t.Errorf("rank %s was not stopped with SIGTERM", r)
		}
	}
	rrAssertNoOrphans(t, dir, time.Second)
}

// TestRankrunnerTwoNodesRunnerLost: node 1's runner stops (SIGSTOP: its
// heartbeats end, its ranks keep running, no connection breaks). Node 0
// notices the silent heartbeat after --runner-timeout, stops its ranks
// with SIGTERM and exits 1 naming node 1, without waiting for node 1 to
// confirm.
func TestRankrunnerTwoNodesRunnerLost(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, prog := rrBuild(t)
	n0, n1 := rrStartTwoNodesWith(t, "lostrunner", []string{"--runner-heartbeat", "200ms", "--runner-timeout", "2s"},
		[2][]string{}, prog, "sleep", dir)
	var pids []string
	for r := range 4 {
		pids = append(pids, filepath.Join(dir, fmt.Sprintf("pid-0-%d", r)))
	}
	rrWaitFiles(t, 90*time.Second, pids...)
	time.Sleep(500 * time.Millisecond) // a few heartbeats of node 1 seen
	if err := n1.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	t.Cleanup(func() { _ = n1.cmd.Process.Signal(syscall.SIGCONT) })
	if c := n0.wait(t, 30*time.Second); c != 1 {
		t.Errorf("node 0 exit code %d, want 1", c)
	}
	took := n0.exited.Sub(stopped)
	t.Logf("node 0 exited %v after node 1's runner stopped", took)
	// Silence counts from node 1's last heartbeat, up to 200ms before the stop.
	if took < 1800*time.Millisecond || took > 10*time.Second {
		t.Errorf("node 0 exited %v after node 1 stopped, want between the 2s timeout (less one heartbeat) and 10s", took)
	}
	if !strings.Contains(n0.stderr.String(), "runner node1 sent no heartbeat") {
		t.Errorf("node 0's log does not name the lost runner:\n%s", n0.stderr)
	}
	for _, r := range []string{"0", "1"} {
		if _, err := os.Stat(filepath.Join(dir, "term-"+r)); err != nil {
			t.Errorf("rank %s was not stopped with SIGTERM", r)
		}
	}
}

// TestRankrunnerTwoHostsMixedTransports: two runners on this machine that
// claim different hosts (RANKTREE_HOST_ID), so ranks talk shm within a
// "host" and TCP across, as in a real multi-node job. 300 all-reduces on
// the world group give the closed-form sum on every rank.
func TestRankrunnerTwoHostsMixedTransports(t *testing.T) {
	t.Parallel()
	prog := rrBuildProg(t, "superprog")
	n0, n1 := rrStartTwoNodesWith(t, "mixedhosts", nil, [2][]string{{"RANKTREE_HOST_ID=hostA"}, {"RANKTREE_HOST_ID=hostB"}},
		prog, "ops", "300")
	var out strings.Builder
	for n, p := range []*rrProc{n0, n1} {
		if c := p.wait(t, 90*time.Second); c != 0 {
			t.Errorf("node %d exit code %d", n, c)
		}
		out.WriteString(p.stdout.String())
	}
	for r := range 4 {
		want := fmt.Sprintf(`[rank %d] RESULT {"rank":%d,"step":"op","seq":300,"ok":true`, r, r)
		if !strings.Contains(out.String(), want) {
			t.Errorf("rank %d did not finish 300 all-reduces:\n%s", r, out.String())
		}
	}
}
