package cpu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu/transport"
	"github.com/ranktree/ranktree/comm/internal/enginekit"
)

// Engine is the built-in CPU collective engine for one communicator: a
// comm.Backend (the counterpart of c10d's ProcessGroupGloo). It executes
// ops in launch order on its stream, a queue drained by one progress
// goroutine; several launched Works may be queued at once.
type Engine struct {
	cfg  comm.BackendConfig
	opts Options
	log  zerolog.Logger
	ctl  *transport.Ctl
	mesh *transport.Mesh
	ln   net.Listener
	// links by peer, for Close and notices
	links []transport.Link
	shms  []*transport.ShmLink
	// grp is the group segment when every rank is on this host over shm
	// and the group has at most transport.MaxFlatRanks (transport/shm_group.go), else nil.
	grp *transport.ShmGroup
	// inCoalesced is set while the children of a Coalesced op run: they
	// take the message-based algorithms only (allreduce_flat.go).
	inCoalesced bool
	// cma is the single-copy transfers' state; cmaOff is set once one
	// failed on some rank (allgatherCMA), on every rank for the same op.
	// Both owned by the stream (the op that runs).
	cma    cmaSide
	cmaOff bool
	// slotBroadcastMin is the smallest broadcast that goes through the
	// slots in rounds (useSlotBroadcast): slotBroadcastMinFor(size),
	// which tests raise to keep the chain.
	slotBroadcastMin int
	// bcastCMA is the range of broadcast sizes that take the single copy
	// (useBroadcastCMA): broadcastCMAWindow(size), which tests move.
	bcastCMA [2]int
	// cmaGap is a range of sizes, [cmaGap[0], cmaGap[1]), in which
	// neither the broadcast nor the allgather takes the single copy
	// though it would otherwise: set by the two-rank probe (applyProbe)
	// where the single copy won at probeBytes but lost at probeMidBytes;
	// empty ({0, 0}) otherwise.
	cmaGap [2]int
	wg     sync.WaitGroup // transport helper goroutines that touch shm memory

	qmu     sync.Mutex
	queue   []task
	running bool           // an op of the stream is executing (progress or a waiter); under qmu
	parked  bool           // the progress goroutine waits on qwake; under qmu
	inline  sync.WaitGroup // waiters running an op inline (RunInline); Close waits for them
	qwake   chan struct{}  // cap 1
	// lazy is set while the queue's head is a small op launched onto an
	// idle stream without waking the parked progress goroutine, for its
	// waiter to run inline (see Launch); the next Launch, Progress or the
	// kick timer starts it otherwise. inlineRun counts the ops waiters ran
	// inline since the progress goroutine last ran one (up to lazyAfter);
	// lazyGen counts lazy launches and kickGen is lazyGen when kick was
	// armed (kickSet). Under qmu.
	lazy             bool
	inlineRun        int
	lazyGen, kickGen uint64
	kickSet          bool
	kick             *time.Timer // bounds a lazy start (lazyGrace)

	// earlyOps counts the ops whose slot Launch published (publishEarly).
	earlyOps atomic.Uint64

	fatal  fatalBox      // first fatal error (mismatch, transport, notice)
	curSeq atomic.Uint64 // seq of the collective the stream runs or ran last
	opSeq  atomic.Uint64 // seq of the collective the stream runs (seqClaimed set once claimed), or opP2P
	acks   chan struct{} // peers' acknowledgements of our notices (failure.go)
	// ending is set by Abort and Close before they name, in their notice,
	// the seq the failure starts at (claimRunningOp): an op that starts
	// after that fails with them.
	ending atomic.Bool
	// abortClaimed, if set (tests), runs in Abort between the claim of
	// the running op's seq and the notice to the peers.
	abortClaimed func()
	// aborting is claimed by the first Abort; abortDone is closed once
	// that Abort has returned. A later, concurrent Abort (the watchdog
	// relaying a peer's echo of this rank's own abort, say) waits for it
	// instead of stopping the engine with its own reason first.
	aborting  atomic.Bool
	abortDone chan struct{}
	// peerClosed[p] is set when peer p told us it destroyed the group.
	peerClosed []atomic.Pointer[error]
	stopErr    atomic.Pointer[error] // AbortedError or ErrClosed, once stopped
	stopMu     sync.Mutex
	closed     bool
	done       chan struct{} // progress goroutine exited

	scratchBuf []byte
	blocks     [][]byte // blockList's, reused by every all-gather
}

type task struct {
	op *comm.Op
	p  *comm.Promise
}

// Factory returns a comm.BackendFactory that creates CPU engines with opts.
func Factory(opts Options) comm.BackendFactory { return enginekit.Factory(New, opts) }

// New creates the engine for cfg.Rank of a group of cfg.Size and connects
// it to every peer: it publishes its address under the store keys of
// cfg.Group and cfg.Epoch, authenticates every connection with the job's
// secret, and sets up shm rings for peers on the same host (see Options).
// It blocks until all peers are connected, ctx ends or cfg.Timeout passes
// (a *comm.TransportError then names the first missing peer).
func New(ctx context.Context, cfg comm.BackendConfig, opts Options) (*Engine, error) {
	if err := opts.validate(cfg.Size); err != nil {
		return nil, err
	}
	if cfg.Size < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return nil, fmt.Errorf("%w: cpu: rank %d of group size %d", comm.ErrInvalidArgument, cfg.Rank, cfg.Size)
	}
	if cfg.Store == nil && cfg.Size > 1 && opts.Transport != TransportInmem {
		return nil, fmt.Errorf("%w: cpu: BackendConfig.Store is nil", comm.ErrInvalidArgument)
	}
	if len(cfg.GlobalRanks) != 0 && len(cfg.GlobalRanks) != cfg.Size {
		return nil, fmt.Errorf("%w: cpu: %d global ranks for group size %d", comm.ErrInvalidArgument, len(cfg.GlobalRanks), cfg.Size)
	}
	if cfg.Device >= 0 {
		return nil, fmt.Errorf("%w: cpu engine cannot use cuda:%d buffers", comm.ErrUnsupported, cfg.Device)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Minute
	}
	e := &Engine{
		cfg: cfg, opts: opts, ctl: transport.NewCtl(), qwake: make(chan struct{}, 1), done: make(chan struct{}),
		abortDone: make(chan struct{}),
		kick:      time.NewTimer(time.Hour), slotBroadcastMin: slotBroadcastMinFor(cfg.Size), cma: newCMASide(),
		bcastCMA: broadcastCMAWindow(cfg.Size),
		log:      cfg.Log.With().Str("engine", "cpu").Str("group", cfg.Group).Uint32("epoch", cfg.Epoch).Int("group_rank", cfg.Rank).Logger(),
	}
	e.kick.Stop()
	e.acks = make(chan struct{}, cfg.Size)
	e.peerClosed = make([]atomic.Pointer[error], cfg.Size)
	e.ctl.OnNotice = e.onNotice
	e.ctl.OnAck = e.onAck
	e.opSeq.Store(opP2P)
	e.ctl.Fatal = e.fatalNow
	var links []transport.Link
	var err error
	if opts.Transport == TransportInmem {
		links, err = e.connectInmem(ctx)
	} else {
		links, err = e.connect(ctx)
	}
	if err != nil {
		e.stop(fmt.Errorf("%w: cpu engine setup failed", comm.ErrClosed))
		e.release()
		return nil, err
	}
	e.links = links
	e.mesh = transport.NewMesh(cfg.Rank, cfg.Size, links, e.ctl)
	e.mesh.Grp = e.grp
	e.mesh.Fatal = e.fatalNow
	e.mesh.Cause = e.fatal.get
	e.mesh.Closed = e.peerClosedErr
	e.mesh.Late = e.lateNotice
	e.mesh.Mismatch = e.mismatch
	if err := e.tuneSingleCopy(); err != nil {
		e.stop(fmt.Errorf("%w: cpu engine setup failed", comm.ErrClosed))
		e.release()
		return nil, err
	}
	go e.progress()
	e.log.Debug().Int("size", cfg.Size).Str("transport", opts.Transport).Msg("cpu engine connected")
	return e, nil
}

// Transport names the links this engine's group uses: "shm" (every peer
// on this host), "tcp", "shm+tcp" (a multi-host group), "inmem", or "self"
// for a group of one. It labels the group's comm_init event and its byte
// metrics.
func (e *Engine) Transport() string {
	if e.opts.Transport == TransportInmem {
		return "inmem"
	}
	shm, tcp := 0, 0
	for _, l := range e.links {
		switch l.(type) {
		case *transport.ShmLink:
			shm++
		case *transport.TCPLink:
			tcp++
		}
	}
	switch {
	case shm > 0 && tcp > 0:
		return "shm+tcp"
	case shm > 0:
		return "shm"
	case tcp > 0:
		return "tcp"
	}
	return "self"
}

// Name returns "cpu".
func (e *Engine) Name() string { return "cpu" }

// Rank is this member's group rank.
func (e *Engine) Rank() int { return e.cfg.Rank }

// Size is the group size.
func (e *Engine) Size() int { return e.cfg.Size }

// Launch queues op on the engine's stream; pr completes when it ran (nil) or
// failed (*comm.MismatchError, *comm.TransportError, *comm.AbortedError,
// *comm.EngineError, or an error wrapping comm.ErrClosed).
//
// Whoever runs the stream's current op takes the next one (the progress
// loop, or an inline runner's hand-over), and a progress goroutine that is
// not parked finds it, so only a parked one on an idle stream needs a
// wake-up, and even then not for a small op (lazyStart) once the last
// lazyAfter ops were all run inline by their waiters: such a program
// calls Wait at once (AllReduce(...).Wait), and on one P (rankrunner's
// GOMAXPROCS=1) a woken progress goroutine only takes turns with the
// waiter, which cost 0.3 µs of a 1.5 µs allreduce. An op launched so is
// started in the background at the latest when another op is launched
// behind it, when its Work is waited on without running it or its Done
// channel is taken (Progress), or when the kick timer fires, lazyGrace to
// 2·lazyGrace after the launch (later if the process's Ps are all asleep:
// the Go runtime's timers then have millisecond grain). Once the progress
// goroutine runs an op, launches wake it again until waiters have run
// lazyAfter ops in a row, so a program that leaves its ops to the
// background is not delayed.
func (e *Engine) Launch(op *comm.Op, pr *comm.Promise) {
	if err := e.stopped(); err != nil {
		pr.Complete(err)
		return
	}
	pr.SetInline(e)
	e.qmu.Lock()
	if len(e.queue) == 0 && !e.running {
		e.publishEarly(op)
	}
	e.queue = append(e.queue, task{op, pr})
	wake, arm := false, false
	if e.parked && !e.running {
		if len(e.queue) == 1 && e.inlineRun >= lazyAfter && lazyStart(op) {
			e.lazy = true
			e.lazyGen++
			if !e.kickSet {
				e.kickSet, e.kickGen, arm = true, e.lazyGen, true
			}
		} else {
			e.parked, e.lazy, wake = false, false, true
		}
	}
	e.qmu.Unlock()
	if arm {
		e.kick.Reset(lazyGrace)
	}
	if wake {
		e.wake()
	}
}

// publishEarly publishes a one-step op's slot at its launch onto an idle
// stream (transport.Mesh.PublishEarly), under qmu, so that the op's peers
// see it before this rank's Wait runs the op (or the progress goroutine
// does): a rank that arrives last at a small allreduce or broadcast no
// longer makes the ranks that wait for it wait through its launch path
// as well. The op's run then starts from the published slot. Only an op
// whose run would publish exactly this first (earlyPayload) qualifies,
// and only while the engine has recorded no failure and injects no
// faults, the checks its run makes before it starts; a failure recorded
// between the two fails the op as one recorded while it runs.
func (e *Engine) publishEarly(op *comm.Op) {
	if e.grp == nil || len(e.cfg.Faults) > 0 || e.fatal.get() != nil || e.ctl.Stopped.Load() {
		return
	}
	o := opContext(op)
	if payload, ok := e.earlyPayload(op, o.Red); ok && e.mesh.PublishEarly(o, payload) {
		e.earlyOps.Add(1)
	}
}

// earlyPayload is what op's run publishes first, if it begins with a
// one-step Publish: a one-step allreduce (allReduce: its input, unless a
// PreMulSum scales it first; red is the op's reduction for its dtype,
// opContext's) or broadcast (execData: the root's buffer, nothing from
// the others). Every condition is one exec and execData test on the way
// to those algorithms.
func (e *Engine) earlyPayload(op *comm.Op, red comm.ReduceOp) ([]byte, bool) {
	if e.mesh.Size() < 2 || len(op.In) != 1 {
		return nil, false
	}
	buf := op.In[0].Bytes()
	switch op.Type {
	case comm.OpAllReduce:
		if red.Type() == comm.RedPreMulSum || !e.useFlat(len(buf)) {
			return nil, false
		}
		return buf, true
	case comm.OpBroadcast:
		if e.useBroadcastCMA(len(buf)) || !e.useFlat(len(buf)) {
			return nil, false
		}
		if e.mesh.Rank() != op.Root {
			buf = buf[:0]
		}
		return buf, true
	}
	return nil, false
}

// lazyGrace is how long a small op launched onto an idle stream may wait
// for its waiter before the progress goroutine starts it (see Launch):
// about 70 back-to-back small allreduces over shm, so that the kick timer
// costs one wake-up per 70 ops in a loop that waits on each, while an op
// nobody waits for starts within 200 µs.
const lazyGrace = 100 * time.Microsecond

// lazyAfter is how many ops in a row waiters must have run inline before
// Launch leaves a small op to its waiter.
const lazyAfter = 8

// lazyMaxBytes is the largest op, in bytes (inputs and outputs), whose
// start Launch may leave to its waiter; a larger one (a DDP bucket) wakes
// the progress goroutine at once, for its transfer to overlap with the
// caller's compute.
const lazyMaxBytes = 64 << 10

// lazyStart reports whether op is small enough for a lazy start.
func lazyStart(op *comm.Op) bool {
	if op.Type == comm.OpCoalesced {
		return false
	}
	n := 0
	for _, b := range op.In {
		n += b.NumBytes()
	}
	for _, b := range op.Out {
		n += b.NumBytes()
	}
	return n <= lazyMaxBytes
}

// Progress implements comm.InlineStream: w's waiter will not run it, so a
// head launched lazily is started now.
func (e *Engine) Progress(*comm.Work) {
	e.qmu.Lock()
	wake := e.lazy && e.parked && !e.running
	if wake {
		e.parked, e.lazy = false, false
	}
	e.qmu.Unlock()
	if wake {
		e.wake()
	}
}

// wake wakes the progress goroutine (a token that it is parked, or about
// to park, on).
func (e *Engine) wake() {
	select {
	case e.qwake <- struct{}{}:
	default:
	}
}

// RunInline implements comm.InlineStream: if w's op is next on the stream
// and the stream is idle, the calling goroutine (the Work's waiter) takes
// it off the queue and runs it, instead of handing it to the progress
// goroutine and being woken up afterwards; it reports whether it did (w
// is then complete). Launch order is kept: only the queue's head runs, and
// never beside another op of the stream. The op is run exactly as the
// progress goroutine runs it (run, the same error mapping, Complete).
func (e *Engine) RunInline(w *comm.Work) bool {
	e.qmu.Lock()
	if e.running || len(e.queue) == 0 || e.queue[0].p.Work() != w || e.ctl.Stopped.Load() {
		e.qmu.Unlock()
		return false
	}
	t := e.pop()
	e.running = true
	e.inlineRun = min(e.inlineRun+1, lazyAfter)
	e.inline.Add(1)
	e.qmu.Unlock()
	defer e.inline.Done()
	t.p.Complete(e.run(t.op, t.p))
	e.qmu.Lock()
	e.running = false
	wake := len(e.queue) > 0 && e.parked // the ops launched meanwhile go on in the background
	if wake {
		e.parked = false
	}
	e.qmu.Unlock()
	if wake {
		e.wake()
	}
	return true
}

// pop takes the queue's head (under qmu). It shifts rather than reslices,
// so that the queue's array is reused and a steady launch rate allocates
// nothing.
func (e *Engine) pop() task {
	e.lazy = false
	t := e.queue[0]
	k := copy(e.queue, e.queue[1:])
	e.queue[k] = task{}
	e.queue = e.queue[:k]
	return t
}

// Abort fails every queued and in-flight op, and every later one, with a
// *comm.AbortedError carrying reason (wrapping comm.ErrAborted). Before it
// closes the connections it tells every peer (which then fail their ops
// from now on with a *comm.RemoteAbortError naming the rank where the
// failure started: this one, or the origin reason names) and waits up to
// 200 ms until the live peers have recorded it, so that no op a peer
// starts after Abort returned can use data this rank sent before. It then
// raises the stop flag shm waits poll, so blocked ops return within
// milliseconds. Idempotent; safe from any goroutine (ncclCommAbort): the
// first call's reason is the one the ops fail with, and a concurrent
// later call returns once the first has.
func (e *Engine) Abort(reason error) {
	if e.stopped() != nil {
		return
	}
	if !e.aborting.CompareAndSwap(false, true) {
		<-e.abortDone
		return
	}
	defer close(e.abortDone)
	e.ctl.Aborting.Store(true)
	e.ending.Store(true)
	e.claimRunningOp()
	if e.abortClaimed != nil {
		e.abortClaimed()
	}
	if e.mesh != nil {
		why := reason
		if f := e.fatal.get(); f != nil {
			why = f // tell the peers what broke the communicator first
		}
		if why == nil {
			why = errors.New("aborted")
		}
		n := e.noticeFor(noticeAbort, why)
		// A relayed remote abort needs no acknowledgement: its origin
		// waited for them already.
		var ra *comm.RemoteAbortError
		n.Ack = !errors.As(why, &ra)
		if payload, missing := e.tell(n); missing > 0 {
			e.storeNotice(payload)
		}
	}
	if e.stop(&comm.AbortedError{Group: e.cfg.Group, Reason: reason}) {
		e.log.Warn().AnErr("reason", reason).Msg("cpu engine aborted")
	}
}

// AsyncError is the first error that broke the communicator (a mismatch, a
// dead peer, a peer's mismatch notice), or nil.
func (e *Engine) AsyncError() error { return e.fatal.get() }

// Close stops the engine (in-flight and queued ops fail with an error
// wrapping comm.ErrClosed), waits for its goroutines and releases sockets
// and shared memory. Idempotent.
func (e *Engine) Close() error {
	if e.mesh != nil && e.stopped() == nil {
		e.ending.Store(true)
		e.claimRunningOp()
		// Peers that still wait for this rank learn that it closed the
		// group, rather than reading an EOF (failure.go).
		n := failNotice{Kind: noticeClosed, Origin: e.globalRank(e.cfg.Rank), Seq: e.failingSeq(),
			Reason: fmt.Sprintf("rank %d destroyed process group %q (epoch %d)", e.globalRank(e.cfg.Rank), e.cfg.Group, e.cfg.Epoch)}
		if err := e.fatal.get(); err != nil {
			// The communicator broke before this rank closed it (a peer's
			// notice, say): pass the failure on with its origin and seq,
			// so that a peer that hears of it from this rank first blames
			// the rank where it started, not this one.
			n = e.noticeFor(noticeAbort, err)
		}
		e.tell(n)
	}
	e.stop(fmt.Errorf("%w: cpu engine of group %q closed", comm.ErrClosed, e.cfg.Group))
	// A waiter that claimed an op before the stop flag (RunInline checks it
	// under qmu) still runs it: wait for it before unmapping.
	e.qmu.Lock()
	e.qmu.Unlock() //nolint:staticcheck // a barrier: later claims see the stop flag
	e.inline.Wait()
	e.stopMu.Lock()
	defer e.stopMu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	if e.mesh != nil {
		<-e.done
	}
	e.release()
	return nil
}

// stop records err as the stop error, wakes every wait and closes the
// connections; it reports whether this call stopped the engine.
func (e *Engine) stop(err error) bool {
	if !e.stopErr.CompareAndSwap(nil, &err) {
		return false
	}
	e.ctl.Halt()
	if e.ln != nil {
		_ = e.ln.Close()
	}
	for _, l := range e.links {
		if l != nil {
			l.Close()
		}
	}
	return true
}

// release unmaps shared memory once no goroutine can touch it.
func (e *Engine) release() {
	e.wg.Wait()
	for _, s := range e.shms {
		s.Unmap()
	}
	if e.grp != nil {
		e.grp.Unmap()
	}
}

func (e *Engine) stopped() error {
	if p := e.stopErr.Load(); p != nil {
		return *p
	}
	return nil
}

// queueSpin is how many times the progress goroutine re-checks an empty
// queue (yielding in between) after it ran an op, before it parks: a
// back-to-back launch of async ops then skips a goroutine wake-up, which
// dominates small-op latency over shm. It does not spin when a waiter has
// claimed the stream (RunInline): the waiter hands over when it is done,
// and a spinning progress goroutine would only take turns with it on a
// single P (rankrunner's GOMAXPROCS=1).
const queueSpin = 50

// next blocks for the next queued task; ok is false once stopped. spin
// says whether to re-check an empty queue for a while before parking
// (after the progress goroutine ran an op itself).
func (e *Engine) next(spin bool) (task, bool) {
	for i := 0; ; i++ {
		e.qmu.Lock()
		e.parked = false
		if len(e.queue) > 0 && !e.running {
			e.inlineRun = 0
			t := e.pop()
			e.running = true
			e.qmu.Unlock()
			return t, true
		}
		if e.ctl.Stopped.Load() {
			e.qmu.Unlock()
			return task{}, false
		}
		if spin && !e.running && i < queueSpin && e.mesh.Spin {
			e.qmu.Unlock()
			runtime.Gosched()
			continue
		}
		e.parked = true
		e.qmu.Unlock()
		e.park()
		spin = false // woken: take what is there, or park again
	}
}

// park blocks until a wake-up, the stop or the kick timer; a kick that
// finds a lazy head launched after it was armed leaves that op to its
// waiter a while longer (re-arming) and goes on waiting.
func (e *Engine) park() {
	for {
		select {
		case <-e.qwake:
			return
		case <-e.ctl.Stop:
			return
		case <-e.kick.C:
			e.qmu.Lock()
			e.kickSet = false
			rearm := e.lazy && !e.running && e.lazyGen != e.kickGen
			if rearm {
				e.kickSet, e.kickGen = true, e.lazyGen
			}
			e.qmu.Unlock()
			if !rearm {
				return // the head waited a full lazyGrace: take it
			}
			e.kick.Reset(lazyGrace)
		}
	}
}

// progress is the engine's stream: it runs queued ops one at a time.
func (e *Engine) progress() {
	defer close(e.done)
	defer e.kick.Stop()
	ran := false
	for {
		t, ok := e.next(ran)
		if !ok {
			// Fail whatever raced in after the stop.
			e.qmu.Lock()
			q := e.queue
			e.queue = nil
			e.qmu.Unlock()
			for _, t := range q {
				t.p.Complete(e.stopped())
			}
			return
		}
		t.p.Complete(e.run(t.op, t.p))
		ran = true
		e.qmu.Lock()
		e.running = false
		e.qmu.Unlock()
	}
}

// run executes one task and maps internal errors to the engine's typed ones.
func (e *Engine) run(op *comm.Op, pr *comm.Promise) error {
	if err := e.stopped(); err != nil {
		return err
	}
	seq := opP2P
	if !comm.UsesP2PSeq(op) {
		seq = op.FP.Seq
	}
	if err := e.fatal.forSeq(seq); err != nil {
		return err
	}
	if seq != opP2P {
		e.curSeq.Store(seq)
	}
	e.opSeq.Store(seq)
	defer e.clearOpSeq()
	if e.ending.Load() {
		// This rank's Abort or Close began: its notice names this op or
		// an earlier one (claimRunningOp), so the op fails with it.
		return e.endingErr()
	}
	if len(e.cfg.Faults) > 0 {
		if err := e.injectFault(op); err != nil {
			if errors.Is(err, comm.ErrEngine) {
				e.broke(err)
			}
			return err
		}
	}
	pr.MarkStarted()
	err := e.execSafe(op, pr)
	if err == nil {
		// An abort is final: an op that ends after a peer's abort notice
		// (or our own failure) arrived does not succeed, even if it got
		// every byte it needed.
		if f := e.fatal.forSeq(seq); f != nil {
			return f
		}
		if seq != opP2P && !e.opSeq.CompareAndSwap(seq, opP2P) {
			// This rank's Abort or Close named this op in its notice
			// (claimRunningOp) before it ended: the peers fail it, and
			// so does this rank, whose abort reached it first.
			return e.endingErr()
		}
		if s := e.stopped(); s != nil {
			return s
		}
		return nil
	}
	if errors.Is(err, transport.ErrStopped) {
		if s := e.stopped(); s != nil {
			return s
		}
	}
	if f := e.fatal.get(); f != nil && !errors.Is(err, comm.ErrMismatch) {
		// A consequence of the failure recorded first (a peer that
		// aborted and then closed its connections): report the cause.
		return f
	}
	if errors.Is(err, comm.ErrRemoteAbort) {
		return err // a peer that destroyed the group, found when reading from it
	}
	if errors.Is(err, comm.ErrMismatch) || errors.Is(err, comm.ErrTransport) || errors.Is(err, comm.ErrEngine) {
		if e.broke(err) {
			e.log.Error().Err(err).Uint64("seq", op.FP.Seq).Msg("cpu engine: communicator broken")
		}
		if f := e.fatal.get(); f != nil {
			return f
		}
		return err
	}
	// Anything else (a kernel argument error) is a bug: report it as an
	// engine error naming the op.
	return &comm.EngineError{Engine: "cpu", Rank: e.cfg.Rank, FP: op.FP, Msg: err.Error()}
}

// fatalNow is the recorded fatal error if it concerns the op the stream
// runs (fatalBox.forSeq), for the transports' and the mesh's waits.
func (e *Engine) fatalNow() error { return e.fatal.forSeq(unclaimed(e.opSeq.Load())) }

// clearOpSeq marks that no collective runs (opSeq opP2P), unless the
// successful end of the op did (run's compare-and-swap): one atomic write
// per op, as before the claim.
func (e *Engine) clearOpSeq() {
	if e.opSeq.Load() != opP2P {
		e.opSeq.Store(opP2P)
	}
}

// endingErr is the error of an op that this rank's Abort or Close (which
// set e.ending) fails: their stop error, once they have told the peers
// and stopped the engine (bounded by abortAckWait).
func (e *Engine) endingErr() error {
	<-e.ctl.Stop
	return e.stopped()
}

// execSafe executes op and flushes its sends. A panic (a bug, or buffers
// that do not match the op's counts) becomes an *comm.EngineError instead
// of taking the process down; the communicator is then broken.
func (e *Engine) execSafe(op *comm.Op, pr *comm.Promise) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &comm.EngineError{Engine: "cpu", Rank: e.cfg.Rank, FP: op.FP, Msg: fmt.Sprintf("internal error: %v", p)}
		}
	}()
	if op.Type == comm.OpCoalesced {
		err = e.execCoalesced(op, pr)
	} else {
		err = e.exec(op, pr)
	}
	if err == nil {
		err = e.mesh.Flush()
	}
	return err
}

// globalRank maps a group rank to the job's global rank.
func (e *Engine) globalRank(r int) int { return enginekit.GlobalRank(&e.cfg, r) }

// injectFault honours cfg.Faults (RANKTREE_FAULT) for this rank and op
// (enginekit.InjectFault); a hang waits for the engine to stop.
func (e *Engine) injectFault(op *comm.Op) error {
	hang, err := enginekit.InjectFault(&e.cfg, "cpu", op, &e.log)
	if hang {
		<-e.ctl.Stop
		return e.stopped()
	}
	return err
}

// mismatch records that peer sent got while this rank runs the current op
// (detail, if not empty, says what differs beyond the fingerprints), tells
// every peer (so that each fails too, not only this one) and returns the
// *comm.MismatchError, or the failure recorded before it.
func (e *Engine) mismatch(peer int, got transport.Header, detail string) error {
	err := &comm.MismatchError{LocalRank: e.cfg.Rank, RemoteRank: peer, Local: e.mesh.Cur.FP, Remote: got.FP, Detail: detail}
	if e.broke(err) {
		e.log.Error().Err(err).Msg("cpu engine: collective mismatch")
		return err
	}
	return e.fatal.get()
}
