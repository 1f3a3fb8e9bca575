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
	wg          sync.WaitGroup // transport helper goroutines that touch shm memory

	qmu     sync.Mutex
	queue   []task
	running bool           // an op of the stream is executing (progress or a waiter); under qmu
	inline  sync.WaitGroup // waiters running an op inline (RunInline); Close waits for them
	qwake   chan struct{}  // cap 1

	fatal  fatalBox      // first fatal error (mismatch, transport, notice)
	curSeq atomic.Uint64 // seq of the collective the stream runs or ran last
	opSeq  atomic.Uint64 // seq of the collective the stream runs, or opP2P
	acks   chan struct{} // peers' acknowledgements of our notices (failure.go)
	// peerClosed[p] is set when peer p told us it destroyed the group.
	peerClosed []atomic.Pointer[error]
	stopErr    atomic.Pointer[error] // AbortedError or ErrClosed, once stopped
	stopMu     sync.Mutex
	closed     bool
	done       chan struct{} // progress goroutine exited

	scratchBuf []byte
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
		log: cfg.Log.With().Str("engine", "cpu").Str("group", cfg.Group).Uint32("epoch", cfg.Epoch).Int("group_rank", cfg.Rank).Logger(),
	}
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
func (e *Engine) Launch(op *comm.Op, pr *comm.Promise) {
	if err := e.stopped(); err != nil {
		pr.Complete(err)
		return
	}
	pr.SetInline(e)
	e.qmu.Lock()
	e.queue = append(e.queue, task{op, pr})
	e.qmu.Unlock()
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
	e.inline.Add(1)
	e.qmu.Unlock()
	defer e.inline.Done()
	t.p.Complete(e.run(t.op, t.p))
	e.qmu.Lock()
	e.running = false
	more := len(e.queue) > 0
	e.qmu.Unlock()
	if more { // the progress goroutine waits for the stream to be idle
		select {
		case e.qwake <- struct{}{}:
		default:
		}
	}
	return true
}

// pop takes the queue's head (under qmu). It shifts rather than reslices,
// so that the queue's array is reused and a steady launch rate allocates
// nothing.
func (e *Engine) pop() task {
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
// milliseconds. Idempotent; safe from any goroutine (ncclCommAbort).
func (e *Engine) Abort(reason error) {
	if e.stopped() != nil {
		return
	}
	e.ctl.Aborting.Store(true)
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
		// Peers that still wait for this rank learn that it closed the
		// group, rather than reading an EOF (failure.go).
		n := failNotice{Kind: noticeClosed, Origin: e.globalRank(e.cfg.Rank), Seq: e.curSeq.Load(),
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
// queue (yielding in between) before it parks: a back-to-back launch then
// skips a goroutine wake-up, which dominates small-op latency over shm.
const queueSpin = 50

// next blocks for the next queued task; ok is false once stopped.
func (e *Engine) next() (task, bool) {
	for i := 0; ; i++ {
		e.qmu.Lock()
		if len(e.queue) > 0 && !e.running {
			t := e.pop()
			e.running = true
			e.qmu.Unlock()
			return t, true
		}
		e.qmu.Unlock()
		if e.ctl.Stopped.Load() {
			return task{}, false
		}
		if i < queueSpin && e.mesh.Spin {
			runtime.Gosched()
			continue
		}
		select {
		case <-e.qwake:
		case <-e.ctl.Stop:
		}
	}
}

// progress is the engine's stream: it runs queued ops one at a time.
func (e *Engine) progress() {
	defer close(e.done)
	for {
		t, ok := e.next()
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
	defer e.opSeq.Store(opP2P)
	if err := e.injectFault(op); err != nil {
		if errors.Is(err, comm.ErrEngine) {
			e.broke(err)
		}
		return err
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
func (e *Engine) fatalNow() error { return e.fatal.forSeq(e.opSeq.Load()) }

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
