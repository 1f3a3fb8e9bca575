package comm_test

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/internal/testrank"
)

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestNewGroup checks subgroup creation: sorted members, derived names,
// the spec the factory sees, and the non-member view (rank -1, ops are
// no-ops logged as warnings).
func TestNewGroup(t *testing.T) {
	ctx := context.Background()
	logs := &syncBuffer{}
	var recs []*testrank.Recorder
	f := testrank.RecorderFactory(testrank.QuietSystem(), func(_ comm.GroupSpec, r *testrank.Recorder) { recs = append(recs, r) })
	f.Log = zerolog.New(logs)
	world, err := f.World(ctx, 2, 4) // global rank 2
	if err != nil {
		t.Fatal(err)
	}
	defer world.Destroy(ctx)

	sub, err := world.NewGroup(ctx, []int{3, 0, 2}, comm.WithGroupTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if sub.Name() != "default_pg.1" || sub.Rank() != 1 || sub.Size() != 3 || !reflect.DeepEqual(sub.Ranks(), []int{0, 2, 3}) || sub.Timeout() != time.Minute {
		t.Fatalf("subgroup %v ranks %v timeout %v", sub, sub.Ranks(), sub.Timeout())
	}
	specs := f.Specs()
	want := comm.GroupSpec{Name: "default_pg.1", Parent: "default_pg", GlobalRanks: []int{0, 2, 3}, Rank: 1, Timeout: time.Minute}
	if !reflect.DeepEqual(specs[len(specs)-1], want) {
		t.Fatalf("factory spec %+v, want %+v", specs[len(specs)-1], want)
	}
	// The subgroup has its own communicator and sequence.
	if w := sub.AllReduce(ctx, f32(1), comm.Sum); w.Wait(ctx) != nil || w.Seq() != 1 {
		t.Fatalf("subgroup op seq %d err %v", w.Seq(), w.Err())
	}
	if g, _ := sub.GlobalRank(2); g != 3 {
		t.Errorf("sub.GlobalRank(2) = %d", g)
	}

	// Not a member: rank -1, ops complete at once without reaching any engine.
	out, err := world.NewGroup(ctx, []int{0, 1}, comm.WithGroupName("pair"))
	if err != nil {
		t.Fatal(err)
	}
	if out.Name() != "pair" || out.Rank() != -1 || out.Size() != -1 || out.IsMember() {
		t.Fatalf("non-member view %v", out)
	}
	nops := len(recs)
	w := out.AllReduce(ctx, f32(3), comm.Sum)
	if !w.IsCompleted() || w.Err() != nil || w.Seq() != 0 {
		t.Fatalf("non-member op: completed %v err %v seq %d", w.IsCompleted(), w.Err(), w.Seq())
	}
	if err := out.Send(ctx, f32(1), 0, 0); err != nil {
		t.Fatalf("non-member send: %v", err)
	}
	if b, err := out.AllGatherBytes(ctx, []byte("x")); b != nil || err != nil {
		t.Fatalf("non-member AllGatherBytes: %v %v", b, err)
	}
	if len(recs) != nops {
		t.Fatal("a backend was created for a non-member")
	}
	if !strings.Contains(logs.String(), `"level":"warn"`) || !strings.Contains(logs.String(), "not a member") {
		t.Errorf("no warning logged for the non-member op: %s", logs.String())
	}
	// The next group's name counts both earlier calls.
	third, err := world.NewGroup(ctx, []int{2})
	if err != nil || third.Name() != "default_pg.3" || third.Rank() != 0 {
		t.Fatalf("third group %v, %v", third, err)
	}

	bad := [][]int{{}, {1, 1}, {0, 4}, {-1}}
	for _, ranks := range bad {
		if _, err := world.NewGroup(ctx, ranks); !errors.Is(err, comm.ErrInvalidArgument) {
			t.Errorf("NewGroup(%v): %v, want ErrInvalidArgument", ranks, err)
		}
	}
	// Members of a subgroup must come from it.
	if _, err := sub.NewGroup(ctx, []int{1, 2}); !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), "global rank 1 is not a member") {
		t.Errorf("NewGroup with a non-member of the parent: %v", err)
	}
}

// TestSplit checks Split's grouping by color and ordering by (key, rank),
// with the colors and keys of the other ranks supplied through the
// all-gather the engine receives.
func TestSplit(t *testing.T) {
	ctx := context.Background()
	pg, rec, f := newRecorded(t, 1, 4)
	// rank: color, key  -> rank 0: (0,5) rank 1: (1,2) rank 2: (0,1) rank 3: (1,1)
	table := []int64{0, 5, 1, 2, 0, 1, 1, 1}
	rec.OnLaunch(func(op *comm.Op, p *comm.Promise) {
		if op.Type == comm.OpAllGather {
			s, _ := comm.AsSlice[int64](op.Out[0])
			copy(s, table)
		}
	})
	sub, err := pg.Split(ctx, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if sub.Name() != "default_pg.1.c1" || sub.Rank() != 1 || !reflect.DeepEqual(sub.Ranks(), []int{3, 1}) {
		t.Fatalf("split group %v ranks %v, want default_pg.1.c1 rank 1 of [3 1]", sub, sub.Ranks())
	}
	ops := rec.Ops()
	if len(ops) != 1 || ops[0].Type != comm.OpAllGather || ops[0].FP.Count != 2 || ops[0].FP.DType != comm.Int64 {
		t.Fatalf("split exchanged with %d ops, first %+v", len(ops), ops[0].FP)
	}
	table[2] = -1 // this rank opts out
	none, err := pg.Split(ctx, -1, 0)
	if err != nil || none.Rank() != -1 || none.Size() != -1 {
		t.Fatalf("color -1: %v, %v", none, err)
	}
	if n := len(f.Specs()); n != 2 { // world + the c1 group
		t.Fatalf("factory called %d times", n)
	}
}

// TestDestroy checks that Destroy is idempotent, closes the engine, and
// that later ops fail with ErrClosed.
func TestDestroy(t *testing.T) {
	ctx := context.Background()
	pg, rec, _ := newRecorded(t, 0, 2)
	rec.SetHold(true)
	inflight := pg.AllReduce(ctx, f32(1), comm.Sum)
	if err := pg.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pg.Destroy(ctx); err != nil {
		t.Fatal("second Destroy:", err)
	}
	if !rec.Closed() {
		t.Fatal("engine not closed")
	}
	if err := inflight.Wait(ctx); !errors.Is(err, comm.ErrClosed) {
		t.Fatalf("in-flight op after Destroy: %v", err)
	}
	if err := pg.Broadcast(ctx, f32(1), 0).Err(); !errors.Is(err, comm.ErrClosed) {
		t.Fatalf("op after Destroy: %v", err)
	}
	if _, err := pg.NewGroup(ctx, []int{0}); !errors.Is(err, comm.ErrClosed) {
		t.Fatalf("NewGroup after Destroy: %v", err)
	}
}

// TestAbort checks that Abort reaches the engine without queueing.
func TestAbort(t *testing.T) {
	ctx := context.Background()
	pg, rec, _ := newRecorded(t, 0, 2)
	rec.SetHold(true)
	w := pg.AllReduce(ctx, f32(1), comm.Sum)
	for len(rec.Ops()) == 0 {
		time.Sleep(time.Millisecond)
	}
	pg.Abort(errors.New("test abort"))
	err := w.Wait(ctx)
	if !errors.Is(err, comm.ErrAborted) || !strings.Contains(err.Error(), "test abort") {
		t.Fatalf("aborted op: %v", err)
	}
}

// TestCanceledContext checks that a call with an ended ctx fails without
// using a sequence number.
func TestCanceledContext(t *testing.T) {
	pg, rec, _ := newRecorded(t, 0, 2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := pg.AllReduce(ctx, f32(1), comm.Sum).Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled ctx: %v", err)
	}
	if len(rec.Ops()) != 0 {
		t.Fatal("op launched with a canceled ctx")
	}
}
