package test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ranktree/ranktree"
	"github.com/ranktree/ranktree/actors"
)

// TestSupervisionCleanupOnlyRestart: in CleanupOnly mode a timeout (rank 1
// hangs at seq 3, RANKTREE_TIMEOUT=2s) leaves every process alive; all
// ranks then re-create the world group under epoch 1
// (Runtime.RestartGroup), whose next all-reduce gives the right sum, and a
// new group works too.
func TestSupervisionCleanupOnlyRestart(t *testing.T) {
	t.Parallel()
	url := spNATS(t)
	events := spSubscribe(t, url, "restart")
	ranks := spLaunch(t, url, "restart", 3, []string{"RANKTREE_FAULT=hang@rank=1,seq=3", "RANKTREE_TIMEOUT=2s",
		"RANKTREE_ASYNC_ERROR_HANDLING=CleanupOnly", "SUPERPROG_THEN=restart"}, "ops", "6")
	codes := spWait(t, ranks, 20*time.Second)
	for _, p := range ranks {
		if codes[p.rank] != 0 {
			t.Errorf("rank %d exited %d, want 0", p.rank, codes[p.rank])
		}
		if f := p.firstFailure(t); f.Seq != 3 {
			t.Errorf("rank %d: first failure at op %d, want 3", p.rank, f.Seq)
		}
		r := p.mustStep(t, "restart")
		if !r.OK || r.Epoch != 1 {
			t.Errorf("rank %d: restart ok=%v epoch %d (%s), want epoch 1", p.rank, r.OK, r.Epoch, r.Err)
		}
		t.Logf("rank %d: restart took %.0f ms", p.rank, r.MS)
		if op := p.mustStep(t, "restart_op"); !op.OK || op.Epoch != 1 {
			t.Errorf("rank %d: all-reduce on the restarted group (epoch %d): %s", p.rank, op.Epoch, op.Err)
		}
		if op := p.mustStep(t, "newgroup_op"); !op.OK {
			t.Errorf("rank %d: all-reduce on a new group after the restart: %s", p.rank, op.Err)
		}
		if c := p.mustStep(t, "close"); !c.OK {
			t.Errorf("rank %d: Close: %s", p.rank, c.Err)
		}
	}
	// Each rank announced the abort, the restart and the new communicator.
	seen := map[string]bool{}
	for _, ev := range events() {
		if ev.Group == "default_pg" {
			seen[fmt.Sprintf("%d/%s/%d", ev.Rank, ev.Kind, ev.Epoch)] = true
		}
	}
	for r := range ranks {
		for _, k := range []string{actors.KindCommAbort + "/0", actors.KindRestart + "/1", actors.KindCommInit + "/1"} {
			if !seen[fmt.Sprintf("%d/%s", r, k)] {
				t.Errorf("rank %d: no %s event for default_pg", r, k)
			}
		}
	}
}

// TestSupervisionCloseDuringHungOp: Runtime.Close while an all-reduce is
// hung (rank 1's engine holds seq 2; the collective timeout is 60 s, so the
// watchdog does not intervene) returns within CloseGrace + 2 s, and the hung
// Work fails instead of staying in flight.
func TestSupervisionCloseDuringHungOp(t *testing.T) {
	t.Parallel()
	url := spNATS(t)
	ranks := spLaunch(t, url, "closehung", 3, []string{"RANKTREE_FAULT=hang@rank=1,seq=2", "RANKTREE_TIMEOUT=60s"}, "closehung")
	codes := spWait(t, ranks, 20*time.Second)
	bound := ranktree.CloseGrace + 2*time.Second + spSlack
	for _, p := range ranks {
		if codes[p.rank] != 0 {
			t.Errorf("rank %d exited %d, want 0", p.rank, codes[p.rank])
		}
		c := p.mustStep(t, "close")
		d := time.Duration(c.MS * float64(time.Millisecond))
		t.Logf("rank %d: Close took %v (%s)", p.rank, d, c.Err)
		if d > bound {
			t.Errorf("rank %d: Close took %v, bound %v", p.rank, d, bound)
		}
		var op2 *spResult
		for _, r := range p.results(t) {
			if r.Step == "op" && r.Seq == 2 {
				op2 = &r
			}
		}
		if op2 == nil || op2.OK || op2.Err == "" || op2.Err == "still in flight 5 s after Close" {
			t.Errorf("rank %d: hung op after Close: %+v, want failed", p.rank, op2)
		}
	}
}

// TestSupervisionBlockingWait: with RANKTREE_BLOCKING_WAIT=1 (and
// NoHandling, so nothing is aborted or announced) Work.Wait of the hung
// seq-2 all-reduce returns a *comm.TimeoutError by its 2 s deadline on
// every rank.
func TestSupervisionBlockingWait(t *testing.T) {
	t.Parallel()
	url := spNATS(t)
	ranks := spLaunch(t, url, "blocking", 3, []string{"RANKTREE_FAULT=hang@rank=1,seq=2", "RANKTREE_TIMEOUT=2s",
		"RANKTREE_BLOCKING_WAIT=1", "RANKTREE_ASYNC_ERROR_HANDLING=NoHandling"}, "ops", "4")
	codes := spWait(t, ranks, 20*time.Second)
	for _, p := range ranks {
		if codes[p.rank] != 0 {
			t.Errorf("rank %d exited %d, want 0", p.rank, codes[p.rank])
		}
		f := p.firstFailure(t)
		d := time.Duration(f.MS * float64(time.Millisecond))
		t.Logf("rank %d: op %d failed after %v: %s", p.rank, f.Seq, d, f.Err)
		if f.Seq != 2 || !f.is("timeout_error") {
			t.Errorf("rank %d: op %d failed with %v, want op 2 with a *comm.TimeoutError", p.rank, f.Seq, f.Is)
		}
		if d < 2*time.Second-100*time.Millisecond || d > 2*time.Second+spSlack {
			t.Errorf("rank %d: Wait returned after %v, want at the 2 s deadline", p.rank, d)
		}
	}
}
