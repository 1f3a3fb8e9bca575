package actors_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/internal/testrank"
)

func newComm(t testing.TB, rec *testrank.Recorder, obs actors.Observer) (*actors.Communicator, *comm.ProcessGroup) {
	t.Helper()
	c, err := actors.NewCommunicator(testrank.QuietSystem(), rec, actors.CommunicatorConfig{Group: "g", Epoch: 3, Observer: obs, Log: zerolog.New(io.Discard)})
	if err != nil {
		t.Fatal(err)
	}
	pg, err := comm.NewProcessGroup(comm.GroupConfig{Name: "g", Epoch: 3, Rank: rec.Rank(), Size: rec.Size(), Launcher: c, Engine: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Destroy(context.Background()) })
	return c, pg
}

// TestCommunicatorOrdering issues ops from many goroutines at once and
// checks that the engine sees seqs 1..N in launch order, each caller's ops
// in its own issue order, and that every Work's seq matches its op.
func TestCommunicatorOrdering(t *testing.T) {
	ctx := context.Background()
	rec := testrank.NewRecorder(0, 2)
	c, pg := newComm(t, rec, nil)
	const callers, per = 8, 200
	works := make([][]*comm.Work, callers)
	var wg sync.WaitGroup
	for g := 0; g < callers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				// The buffer length encodes (caller, index).
				n := g*1000 + i
				var w *comm.Work
				if i%5 == 4 {
					w = pg.ISend(ctx, comm.NewHostBuffer(comm.Float32, n), 1, g)
				} else {
					w = pg.AllReduce(ctx, comm.NewHostBuffer(comm.Float32, n), comm.Sum)
				}
				works[g] = append(works[g], w)
			}
		}()
	}
	wg.Wait()
	for _, ws := range works {
		for _, w := range ws {
			if err := w.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	ops := rec.Ops()
	if len(ops) != callers*per {
		t.Fatalf("engine got %d ops, want %d", len(ops), callers*per)
	}
	var coll, p2p uint64
	last := make([]int, callers)
	for i := range last {
		last[i] = -1
	}
	for _, op := range ops {
		want := &coll
		if op.Type == comm.OpSend {
			want = &p2p
		}
		*want++
		if op.FP.Seq != *want {
			t.Fatalf("launch order broken: %v got seq %d, want %d", op.Type, op.FP.Seq, *want)
		}
		if op.FP.Epoch != 3 || op.FP.Group != comm.GroupHash("g") {
			t.Fatalf("fingerprint identity %+v", op.FP)
		}
		g, i := int(op.FP.Count)/1000, int(op.FP.Count)%1000
		if i <= last[g] {
			t.Fatalf("caller %d's op %d launched after its op %d", g, i, last[g])
		}
		last[g] = i
	}
	for g, ws := range works {
		for i, w := range ws {
			if w.Seq() == 0 {
				t.Fatalf("caller %d op %d has no seq", g, i)
			}
		}
	}
	if c.LastSeq() != callers*per*4/5 || c.LastP2PSeq() != callers*per/5 {
		t.Fatalf("LastSeq %d LastP2PSeq %d", c.LastSeq(), c.LastP2PSeq())
	}
}

// TestObserverSeesScheduled checks that the observer runs with the seq and
// fingerprint set, before the engine launches the op.
func TestObserverSeesScheduled(t *testing.T) {
	ctx := context.Background()
	rec := testrank.NewRecorder(0, 2)
	type seen struct {
		seq      uint64
		launched int
		fpSeq    uint64
	}
	var mu sync.Mutex
	var got []seen
	obs := actors.Observers{nil, actors.ObserverFunc(func(op *comm.Op, p *comm.Promise) {
		mu.Lock()
		got = append(got, seen{p.Work().Seq(), len(rec.Ops()), op.FP.Seq})
		mu.Unlock()
		// The Work carries the op's identity as the actor stamped it.
		if fp := p.Work().Fingerprint(); fp != op.FP || fp.Group != comm.GroupHash("g") || fp.Epoch != 3 || fp.Op != comm.OpBarrier {
			t.Errorf("Work fingerprint %+v, op's %+v", fp, op.FP)
		}
	})}
	_, pg := newComm(t, rec, obs)
	for i := 0; i < 3; i++ {
		if err := pg.Barrier(ctx).Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i, s := range got {
		if s.seq != uint64(i+1) || s.fpSeq != s.seq || s.launched != i {
			t.Errorf("observer call %d: %+v (want seq %d seen before launch %d)", i, s, i+1, i)
		}
	}
	if len(got) != 3 {
		t.Fatalf("observer saw %d ops", len(got))
	}
}

// TestEnginePanic checks that a panicking Launch fails only that Work with
// an *EngineError, and the actor keeps its counters and goes on.
func TestEnginePanic(t *testing.T) {
	ctx := context.Background()
	rec := testrank.NewRecorder(0, 2)
	rec.OnLaunch(func(op *comm.Op, p *comm.Promise) {
		if op.FP.Seq == 2 {
			panic("boom")
		}
	})
	_, pg := newComm(t, rec, nil)
	for i := 1; i <= 3; i++ {
		w := pg.AllReduce(ctx, comm.NewHostBuffer(comm.Int32, 1), comm.Sum)
		err := w.Wait(ctx)
		if i == 2 {
			var ee *comm.EngineError
			if !errors.As(err, &ee) || !errors.Is(err, comm.ErrEngine) || !strings.Contains(err.Error(), "boom") || ee.FP.Seq != 2 {
				t.Fatalf("op 2: %v, want an EngineError at seq 2", err)
			}
			continue
		}
		if err != nil || w.Seq() != uint64(i) {
			t.Fatalf("op %d: seq %d err %v", i, w.Seq(), err)
		}
	}
}

// TestCommunicatorClose checks that Close launches what was submitted
// before it, closes the engine, and fails later submissions with ErrClosed.
func TestCommunicatorClose(t *testing.T) {
	ctx := context.Background()
	rec := testrank.NewRecorder(0, 2)
	c, pg := newComm(t, rec, nil)
	var ws []*comm.Work
	for i := 0; i < 100; i++ {
		ws = append(ws, pg.AllReduce(ctx, comm.NewHostBuffer(comm.Float32, 1), comm.Sum))
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for i, w := range ws {
		if err := w.Wait(ctx); err != nil || w.Seq() != uint64(i+1) {
			t.Fatalf("op %d submitted before Close: seq %d err %v", i, w.Seq(), err)
		}
	}
	if !rec.Closed() {
		t.Fatal("backend not closed")
	}
	w := comm.NewPromise(comm.OpBarrier)
	c.Submit(context.Background(), &comm.Op{Type: comm.OpBarrier}, w)
	if err := w.Work().Err(); !errors.Is(err, comm.ErrClosed) {
		t.Fatalf("Submit after Close: %v", err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal("second Close:", err)
	}
}

// TestCloseStuckEngine checks that Close with a deadline returns even when
// the engine blocks in Launch (against its contract), aborting it, with the
// mailbox loop inline (default) and on its own goroutine.
func TestCloseStuckEngine(t *testing.T) {
	for _, tc := range []struct {
		name string
		disp actor.Dispatcher
	}{{"inline", nil}, {"goroutine", actor.NewDefaultDispatcher(300)}} {
		t.Run(tc.name, func(t *testing.T) {
			rec := testrank.NewRecorder(0, 2)
			release := make(chan struct{})
			entered := make(chan struct{}, 1)
			rec.OnLaunch(func(op *comm.Op, p *comm.Promise) {
				entered <- struct{}{}
				<-release
			})
			c, err := actors.NewCommunicator(testrank.QuietSystem(), rec, actors.CommunicatorConfig{Group: "g", Dispatcher: tc.disp})
			if err != nil {
				t.Fatal(err)
			}
			go c.Submit(context.Background(), &comm.Op{Type: comm.OpBarrier}, comm.NewPromise(comm.OpBarrier))
			<-entered
			queued := comm.NewPromise(comm.OpBarrier)
			c.Submit(context.Background(), &comm.Op{Type: comm.OpBarrier}, queued)
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			start := time.Now()
			err = c.Close(ctx)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Close of a stuck engine: %v", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("Close took %v", d)
			}
			if rec.AsyncError() == nil || !rec.Closed() {
				t.Fatal("stuck engine was not aborted and closed")
			}
			close(release)
			wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer wcancel()
			if err := queued.Work().Wait(wctx); !errors.Is(err, comm.ErrClosed) {
				t.Fatalf("op queued behind the stuck launch: %v, want ErrClosed", err)
			}
		})
	}
}

func TestNewCommunicatorErrors(t *testing.T) {
	if _, err := actors.NewCommunicator(nil, testrank.NewRecorder(0, 1), actors.CommunicatorConfig{Group: "g"}); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("nil system: %v", err)
	}
	if _, err := actors.NewCommunicator(testrank.QuietSystem(), testrank.NewRecorder(0, 1), actors.CommunicatorConfig{}); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("empty group: %v", err)
	}
}

func ExampleNewCommunicator() {
	rec := testrank.NewRecorder(0, 1)
	c, _ := actors.NewCommunicator(testrank.QuietSystem(), rec, actors.CommunicatorConfig{Group: "default_pg"})
	pg, _ := comm.NewProcessGroup(comm.GroupConfig{Name: "default_pg", Rank: 0, Size: 1, Launcher: c, Engine: rec.Name()})
	w := pg.AllReduce(context.Background(), comm.HostBuffer([]float32{1, 2}), comm.Sum)
	fmt.Println(w.Wait(context.Background()), w.Seq(), rec.Ops()[0].FP)
	pg.Destroy(context.Background())
	// Output: <nil> 1 seq 1 AllReduce(float32×2, sum)
}
