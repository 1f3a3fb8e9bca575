package reducer

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/x448/float16"

	"github.com/ranktree/ranktree/comm"
)

// memWorld is a TEST DOUBLE of a process group, not the comm engine: n
// ranks in one process, each collective matched across ranks by the
// rank's own sequence number and executed once every rank has issued it,
// one at a time in sequence order like an engine stream. A rank that
// issues a different collective at the same sequence number fails with
// comm.ErrMismatch instead of hanging. It adds what the real engine cannot
// give a test: per-rank launch logs and injected failures. Tests that need
// neither run on both it and the real CPU engine (eachWorld).
type memWorld struct {
	n int

	mu       sync.Mutex
	slots    map[uint64]*memSlot
	seqs     []uint64
	lastDone chan struct{}
	log      [][]memLaunch // per rank, in issue order
	failSeq  uint64        // when non-zero, the collective at this seq fails with an *EngineError
}

// memLaunch records one collective as a rank issued it.
type memLaunch struct {
	Seq  uint64
	Desc string // e.g. "AllReduce float32×10 sum"
	At   time.Time
}

type memSlot struct {
	parts   []memPart
	arrived int
}

type memPart struct {
	desc    string
	typ     comm.OpType
	in, out comm.Buffer
	op      comm.ReduceOp
	root    int
	p       *comm.Promise
}

type memGroup struct {
	w    *memWorld
	rank int
}

func newMemWorld(n int) *memWorld {
	done := make(chan struct{})
	close(done)
	return &memWorld{n: n, slots: map[uint64]*memSlot{}, seqs: make([]uint64, n), lastDone: done, log: make([][]memLaunch, n)}
}

func (w *memWorld) groups() []Group {
	gs := make([]Group, w.n)
	for r := range gs {
		gs[r] = &memGroup{w: w, rank: r}
	}
	return gs
}

// failNext makes the collective k sequence numbers after rank 0's last
// one (k ≥ 1) fail with an *EngineError on every rank.
func (w *memWorld) failNext(k int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.failSeq = w.seqs[0] + uint64(k)
}

// launches returns a copy of rank r's issue log.
func (w *memWorld) launches(r int) []memLaunch {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]memLaunch(nil), w.log[r]...)
}

func (g *memGroup) Rank() int { return g.rank }
func (g *memGroup) Size() int { return g.w.n }

func (g *memGroup) AllReduce(ctx context.Context, buf comm.Buffer, op comm.ReduceOp, _ ...comm.OpOption) *comm.Work {
	return g.submit(memPart{desc: fmt.Sprintf("AllReduce %v %v", buf, op), typ: comm.OpAllReduce, in: buf, op: op})
}

func (g *memGroup) Broadcast(ctx context.Context, buf comm.Buffer, root int, _ ...comm.OpOption) *comm.Work {
	return g.submit(memPart{desc: fmt.Sprintf("Broadcast %v root %d", buf, root), typ: comm.OpBroadcast, in: buf, root: root})
}

func (g *memGroup) AllGatherInto(ctx context.Context, out, in comm.Buffer, _ ...comm.OpOption) *comm.Work {
	if out.Len() != in.Len()*g.w.n || out.DType() != in.DType() {
		return comm.FailedWork(comm.OpAllGather, fmt.Errorf("%w: allgather out %v for in %v", comm.ErrInvalidArgument, out, in))
	}
	return g.submit(memPart{desc: fmt.Sprintf("AllGather %v", in), typ: comm.OpAllGather, in: in, out: out})
}

func (g *memGroup) submit(p memPart) *comm.Work {
	w := g.w
	p.p = comm.NewPromise(p.typ)
	w.mu.Lock()
	w.seqs[g.rank]++
	seq := w.seqs[g.rank]
	p.p.SetSeq(seq)
	w.log[g.rank] = append(w.log[g.rank], memLaunch{Seq: seq, Desc: p.desc, At: time.Now()})
	s := w.slots[seq]
	if s == nil {
		s = &memSlot{parts: make([]memPart, w.n)}
		w.slots[seq] = s
	}
	s.parts[g.rank] = p
	s.arrived++
	if s.arrived == w.n {
		delete(w.slots, seq)
		prev, done := w.lastDone, make(chan struct{})
		w.lastDone = done
		fail := w.failSeq == seq
		go func() {
			<-prev
			w.execute(seq, s, fail)
			close(done)
		}()
	}
	w.mu.Unlock()
	return p.p.Work()
}

func (w *memWorld) execute(seq uint64, s *memSlot, fail bool) {
	for r, p := range s.parts {
		if p.desc != s.parts[0].desc {
			err := fmt.Errorf("%w: seq %d: rank %d issued %q, rank 0 issued %q", comm.ErrMismatch, seq, r, p.desc, s.parts[0].desc)
			for _, q := range s.parts {
				q.p.Complete(err)
			}
			return
		}
	}
	if fail {
		for r, q := range s.parts {
			q.p.Complete(&comm.EngineError{Engine: "memtest", Rank: r, Msg: fmt.Sprintf("injected failure at seq %d", seq)})
		}
		return
	}
	p0 := s.parts[0]
	switch p0.typ {
	case comm.OpAllReduce:
		res := make([]float64, p0.in.Len())
		for i := range res {
			acc := readElem(s.parts[0].in, i)
			for _, q := range s.parts[1:] {
				acc = combine(p0.op, p0.in.DType(), acc, readElem(q.in, i))
			}
			res[i] = acc
		}
		for _, q := range s.parts {
			for i, v := range res {
				writeElem(q.in, i, v)
			}
		}
	case comm.OpBroadcast:
		for r, q := range s.parts {
			if r != p0.root {
				comm.CopyBuffer(q.in, s.parts[p0.root].in)
			}
		}
	case comm.OpAllGather:
		c := p0.in.Len()
		for _, q := range s.parts {
			for r, src := range s.parts {
				comm.CopyBuffer(q.out.Slice(r*c, c), src.in)
			}
		}
	}
	for _, q := range s.parts {
		q.p.Complete(nil)
	}
}

// combine applies op in the element type's precision: float16 and
// bfloat16 sums are rounded back to their type after each addition, so an
// fp16 sum past 65504 becomes +Inf as on a real engine.
func combine(op comm.ReduceOp, dt comm.DType, a, b float64) float64 {
	var v float64
	switch op.Type() {
	case comm.RedSum:
		v = a + b
	case comm.RedMax:
		v = math.Max(a, b)
	case comm.RedMin:
		v = math.Min(a, b)
	default:
		panic("memWorld: unsupported reduce op " + op.String())
	}
	switch dt {
	case comm.Float32:
		return float64(float32(v))
	case comm.Float16:
		return float64(float16.Fromfloat32(float32(v)).Float32())
	case comm.BFloat16:
		return float64(comm.BFloat16FromFloat32(float32(v)).Float32())
	}
	return v
}

func readElem(b comm.Buffer, i int) float64 {
	switch b.DType() {
	case comm.Float32:
		return float64(mustSlice[float32](b)[i])
	case comm.Float64:
		return mustSlice[float64](b)[i]
	case comm.Float16:
		return float64(mustSlice[comm.Float16Value](b)[i].Float32())
	case comm.BFloat16:
		return float64(mustSlice[comm.BFloat16Value](b)[i].Float32())
	case comm.Int32:
		return float64(mustSlice[int32](b)[i])
	case comm.Int64:
		return float64(mustSlice[int64](b)[i])
	}
	panic("memWorld: unsupported dtype " + b.DType().String())
}

func writeElem(b comm.Buffer, i int, v float64) {
	switch b.DType() {
	case comm.Float32:
		mustSlice[float32](b)[i] = float32(v)
	case comm.Float64:
		mustSlice[float64](b)[i] = v
	case comm.Float16:
		mustSlice[comm.Float16Value](b)[i] = float16.Fromfloat32(float32(v))
	case comm.BFloat16:
		mustSlice[comm.BFloat16Value](b)[i] = comm.BFloat16FromFloat32(float32(v))
	case comm.Int32:
		mustSlice[int32](b)[i] = int32(v)
	case comm.Int64:
		mustSlice[int64](b)[i] = int64(v)
	default:
		panic("memWorld: unsupported dtype " + b.DType().String())
	}
}

// newTestGroups returns n connected groups for a multi-rank test and the
// double's world (for launch logs and injected delays/failures). This is
// the one place to switch the tests to real in-process process groups.
func newTestGroups(t testing.TB, n int) ([]Group, *memWorld) {
	t.Helper()
	w := newMemWorld(n)
	return w.groups(), w
}

// runRanks runs fn for every rank in its own goroutine (the ranks) and
// fails the test with every rank's error. It gives up after a minute so
// a protocol bug shows as a failure, not a hung test.
func runRanks(t testing.TB, groups []Group, fn func(rank int, g Group) error) {
	t.Helper()
	type result struct {
		rank int
		err  error
	}
	results := make(chan result, len(groups))
	for r, g := range groups {
		go func() { results <- result{r, fn(r, g)} }()
	}
	timeout := time.After(time.Minute)
	for range groups {
		select {
		case res := <-results:
			if res.err != nil {
				t.Errorf("rank %d: %v", res.rank, res.err)
			}
		case <-timeout:
			t.Fatal("ranks did not finish within a minute (a rank failed and left the others waiting, or collective order differs)")
		}
	}
}

// TestMemWorldFP16SumOverflows checks the double itself: an fp16 sum past
// the range is +Inf, so the fp16 guard tests below can fail.
func TestMemWorldFP16SumOverflows(t *testing.T) {
	groups, _ := newTestGroups(t, 2)
	runRanks(t, groups, func(rank int, g Group) error {
		v := []comm.Float16Value{float16.Fromfloat32(32768)}
		if err := g.AllReduce(context.Background(), comm.HostBuffer(v), comm.Sum).Wait(context.Background()); err != nil {
			return err
		}
		if !math.IsInf(float64(v[0].Float32()), 1) {
			return fmt.Errorf("fp16 2^15+2^15 = %v, want +Inf", v[0].Float32())
		}
		return nil
	})
}
