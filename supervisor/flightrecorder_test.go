package supervisor

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
)

func allreduceOp(seq uint64, n int) *comm.Op {
	buf := comm.NewHostBuffer(comm.Float32, n)
	return &comm.Op{Type: comm.OpAllReduce, In: []comm.Buffer{buf}, Out: []comm.Buffer{buf},
		FP: comm.Fingerprint{Group: comm.GroupHash("default_pg"), Seq: seq, Op: comm.OpAllReduce,
			DType: comm.Float32, RedOp: comm.RedSum, Count: int64(n), Root: -1}}
}

func TestFlightRecorderStatesFollowWorks(t *testing.T) {
	r := NewFlightRecorder(RecorderConfig{Job: "j", Rank: 2, WorldSize: 4, Capacity: 8})
	r.AddGroup("default_pg", 0, 2, []int{0, 1, 2, 3})
	ws := make([]*comm.Promise, 4)
	for i := range ws {
		ws[i] = comm.NewPromise(comm.OpAllReduce)
		id := r.Record("default_pg", allreduceOp(uint64(i+1), 16), ws[i].Work(), 2*time.Second)
		if id != uint64(i+1) {
			t.Fatalf("record id %d, want %d", id, i+1)
		}
	}
	ws[0].MarkStarted()
	ws[0].Complete(nil)
	ws[1].MarkStarted()
	ws[1].Complete(&comm.EngineError{Engine: "cpu", Rank: 2, Msg: "injected"})
	ws[2].MarkStarted()

	d := r.Dump("request")
	if d.Version != DumpVersion || d.Job != "j" || d.Rank != 2 || d.WorldSize != 4 || d.Reason != "request" {
		t.Errorf("header %+v", d)
	}
	want := []string{actors.StateCompleted, actors.StateFailed, actors.StateStarted, actors.StateScheduled}
	if len(d.Entries) != 4 {
		t.Fatalf("%d entries", len(d.Entries))
	}
	for i, e := range d.Entries {
		if e.State != want[i] || e.Seq != uint64(i+1) || e.Op != "ALLREDUCE" || e.DType != "float32" ||
			e.Count != 16 || e.TimeoutMS != 2000 || e.Group != "default_pg" || e.RedOp != "sum" {
			t.Errorf("entry %d = %+v, want state %s", i, e, want[i])
		}
		if len(e.InputSizes) != 1 || e.InputSizes[0][0] != 16 || e.InputDTypes[0] != "float32" {
			t.Errorf("entry %d sizes %v %v", i, e.InputSizes, e.InputDTypes)
		}
	}
	if !strings.Contains(d.Entries[1].Error, "injected") {
		t.Errorf("failed entry error %q", d.Entries[1].Error)
	}
	if d.Entries[0].TimeCompletedNS == 0 || d.Entries[0].TimeStartedNS == 0 || d.Entries[3].TimeStartedNS != 0 {
		t.Errorf("times: %+v / %+v", d.Entries[0], d.Entries[3])
	}
	g := d.Groups[0]
	if g.LastEnqueued != 4 || g.LastStarted != 3 || g.LastCompleted != 1 || g.GroupRank != 2 || len(g.Ranks) != 4 {
		t.Errorf("status %+v, want enqueued 4 started 3 completed 1", g)
	}
}

func TestFlightRecorderRingEvictsOldest(t *testing.T) {
	r := NewFlightRecorder(RecorderConfig{Rank: 0, Capacity: 3})
	for seq := uint64(1); seq <= 7; seq++ {
		p := comm.NewPromise(comm.OpAllReduce)
		r.Record("default_pg", allreduceOp(seq, 1), p.Work(), time.Second)
		if seq <= 5 {
			p.MarkStarted()
			p.Complete(nil)
		}
	}
	p2p := &comm.Op{Type: comm.OpSend, Peer: 1, FP: comm.Fingerprint{Seq: 1, Op: comm.OpSend, DType: comm.Int32, Count: 2, Root: 1},
		In: []comm.Buffer{comm.NewHostBuffer(comm.Int32, 2)}}
	r.Record("pg1", p2p, nil, time.Second)

	d := r.Dump("timeout")
	var seqs []uint64
	for _, e := range d.Entries {
		if e.Group == "default_pg" {
			seqs = append(seqs, e.Seq)
		}
	}
	if len(seqs) != 3 || seqs[0] != 5 || seqs[2] != 7 {
		t.Errorf("ring kept seqs %v, want [5 6 7]", seqs)
	}
	var dpg, pg1 GroupStatus
	for _, g := range d.Groups {
		switch g.Group {
		case "default_pg":
			dpg = g
		case "pg1":
			pg1 = g
		}
	}
	if dpg.Evicted != 4 || dpg.LastCompleted != 5 || dpg.LastEnqueued != 7 {
		t.Errorf("default_pg status %+v, want evicted 4, completed 5, enqueued 7", dpg)
	}
	if pg1.LastEnqueuedP2P != 1 || pg1.LastEnqueued != 0 {
		t.Errorf("pg1 status %+v", pg1)
	}
	last := d.Entries[len(d.Entries)-1]
	if !last.IsP2P || last.P2PSeq != 1 || last.Seq != 0 || last.Op != "SEND" || last.Root != 1 {
		t.Errorf("p2p entry %+v", last)
	}
	// SetState drives entries recorded without a Work.
	r.SetState(last.RecordID, actors.StateCompleted, time.Now(), nil)
	d = r.Dump("x")
	if e := d.Entries[len(d.Entries)-1]; e.State != actors.StateCompleted || e.TimeCompletedNS == 0 {
		t.Errorf("after SetState: %+v", e)
	}
}

func TestFlightRecorderDisabledKeepsProgress(t *testing.T) {
	r := NewFlightRecorder(RecorderConfig{Capacity: TraceDisabled})
	r.Record("default_pg", allreduceOp(1, 4), comm.NewPromise(comm.OpAllReduce).Work(), time.Second)
	d := r.Dump("x")
	if len(d.Entries) != 0 || len(d.Groups) != 1 || d.Groups[0].LastEnqueued != 1 {
		t.Errorf("disabled recorder dump %+v", d)
	}
}

func TestFlightRecorderNewEpochResetsProgress(t *testing.T) {
	r := NewFlightRecorder(RecorderConfig{Capacity: 10})
	r.AddGroup("default_pg", 0, 0, []int{0, 1})
	for seq := uint64(1); seq <= 3; seq++ {
		r.Record("default_pg", allreduceOp(seq, 1), nil, time.Second)
	}
	op := allreduceOp(1, 1)
	op.FP.Epoch = 1
	r.Record("default_pg", op, nil, time.Second)
	d := r.Dump("x")
	if g := d.Groups[0]; g.Epoch != 1 || g.LastEnqueued != 1 || len(g.Ranks) != 2 {
		t.Errorf("status after epoch change %+v", g)
	}
	if len(d.Entries) != 4 {
		t.Errorf("old epoch's entries should stay: %d", len(d.Entries))
	}
}

func TestFlightRecorderConcurrent(t *testing.T) {
	r := NewFlightRecorder(RecorderConfig{Capacity: 64})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			name := []string{"a", "b", "c", "d"}[g]
			for seq := uint64(1); seq <= 200; seq++ {
				p := comm.NewPromise(comm.OpAllReduce)
				r.Record(name, allreduceOp(seq, 1), p.Work(), time.Second)
				go p.Complete(nil)
			}
		}(g)
	}
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
				_ = r.Dump("concurrent")
			}
		}
	}()
	wg.Wait()
	close(stop)
	d := r.Dump("final")
	if len(d.Entries) != 4*64 {
		t.Errorf("%d entries, want %d", len(d.Entries), 4*64)
	}
	for i := 1; i < len(d.Entries); i++ {
		if d.Entries[i].RecordID <= d.Entries[i-1].RecordID {
			t.Fatalf("entries not ordered by record id at %d", i)
		}
	}
}

func TestWriteDumpFileAndStore(t *testing.T) {
	r := NewFlightRecorder(RecorderConfig{Job: "j", Rank: 3, WorldSize: 4})
	p := comm.NewPromise(comm.OpAllReduce)
	r.Record("default_pg", allreduceOp(1, 4), p.Work(), time.Minute)
	dir := t.TempDir() + "/traces"
	st := store.NewMemStore()
	defer st.Close()
	ctx := context.Background()
	if err := (Dumper{Rec: r, Dir: dir, Store: st}).Dump(ctx, "timeout"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(TraceFile(dir, 3))
	if err != nil {
		t.Fatal(err)
	}
	fromFile, err := ParseDump(b)
	if err != nil {
		t.Fatal(err)
	}
	b, err = st.Get(ctx, "trace/3")
	if err != nil {
		t.Fatal(err)
	}
	fromStore, err := ParseDump(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []Dump{fromFile, fromStore} {
		if d.Rank != 3 || d.Reason != "timeout" || len(d.Entries) != 1 || d.Entries[0].State != actors.StateScheduled {
			t.Errorf("read back %+v", d)
		}
	}
	dumps, err := ReadDumps(ctx, st, 4)
	if err != nil || len(dumps) != 1 || dumps[0].Rank != 3 {
		t.Errorf("ReadDumps = %+v, %v", dumps, err)
	}
	if _, err := ParseDump([]byte(`{"version":"other/1"}`)); err == nil {
		t.Error("ParseDump accepted a foreign version")
	}
}

func TestWriteDumpTruncatesForStore(t *testing.T) {
	r := NewFlightRecorder(RecorderConfig{Capacity: 20000})
	for seq := uint64(1); seq <= 12000; seq++ {
		r.Record("default_pg", allreduceOp(seq, 1), nil, time.Minute)
	}
	st := store.NewMemStore()
	defer st.Close()
	ctx := context.Background()
	if err := WriteDump(ctx, r.Dump("x"), "", st); err != nil {
		t.Fatal(err)
	}
	b, _ := st.Get(ctx, TraceKey(0))
	d, err := ParseDump(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > MaxStoreDumpBytes || d.Truncated == 0 || d.Truncated+len(d.Entries) != 12000 {
		t.Errorf("store copy %d bytes, truncated %d, kept %d", len(b), d.Truncated, len(d.Entries))
	}
	if d.Entries[len(d.Entries)-1].Seq != 12000 {
		t.Error("truncation dropped the newest entries")
	}
}

func TestWriteDumpReportsErrors(t *testing.T) {
	st := store.NewMemStore()
	st.Close()
	f := t.TempDir() + "/file"
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := WriteDump(context.Background(), Dump{Version: DumpVersion, Rank: 1}, f, st)
	if err == nil || !errors.Is(err, store.ErrClosed) || !strings.Contains(err.Error(), "trace/1") {
		t.Errorf("WriteDump to a file path and a closed store: %v", err)
	}
}

func TestFlightRecorderObserver(t *testing.T) {
	r := NewFlightRecorder(RecorderConfig{})
	obs := actors.Observers{r.Observer("pg1", func() time.Duration { return time.Minute })}
	op := allreduceOp(1, 2)
	obs.Scheduled(op, comm.NewPromise(comm.OpAllReduce))
	op2 := allreduceOp(2, 2)
	op2.Timeout = 3 * time.Second
	obs.Scheduled(op2, comm.NewPromise(comm.OpAllReduce))
	d := r.Dump("x")
	if len(d.Entries) != 2 || d.Entries[0].Group != "pg1" || d.Entries[0].TimeoutMS != 60000 || d.Entries[1].TimeoutMS != 3000 {
		t.Errorf("entries %+v", d.Entries)
	}
}

// BenchmarkFlightRecorderRecord measures the launch-path cost of one
// flight-recorder entry (ring full, so every record evicts).
func BenchmarkFlightRecorderRecord(b *testing.B) {
	r := NewFlightRecorder(RecorderConfig{Capacity: 2000})
	op := allreduceOp(1, 1024)
	p := comm.NewPromise(comm.OpAllReduce)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		op.FP.Seq = uint64(i + 1)
		r.Record("default_pg", op, p.Work(), time.Minute)
	}
}

// TestFlightRecorderRecordAllocs asserts that recording an op allocates
// nothing once its group's ring exists (issue 15: a preallocated ring),
// for a plain op and for a coalesced op of more buffers than a slot holds
// inline (its overflow slice is reused from the second lap on).
func TestFlightRecorderRecordAllocs(t *testing.T) {
	r := NewFlightRecorder(RecorderConfig{Rank: 0, WorldSize: 2, Capacity: 16})
	plain := allreduceOp(1, 4)
	var children []*comm.Op
	for i := range 3 {
		children = append(children, allreduceOp(1, 2+i))
	}
	coal := &comm.Op{Type: comm.OpCoalesced, Children: children,
		FP: comm.Fingerprint{Op: comm.OpCoalesced, DType: comm.Float32, RedOp: comm.RedSum, Count: 9, Root: -1}}
	p := comm.NewPromise(comm.OpAllReduce)
	for range 32 { // two laps: every slot's overflow slice exists
		r.Record("g", plain, p.Work(), time.Second)
		r.Record("g", coal, p.Work(), time.Second)
	}
	if a := testing.AllocsPerRun(100, func() {
		r.Record("g", plain, p.Work(), time.Second)
		r.Record("g", coal, p.Work(), time.Second)
	}); a != 0 {
		t.Fatalf("%v allocations per Record pair, want 0", a)
	}
	// Evicting the slots of finished Works, failed ones included (whose
	// error text a dump shows), allocates nothing either.
	done, failed := comm.NewPromise(comm.OpAllReduce), comm.NewPromise(comm.OpAllReduce)
	done.Complete(nil)
	failed.Complete(errors.New("comm: boom"))
	if a := testing.AllocsPerRun(100, func() {
		r.Record("g", plain, done.Work(), time.Second)
		r.Record("g", plain, failed.Work(), time.Second)
	}); a != 0 {
		t.Fatalf("%v allocations per Record pair evicting finished Works, want 0", a)
	}
	for range 8 {
		r.Record("g", plain, p.Work(), time.Second)
		r.Record("g", coal, p.Work(), time.Second)
	}
	// A slot stays within two cache lines: Record overwrites the ring's
	// oldest, which has long left the CPU's caches.
	if n := unsafe.Sizeof(slot{}); n > 128 {
		t.Errorf("a slot takes %d bytes, more than two cache lines", n)
	}
	// The dump still lists each op's shapes, inputs then outputs.
	d := r.Dump("test")
	if len(d.Entries) != 16 {
		t.Fatalf("%d entries, want 16", len(d.Entries))
	}
	for _, e := range d.Entries {
		switch e.Op {
		case comm.OpAllReduce.String():
			if len(e.InputSizes) != 1 || e.InputSizes[0][0] != 4 || len(e.OutputSizes) != 1 || e.OutputSizes[0][0] != 4 {
				t.Fatalf("allreduce shapes %v → %v", e.InputSizes, e.OutputSizes)
			}
		case comm.OpCoalesced.String():
			if len(e.InputSizes) != 3 || len(e.OutputSizes) != 3 || e.InputSizes[2][0] != 4 || e.OutputSizes[0][0] != 2 ||
				len(e.InputDTypes) != 3 || e.InputDTypes[0] != "float32" || e.Count != 9 || e.RedOp != comm.RedSum.String() {
				t.Fatalf("coalesced entry %+v", e)
			}
		default:
			t.Fatalf("unexpected entry %+v", e)
		}
	}
	// A dump owns its shapes: recording over the ring does not change it.
	before := d.Entries[0].InputSizes[0][0]
	for range 16 {
		r.Record("g", allreduceOp(2, 7), p.Work(), time.Second)
	}
	if d.Entries[0].InputSizes[0][0] != before {
		t.Fatal("a dump's shapes changed when the ring was reused")
	}
}

// TestFlightRecorderFoldSlotMatchesEntry: the progress an evicted slot
// folds into its group's counters, read from the slot and its Work
// (foldSlot, on Record), is the progress its dumped entry gives (fold of
// entryState), for every state: Works scheduled, started, completed and
// failed, collectives and P2P, entries without a Work driven by SetState,
// and entries of an older epoch.
func TestFlightRecorderFoldSlotMatchesEntry(t *testing.T) {
	mk := func(started, done bool, err error) *comm.Work {
		p := comm.NewPromise(comm.OpAllReduce)
		if started {
			p.MarkStarted()
		}
		if done {
			p.Complete(err)
		}
		return p.Work()
	}
	boom := errors.New("boom")
	works := []*comm.Work{nil, mk(false, false, nil), mk(true, false, nil), mk(true, true, nil), mk(false, true, nil),
		mk(true, true, boom), mk(false, true, boom)}
	noWork := []struct {
		state     string
		started   int64
		completed int64
	}{{actors.StateScheduled, 0, 0}, {actors.StateStarted, 5, 0}, {actors.StateCompleted, 5, 9},
		{actors.StateFailed, 5, 9}, {actors.StateCompleted, 0, 9}}
	for _, typ := range []comm.OpType{comm.OpAllReduce, comm.OpSend} {
		for _, epoch := range []uint32{1, 2} {
			for wi, w := range works {
				for ni, nw := range noWork {
					if w != nil && ni > 0 {
						break // the SetState fields matter only without a Work
					}
					s := slot{id: 1, typ: typ, w: w, fp: comm.Fingerprint{Epoch: epoch, Seq: 7, Op: typ}}
					if w == nil {
						s.man = &manualState{state: nw.state, started: nw.started, completed: nw.completed}
					}
					a := ring{status: GroupStatus{Epoch: 2, LastStarted: 3, LastCompleted: 2, LastCompletedP2P: 1}}
					b := a
					a.foldSlot(&s)
					b.fold(entryState("g", &s))
					if !reflect.DeepEqual(a.status, b.status) {
						t.Errorf("%v epoch %d work %d state %d: foldSlot %+v, fold(entry) %+v", typ, epoch, wi, ni, a.status, b.status)
					}
				}
			}
		}
	}
}

// TestFlightRecorderEarlyFoldKeepsProgress: the progress a dump shows
// (pg_status) while the recorder folds ended Works early (foldEnded)
// equals, after every Record, that of folding each slot only at its
// eviction (fold of its entry then) plus the live entries, under random
// launch, start, completion, failure and epoch-bump patterns, for
// collectives and P2P.
func TestFlightRecorderEarlyFoldKeepsProgress(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 50 {
		const capacity = 8
		r := NewFlightRecorder(RecorderConfig{Capacity: capacity})
		ref := ring{status: GroupStatus{Group: "g", GroupRank: -1}}
		var live []slot // the reference ring, oldest first
		var open []*comm.Promise
		epoch, seq, p2pSeq := uint32(0), uint64(0), uint64(0)
		for i := range 300 {
			for _, p := range open { // advance some Works in flight
				switch rng.IntN(6) {
				case 0:
					p.MarkStarted()
				case 1:
					p.MarkStarted()
					p.Complete(nil)
				case 2:
					p.Complete(errors.New("boom"))
				}
			}
			open = slices.DeleteFunc(open, func(p *comm.Promise) bool { return p.Work().IsCompleted() })
			if rng.IntN(100) == 0 {
				epoch, seq, p2pSeq = epoch+1, 0, 0
			}
			op := allreduceOp(0, 1)
			if rng.IntN(4) == 0 {
				p2pSeq++
				op = &comm.Op{Type: comm.OpSend, Peer: 1, FP: comm.Fingerprint{Seq: p2pSeq, Op: comm.OpSend, DType: comm.Int32, Count: 1, Root: 1}}
			} else {
				seq++
				op.FP.Seq = seq
			}
			op.FP.Epoch = epoch
			p := comm.NewPromise(op.Type)
			open = append(open, p)
			r.Record("g", op, p.Work(), time.Second)

			if epoch > ref.status.Epoch {
				ref.status = GroupStatus{Group: "g", Epoch: epoch, GroupRank: -1, Evicted: ref.status.Evicted}
			}
			if len(live) == capacity {
				ref.fold(entryState("g", &live[0]))
				ref.status.Evicted++
				live = live[1:]
			}
			live = append(live, slot{fp: op.FP, typ: op.Type, w: p.Work()})
			got := r.Dump("x").Groups[0]
			snap := ring{status: ref.status}
			for i := range live {
				snap.fold(entryState("g", &live[i]))
			}
			want := snap.status
			want.LastEnqueued, want.LastEnqueuedP2P, want.Ranks = got.LastEnqueued, got.LastEnqueuedP2P, got.Ranks
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("trial %d record %d: counters %+v, folding at eviction gives %+v", trial, i, got, want)
			}
		}
	}
}
