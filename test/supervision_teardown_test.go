package test

import (
	"context"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/store/natsstore"
	"github.com/ranktree/ranktree/supervisor"
)

// TestSupervisionTearDownDumpsAndDiagnose: in the default TearDown mode,
// rank 1 hanging at seq 5 makes every rank write its flight-recorder dump
// to RANKTREE_TRACE_DIR and exit non-zero; merging the dumps
// (supervisor.MergeDumps, what `rankrunner diagnose` prints) names rank 1
// as the stuck rank at seq 5.
func TestSupervisionTearDownDumpsAndDiagnose(t *testing.T) {
	t.Parallel()
	url := spNATS(t)
	dir := t.TempDir()
	ranks := spLaunch(t, url, "teardown", 3, []string{"RANKTREE_FAULT=hang@rank=1,seq=5", "RANKTREE_TIMEOUT=2s",
		"RANKTREE_TRACE_DIR=" + dir}, "ops", "8")
	codes := spWait(t, ranks, 20*time.Second)
	var dumps []supervisor.Dump
	for _, p := range ranks {
		if codes[p.rank] == 0 {
			t.Errorf("rank %d exited 0, want non-zero (TearDown)", p.rank)
		}
		if _, ok := p.step(t, "close"); ok {
			t.Errorf("rank %d reached Close: TearDown should have ended the process", p.rank)
		}
		b, err := os.ReadFile(supervisor.TraceFile(dir, p.rank))
		if err != nil {
			t.Errorf("rank %d: no dump in RANKTREE_TRACE_DIR: %v", p.rank, err)
			continue
		}
		d, err := supervisor.ParseDump(b)
		if err != nil {
			t.Fatalf("rank %d: %v", p.rank, err)
		}
		dumps = append(dumps, d)
	}
	t.Logf("exit codes %v", codes)
	rep := supervisor.MergeDumps(dumps)
	t.Logf("merged report:\n%s", rep)
	if !slices.Equal(rep.Stuck, []int{1}) {
		t.Errorf("merged report names stuck ranks %v, want [1]", rep.Stuck)
	}
	for _, g := range rep.Groups {
		if g.Group == "default_pg" && g.StuckSeq != 5 {
			t.Errorf("merged report: stuck seq %d, want 5", g.StuckSeq)
		}
	}
	// The same dumps are in the job's store (attempt 0's "restart/0/"
	// scope), where `rankrunner diagnose` reads them.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ns, err := natsstore.Connect(ctx, natsstore.Options{URL: url, Job: "teardown", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	stored, err := supervisor.ReadDumps(ctx, store.WithPrefix(ns, "restart/0/"), 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != 3 {
		t.Errorf("%d dumps in the store, want 3", len(stored))
	}
	if st := supervisor.MergeDumps(stored).Stuck; !slices.Equal(st, []int{1}) {
		t.Errorf("merged store dumps name stuck ranks %v, want [1]", st)
	}
}

// TestSupervisionKilledRank: SIGKILL of rank 1 in the middle of a stream of
// all-reduces makes ranks 0 and 2 fail with ErrRemoteAbort or a transport
// error within 3 s (the collective timeout stays at its 10 min default, so
// detection cannot come from it); CleanupOnly keeps them alive to close.
func TestSupervisionKilledRank(t *testing.T) {
	t.Parallel()
	url := spNATS(t)
	ranks := spLaunch(t, url, "kill", 3, []string{"SUPERPROG_READY=3", "RANKTREE_ASYNC_ERROR_HANDLING=CleanupOnly"}, "ops", "100000")
	deadline := time.Now().Add(20 * time.Second)
	for _, p := range ranks {
		for {
			if _, ok := p.step(t, "ready"); ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("rank %d not ready after 20 s", p.rank)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	killed := time.Now()
	if err := ranks[1].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	spWait(t, []*spRank{ranks[0], ranks[2]}, 20*time.Second)
	for _, p := range []*spRank{ranks[0], ranks[2]} {
		f := p.firstFailure(t)
		after := time.Unix(0, f.At).Sub(killed)
		t.Logf("rank %d: op %d failed %v after the kill: %v: %s", p.rank, f.Seq, after, f.Is, f.Err)
		if after > 3*time.Second+spSlack {
			t.Errorf("rank %d: failed %v after the kill, want within 3 s", p.rank, after)
		}
		if !f.is("remote_abort") && !f.is("transport") {
			t.Errorf("rank %d: error %v is neither ErrRemoteAbort nor a transport error", p.rank, f.Is)
		}
		if p.code != 0 {
			t.Errorf("rank %d exited %d, want 0 (CleanupOnly)", p.rank, p.code)
		}
	}
}
