package test

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestRankrunnerRuntimeInitTwoNodes: 2 nodes × 2 ranks of a program using
// ranktree.Init, over loopback with a token-protected embedded server. Rank
// 2 fails in attempt 0; every rank of attempt 1 passes Init's barrier under
// the new restart prefix and both runners exit 0.
func TestRankrunnerRuntimeInitTwoNodes(t *testing.T) {
	t.Parallel()
	prog := rrBuildProg(t, "initprog")
	port := rrFreePort(t)
	common := []string{"--nnodes", "2", "--nproc-per-node", "2", "--job-id", "initjob", "--max-restarts", "1",
		"--nats-token", "tok3n", "--nats-listen", fmt.Sprintf("127.0.0.1:%d", port), "--nats", fmt.Sprintf("nats://127.0.0.1:%d", port)}
	var nodes []*rrProc
	for n := 0; n < 2; n++ {
		args := append(append([]string{}, common...), "--node-rank", fmt.Sprint(n), prog, "2")
		nodes = append(nodes, rrStartRunner(t, args...))
	}
	var out strings.Builder
	for n, p := range nodes {
		if c := p.wait(t, 90*time.Second); c != 0 {
			t.Errorf("node %d exit code %d", n, c)
		}
		out.WriteString(p.stdout.String())
	}
	for r := 0; r < 4; r++ {
		for attempt := 0; attempt < 2; attempt++ {
			want := fmt.Sprintf("[rank %d] init ok rank=%d world=4 local=%d group=%d restart=%d", r, r, r%2, r/2, attempt)
			if !strings.Contains(out.String(), want) {
				t.Errorf("missing %q in:\n%s", want, out.String())
			}
		}
	}
}
