package test

import (
	"context"
	"testing"
	"time"

	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/store/natsstore"
	"github.com/ranktree/ranktree/supervisor"
)

// TestSupervisionActorPanicRestart: rank 1's communicator actor panics at
// seq 2 under RANKTREE_ACTOR_PANIC=restart, across 3 processes. Every
// rank's op at seq 2 fails (rank 1's with ErrEngine), every rank finds the
// world group restarted at epoch 1 by itself, all-reduces on it give the
// right sums, and every process closes and exits 0.
func TestSupervisionActorPanicRestart(t *testing.T) {
	t.Parallel()
	url := spNATS(t)
	ranks := spLaunch(t, url, "panicrestart", 3, []string{"SUPERPROG_PANIC=1:2", "RANKTREE_ACTOR_PANIC=restart"}, "panic")
	codes := spWait(t, ranks, 60*time.Second)
	for _, p := range ranks {
		if codes[p.rank] != 0 {
			t.Errorf("rank %d exited %d, want 0", p.rank, codes[p.rank])
		}
		var seq2 *spResult
		for _, r := range p.results(t) {
			if r.Step == "op" && r.Seq == 2 {
				seq2 = &r
			}
		}
		switch {
		case seq2 == nil:
			t.Errorf("rank %d: no result for seq 2", p.rank)
		case seq2.OK:
			t.Errorf("rank %d: seq 2 succeeded despite rank 1's panic", p.rank)
		case p.rank == 1 && !seq2.is("engine"):
			t.Errorf("rank 1: seq 2 failed with %q (%v), want ErrEngine", seq2.Err, seq2.Is)
		}
		if r := p.mustStep(t, "restarted"); !r.OK || r.Epoch != 1 {
			t.Errorf("rank %d: restarted %+v, want epoch 1", p.rank, r)
		}
		n := 0
		for _, r := range p.results(t) {
			if r.Step == "restart_op" {
				n++
				if !r.OK || r.Epoch != 1 {
					t.Errorf("rank %d: all-reduce %d on the restarted group: %+v", p.rank, r.Seq, r)
				}
			}
		}
		if n != 3 {
			t.Errorf("rank %d: %d all-reduces on the restarted group, want 3", p.rank, n)
		}
		if r := p.mustStep(t, "close"); !r.OK {
			t.Errorf("rank %d: close: %s", p.rank, r.Err)
		}
	}
}

// TestSupervisionActorPanicEscalates: under the default policy the same
// panic makes rank 1 exit with ExitEscalate once its flight-recorder dump
// is in the store; its peers tear down (TearDown mode) with ExitTearDown.
func TestSupervisionActorPanicEscalates(t *testing.T) {
	t.Parallel()
	url := spNATS(t)
	ranks := spLaunch(t, url, "panicescalate", 3, []string{"SUPERPROG_PANIC=1:2"}, "panic")
	codes := spWait(t, ranks, 60*time.Second)
	t.Logf("exit codes %v", codes)
	for _, p := range ranks {
		want := supervisor.ExitTearDown
		if p.rank == 1 {
			want = supervisor.ExitEscalate
		}
		if codes[p.rank] != want {
			t.Errorf("rank %d exited %d, want %d", p.rank, codes[p.rank], want)
		}
		if _, ok := p.step(t, "restarted"); ok {
			t.Errorf("rank %d restarted its group under the escalate policy", p.rank)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ns, err := natsstore.Connect(ctx, natsstore.Options{URL: url, Job: "panicescalate", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if ok, err := store.WithPrefix(ns, "restart/0/").Check(ctx, []string{supervisor.TraceKey(1)}); err != nil || !ok {
		t.Errorf("rank 1's dump is not in the store (%v, %v)", ok, err)
	}
}
