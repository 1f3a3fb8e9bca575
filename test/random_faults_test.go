package test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// TestRandomFaultsUnderRankrunner (issue 14, "Tests"): jobs of 3 and 4
// ranks under rankrunner run all-reduces; a random rank sends itself
// SIGKILL or SIGSTOP at a random seq. Every survivor's failed op must name
// that rank as where the failure started (comm.Blame of its error: a
// *TransportError's peer, a *TimeoutError's rank that never arrived, a
// *RemoteAbortError's origin) and a seq, and fail at the seq the victim
// died at. The seed is logged, and each subtest's name gives the victim,
// its seq and the signal.
func TestRandomFaultsUnderRankrunner(t *testing.T) {
	t.Parallel()
	prog := rrBuildProg(t, "superprog")
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 14))
	t.Logf("seed %d", seed)
	type trial struct {
		n, victim, seq int
		sig            string
	}
	var trials []trial
	for _, sig := range []string{"kill", "stop"} {
		for _, n := range []int{3, 4} {
			trials = append(trials, trial{n: n, victim: rng.IntN(n), seq: 2 + rng.IntN(30), sig: sig})
		}
	}
	for _, tr := range trials {
		t.Run(fmt.Sprintf("%s-n=%d-rank%d-seq%d", tr.sig, tr.n, tr.victim, tr.seq), func(t *testing.T) {
			env := []string{
				fmt.Sprintf("SUPERPROG_SELF=%d:%d:%s", tr.victim, tr.seq, tr.sig),
				"SUPERPROG_FAILEXIT=1",
				"RANKTREE_TIMEOUT=3s", // the stopped rank is found by the watchdog
				"RANKTREE_ASYNC_ERROR_HANDLING=CleanupOnly",
			}
			p := rrStartRunnerEnv(t, env, "--nproc-per-node", fmt.Sprint(tr.n), "--max-restarts", "0",
				"--failure-grace", "2s", "--stop-grace", "1s", prog, "ops", "100")
			code := p.wait(t, 90*time.Second)
			if code == 0 {
				t.Fatalf("rankrunner exited 0 although rank %d was sent SIG%s", tr.victim, strings.ToUpper(tr.sig))
			}
			failed := map[int]spResult{}
			for _, line := range strings.Split(p.stdout.String(), "\n") {
				_, js, ok := strings.Cut(line, "RESULT ")
				if !ok {
					continue
				}
				var r struct {
					spResult
					Blame    *int   `json:"blame"`
					BlameSeq uint64 `json:"blame_seq"`
				}
				if err := json.Unmarshal([]byte(js), &r); err != nil {
					t.Fatalf("bad RESULT line %q: %v", line, err)
				}
				if r.Step == "op" && !r.OK {
					if r.Blame == nil {
						t.Errorf("rank %d: failed op %d without blame: %s", r.Rank, r.Seq, r.Err)
						continue
					}
					failed[r.Rank] = r.spResult
					if *r.Blame != tr.victim || r.BlameSeq == 0 {
						t.Errorf("rank %d: op %d failed blaming rank %d at seq %d, want rank %d: %s",
							r.Rank, r.Seq, *r.Blame, r.BlameSeq, tr.victim, r.Err)
					}
					if r.Seq != uint64(tr.seq) {
						t.Errorf("rank %d: failed at op %d, the victim stopped at op %d: %s", r.Rank, r.Seq, tr.seq, r.Err)
					}
					t.Logf("rank %d: op %d failed after %.1f ms: %s", r.Rank, r.Seq, r.MS, r.Err)
				}
			}
			for r := range tr.n {
				if _, ok := failed[r]; !ok && r != tr.victim {
					t.Errorf("survivor rank %d reported no failed op", r)
				}
			}
		})
	}
}
