package e2e

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store/natsstore"
	"github.com/ranktree/ranktree/supervisor"
)

// TestWatchdogAbortOverNATS propagates an abort between two ranks'
// watchdogs through the JetStream KV store of an embedded NATS server (a
// push: the KV watch), and measures how long the peer took to fail.
func TestWatchdogAbortOverNATS(t *testing.T) {
	url, shutdown, err := natsstore.StartEmbedded(natsstore.EmbeddedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown()
	ctx := context.Background()
	var wds [2]*supervisor.Watchdog
	var engs [2]*fakeEngine
	for rank := range wds {
		st, err := natsstore.Connect(ctx, natsstore.Options{URL: url, Job: "wdnats", Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		wds[rank] = startWatchdog(t, rank, supervisor.CleanupOnly, st)
		engs[rank] = &fakeEngine{}
		spec := supervisor.GroupSpec{Name: "default_pg", Members: []int{0, 1}, Engine: "cpu", Timeout: time.Minute}
		if rank == 0 {
			spec.Timeout = 500 * time.Millisecond
		}
		wds[rank].Register(spec, engs[rank], engs[rank])
	}
	w0, w1 := comm.NewPromise(comm.OpAllReduce), comm.NewPromise(comm.OpAllReduce)
	wds[0].Track("default_pg", fpAt(1), 0, w0)
	wds[1].Track("default_pg", fpAt(1), 0, w1)
	w0.MarkStarted()

	if err := waitWork(t, w0.Work(), 20*time.Second); !errors.Is(err, comm.ErrTimeout) {
		t.Fatalf("rank 0: %v", err)
	}
	failed0 := w0.Work().Timings().Completed
	err1 := waitWork(t, w1.Work(), 20*time.Second)
	var re *comm.RemoteAbortError
	if !errors.As(err1, &re) || re.Relay != 0 || re.Rank != 1 {
		t.Fatalf("rank 1: %v, want ErrRemoteAbort reported by rank 0, blaming rank 1 (never reached the op)", err1)
	}
	lag := w1.Work().Timings().Completed.Sub(failed0)
	t.Logf("rank 1 failed %v after rank 0's timeout", lag)
	if lag > 2*time.Second {
		t.Errorf("abort propagation took %v (goal: within 1 s)", lag)
	}
	if !errors.Is(engs[1].abortReason(), comm.ErrRemoteAbort) {
		eventually(t, "rank 1's engine abort", func() bool { return errors.Is(engs[1].abortReason(), comm.ErrRemoteAbort) })
	}
}
