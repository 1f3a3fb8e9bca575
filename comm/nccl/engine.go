package nccl

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cuda"
	"github.com/ranktree/ranktree/comm/internal/enginekit"
)

// Engine is the NCCL collective engine for one communicator (one process
// group on one CUDA device): a comm.Backend with the behaviour of c10d's
// ProcessGroupNCCL. One launch goroutine, locked to its OS thread with the
// device's primary context current, owns the CUDA stream, the events and
// every NCCL call except Abort and AsyncError; it launches ops in Launch
// order and completes each Work when its end event's query says so.
type Engine struct {
	cfg  comm.BackendConfig
	opts Options
	log  zerolog.Logger
	cu   *cuda.Lib
	nc   *Lib

	reqs    chan request
	quit    chan struct{} // closed by Close
	abortCh chan struct{} // closed by the first Abort or Close
	done    chan struct{} // launch goroutine exited
	life    context.Context
	cancel  context.CancelFunc

	stopErr   atomic.Pointer[error] // *comm.AbortedError or ErrClosed, once stopped
	asyncErr  atomic.Pointer[error] // first async engine error
	stopOnce  sync.Once
	closeOnce sync.Once

	mu    sync.Mutex // guards comms and live
	comms map[commKey]*communicator
	live  map[*comm.Promise]struct{}

	info atomic.Pointer[DeviceInfo] // set once bound

	// owned by the launch goroutine
	dev     cuda.Device
	ctx     cuda.Context
	uidSeq  int
	evPool  []cuda.Event
	initErr error
}

type request struct {
	op *comm.Op
	pr *comm.Promise
}

// pending is a launched op: its Work completes when ev completes. op stays
// referenced (and with it the caller's buffers) until then.
type pending struct {
	pr   *comm.Promise
	op   *comm.Op
	ev   cuda.Event
	c    *communicator
	hung bool // injected hang fault: never launched, ends at Abort
}

// Factory returns a comm.BackendFactory that creates NCCL engines with opts.
func Factory(opts Options) comm.BackendFactory { return enginekit.Factory(New, opts) }

// New loads libcuda and libnccl (see cuda.Load and Load), starts the
// launch goroutine on cfg.Device and, with opts.EagerInit, creates the
// communicator before returning. Errors: comm.ErrInvalidArgument for a bad
// cfg (cfg.Device < 0, no Store for a group of several ranks);
// comm.ErrUnsupported (via cuda.ErrNoLibrary) where CUDA or NCCL cannot be
// loaded; *cuda.Error / *Error for driver or NCCL failures; an
// *InitTimeoutError when eager init passes its deadline; ctx's error.
func New(ctx context.Context, cfg comm.BackendConfig, opts Options) (*Engine, error) {
	if cfg.Size < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return nil, fmt.Errorf("%w: nccl: rank %d of group size %d", comm.ErrInvalidArgument, cfg.Rank, cfg.Size)
	}
	if cfg.Device < 0 {
		return nil, fmt.Errorf("%w: nccl engine needs a CUDA device, got device %d (host): use the cpu engine", comm.ErrInvalidArgument, cfg.Device)
	}
	if cfg.Store == nil && cfg.Size > 1 {
		return nil, fmt.Errorf("%w: nccl: BackendConfig.Store is nil for a group of %d ranks", comm.ErrInvalidArgument, cfg.Size)
	}
	if len(cfg.GlobalRanks) != 0 && len(cfg.GlobalRanks) != cfg.Size {
		return nil, fmt.Errorf("%w: nccl: %d global ranks for group size %d", comm.ErrInvalidArgument, len(cfg.GlobalRanks), cfg.Size)
	}
	if err := opts.validate(cfg); err != nil {
		return nil, err
	}
	cu, err := cuda.Load()
	if err != nil {
		return nil, err
	}
	nc, err := Load()
	if err != nil {
		return nil, err
	}
	life, cancel := context.WithCancel(context.Background())
	e := &Engine{
		cfg: cfg, opts: opts, cu: cu, nc: nc,
		reqs: make(chan request, 1024), quit: make(chan struct{}), abortCh: make(chan struct{}), done: make(chan struct{}),
		life: life, cancel: cancel,
		comms: make(map[commKey]*communicator), live: make(map[*comm.Promise]struct{}),
		log: cfg.Log.With().Str("engine", "nccl").Str("group", cfg.Group).Uint32("epoch", cfg.Epoch).
			Int("group_rank", cfg.Rank).Int("device", cfg.Device).Logger(),
	}
	ready := make(chan error, 1)
	go e.loop(ctx, ready)
	select {
	case err = <-ready:
	case <-ctx.Done():
		e.Abort(ctx.Err())
		_ = e.Close()
		return nil, ctx.Err()
	}
	if err != nil {
		_ = e.Close()
		return nil, err
	}
	e.log.Debug().Int("size", cfg.Size).Str("nccl", VersionString(nc.Version())).Bool("eager", opts.EagerInit).Msg("nccl engine started")
	return e, nil
}

// Name returns "nccl".
func (e *Engine) Name() string { return "nccl" }

// Rank is this member's group rank.
func (e *Engine) Rank() int { return e.cfg.Rank }

// Size is the group size.
func (e *Engine) Size() int { return e.cfg.Size }

// Launch hands op to the launch goroutine and returns. Buffers must be
// device buffers on the engine's device (comm.DeviceBuffer); the op is
// ordered after work already queued on each buffer's stream. pr completes
// once the op's end event completes, or fails with *comm.EngineError
// (NCCL error or async error), *comm.AbortedError, an error wrapping
// comm.ErrClosed, comm.ErrUnsupported (host buffers, bitwise reductions,
// AnySource receives) or an *InitTimeoutError (lazy init).
func (e *Engine) Launch(op *comm.Op, pr *comm.Promise) {
	pr.SetSpinWait(e.opts.SpinWait)
	// Checked under mu: stop stores the stop error before it snapshots
	// live, so w is either refused here or failed by stop.
	e.mu.Lock()
	if err := e.stopped(); err != nil {
		e.mu.Unlock()
		pr.Complete(err)
		return
	}
	e.live[pr] = struct{}{}
	e.mu.Unlock()
	select {
	case e.reqs <- request{op, pr}:
	case <-e.abortCh:
		e.finish(pr, e.stopped())
	}
}

// Abort fails every in-flight and later op with a *comm.AbortedError
// carrying reason and calls ncclCommAbort on the engine's communicators
// (also one still initializing). It waits for ncclCommAbort at most
// Options.AbortTimeout (then AsyncError reports the communicator left
// aborting), not for the GPU's work, and is idempotent; Close must still
// be called.
func (e *Engine) Abort(reason error) {
	e.stop(&comm.AbortedError{Group: e.cfg.Group, Reason: reason})
	e.log.Warn().AnErr("reason", reason).Msg("nccl engine aborted")
}

// stop records err as the stop reason (first call only), aborts the
// communicators and fails every live Work.
func (e *Engine) stop(err error) {
	e.stopOnce.Do(func() {
		e.stopErr.Store(&err)
		close(e.abortCh)
		e.cancel()
	})
	e.mu.Lock()
	cs := make([]*communicator, 0, len(e.comms))
	for _, c := range e.comms {
		cs = append(cs, c)
	}
	ws := make([]*comm.Promise, 0, len(e.live))
	for pr := range e.live {
		// Held until failed below: a live op that finish completes
		// meanwhile must not have its block reused (comm.Blocking) under
		// this Complete. A live op is still held by its completion.
		pr.Retain()
		ws = append(ws, pr)
	}
	clear(e.live)
	e.mu.Unlock()
	if errors.Is(*e.stopErr.Load(), comm.ErrAborted) {
		e.abortComms(cs)
	}
	stopErr := *e.stopErr.Load()
	for _, pr := range ws {
		pr.Complete(stopErr)
		pr.Release()
	}
}

// abortComms calls ncclCommAbort on cs and waits for it at most
// Options.AbortTimeout. ncclCommAbort returns once NCCL's kernels have
// seen the abort flag, but a kernel that never started, queued behind a
// caller's stream that does not move (a cuStreamWaitValue32 never
// released, a caller's kernel that never ends), keeps it blocked, and
// with it any CUDA call that waits for the device (seen on an H200, NCCL
// 2.28.3; docs/gpu-verification.md). Past the bound the aborts go on in
// the background, the engine's Works fail anyway, and AsyncError reports
// the wedged communicator so that the caller restarts the process (c10d's
// heartbeat monitor kills it in this state).
func (e *Engine) abortComms(cs []*communicator) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, c := range cs {
			c.abort(e.nc)
		}
	}()
	t := time.NewTimer(e.opts.AbortTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		var err error = &comm.EngineError{Engine: "nccl", Rank: e.cfg.Rank,
			Msg: fmt.Sprintf("ncclCommAbort on group %q did not return within %v (a stream ahead of NCCL's kernel does not move): the communicator is left aborting in the background and the GPU may stay wedged; restart the process", e.cfg.Group, e.opts.AbortTimeout)}
		e.asyncErr.CompareAndSwap(nil, &err)
		e.log.Error().Err(err).Dur("abort_timeout", e.opts.AbortTimeout).Msg("nccl abort did not return")
	}
}

// stopped is the stop error once Abort or Close was called, else nil.
func (e *Engine) stopped() error {
	if p := e.stopErr.Load(); p != nil {
		return *p
	}
	return nil
}

// AsyncError is the first asynchronous error of the engine's
// communicators (ncclCommGetAsyncError, with ncclGetLastError's text) as a
// *comm.EngineError, or nil. The watchdog polls it; the launch goroutine
// also polls it while ops are in flight and, on an error, fails them with
// it and aborts the engine (c10d's watchdog does the same).
func (e *Engine) AsyncError() error {
	if p := e.asyncErr.Load(); p != nil {
		return *p
	}
	e.mu.Lock()
	cs := make([]*communicator, 0, len(e.comms))
	for _, c := range e.comms {
		cs = append(cs, c)
	}
	e.mu.Unlock()
	for _, c := range cs {
		if msg := c.asyncError(e.nc); msg != "" {
			err := error(&comm.EngineError{Engine: "nccl", Rank: e.cfg.Rank, Msg: msg})
			if e.asyncErr.CompareAndSwap(nil, &err) {
				e.log.Error().Str("error", msg).Msg("nccl async error")
			}
			return *e.asyncErr.Load()
		}
	}
	return nil
}

// Close stops the launch goroutine, fails in-flight ops with an error
// wrapping comm.ErrClosed, finalizes and destroys the communicators
// (ncclCommFinalize, then ncclCommDestroy; ncclCommAbort if ops were still
// in flight, after Abort, or past Options.FinalizeTimeout) and releases the
// stream, events and primary context. Idempotent.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		e.stop(fmt.Errorf("%w: nccl engine for group %q closed", comm.ErrClosed, e.cfg.Group))
		close(e.quit)
	})
	select {
	case <-e.done:
		return nil
	case <-time.After(e.opts.FinalizeTimeout + 10*time.Second):
		return &comm.EngineError{Engine: "nccl", Rank: e.cfg.Rank, Msg: "launch goroutine did not exit within the finalize timeout (a CUDA or NCCL call is blocked)"}
	}
}

// finish completes pr with err and forgets it.
func (e *Engine) finish(pr *comm.Promise, err error) {
	e.mu.Lock()
	delete(e.live, pr)
	e.mu.Unlock()
	pr.Complete(err)
}

// loop is the launch goroutine.
func (e *Engine) loop(ctx context.Context, ready chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread dies with the goroutine, and its CUDA state with it
	defer close(e.done)
	err := e.bind()
	if err == nil && e.opts.EagerInit {
		ictx, cancel := context.WithCancel(e.life)
		stopWatch := context.AfterFunc(ctx, cancel)
		_, err = e.getComm(ictx)
		stopWatch()
		cancel()
	}
	ready <- err
	if err != nil {
		e.teardown(nil)
		return
	}
	var inflight []*pending
	var spinUntil time.Time // busy-poll (no sleep) until then
	naps := 0               // sleeps since the last launch
	lastAsync := time.Now()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		if len(inflight) == 0 {
			// Idle: spin briefly on the queue (a locked thread that parks
			// costs an OS wake-up on the next Launch), then block.
			r, ok := e.spinRecv()
			if !ok {
				select {
				case r = <-e.reqs:
				case <-e.quit:
					e.teardown(inflight)
					return
				}
			}
			inflight = e.handle(r, inflight)
			spinUntil = time.Now().Add(e.opts.SpinPoll)
			naps = 0
			continue
		}
		select {
		case r := <-e.reqs:
			inflight = e.handle(r, inflight)
			continue
		case <-e.quit:
			e.teardown(inflight)
			return
		default:
		}
		inflight = e.poll(inflight)
		if len(inflight) == 0 {
			continue
		}
		if time.Since(lastAsync) >= e.opts.AsyncErrorInterval {
			lastAsync = time.Now()
			if err := e.AsyncError(); err != nil && e.stopped() == nil {
				msg := err.Error()
				var ee *comm.EngineError
				if errors.As(err, &ee) {
					msg = ee.Msg
				}
				// Abort first (later Launches then fail), but fail the ops in
				// flight with the engine error naming each op.
				e.mu.Lock()
				for _, p := range inflight {
					delete(e.live, p.pr)
				}
				e.mu.Unlock()
				e.Abort(err)
				for _, p := range inflight {
					p.pr.Complete(&comm.EngineError{Engine: "nccl", Rank: e.cfg.Rank, FP: p.op.FP, Msg: msg})
				}
			}
		}
		if e.stopped() == nil && time.Now().Before(spinUntil) {
			continue // busy-poll the end events
		}
		// Sleep, backing off to 20 × PollInterval for long ops and hangs.
		d := min(e.opts.PollInterval<<min(naps, 5), 20*e.opts.PollInterval)
		naps++
		if e.stopped() != nil {
			d = 10 * time.Millisecond // aborted: only reclaiming events now
		}
		timer.Reset(d)
		select {
		case r := <-e.reqs:
			timer.Stop()
			inflight = e.handle(r, inflight)
		case <-e.quit:
			timer.Stop()
			e.teardown(inflight)
			return
		case <-timer.C:
		}
	}
}

// spinRecv polls the request queue without blocking for up to
// Options.SpinIdle.
func (e *Engine) spinRecv() (request, bool) {
	if e.opts.SpinIdle <= 0 {
		return request{}, false
	}
	end := time.Now().Add(e.opts.SpinIdle)
	for i := 0; ; i++ {
		select {
		case r := <-e.reqs:
			return r, true
		default:
		}
		if i&15 == 15 && time.Now().After(end) {
			return request{}, false
		}
	}
}

// bind initializes the driver on the launch goroutine's thread and makes
// the device's primary context current there.
func (e *Engine) bind() error {
	if err := e.cu.Init(); err != nil {
		return err
	}
	d, err := e.cu.DeviceGet(e.cfg.Device)
	if err != nil {
		return err
	}
	ctx, err := e.cu.PrimaryCtxRetain(d)
	if err != nil {
		return err
	}
	e.dev, e.ctx = d, ctx
	if err := e.cu.CtxSetCurrent(ctx); err != nil {
		_ = e.cu.PrimaryCtxRelease(d)
		e.ctx = 0
		return err
	}
	info := &DeviceInfo{Ordinal: e.cfg.Device, NCCLVersion: VersionString(e.nc.Version())}
	info.Name, _ = e.cu.DeviceName(d)
	info.PCIBusID, _ = e.cu.DevicePCIBusID(d)
	if u, err := e.cu.DeviceUUID(d); err == nil {
		info.UUID = cuda.FormatUUID(u)
	}
	e.info.Store(info)
	e.log.Debug().Str("gpu", info.Name).Str("gpu_uuid", info.UUID).Str("pci_bus_id", info.PCIBusID).Msg("nccl engine bound to its GPU")
	return nil
}

// DeviceInfo identifies the engine's GPU for events and logs.
type DeviceInfo struct {
	Ordinal     int    // CUDA device ordinal (BackendConfig.Device)
	Name        string // cuDeviceGetName
	UUID        string // "GPU-…", as NVML and nvidia-smi print it
	PCIBusID    string // "0000:18:00.0"
	NCCLVersion string // e.g. "2.28.7"
}

// DeviceInfo describes the engine's GPU (name, UUID, PCI bus id) and the
// NCCL version, for events; the zero value before New returned.
func (e *Engine) DeviceInfo() DeviceInfo {
	if p := e.info.Load(); p != nil {
		return *p
	}
	return DeviceInfo{Ordinal: e.cfg.Device}
}

// handle launches one request and returns the updated in-flight list.
func (e *Engine) handle(r request, inflight []*pending) []*pending {
	if err := e.stopped(); err != nil {
		e.finish(r.pr, err)
		return inflight
	}
	r.pr.MarkStarted()
	hang, err := e.injectFault(r.op)
	if err != nil {
		e.finish(r.pr, err)
		return inflight
	}
	if hang {
		return append(inflight, &pending{pr: r.pr, op: r.op, hung: true})
	}
	if e.initErr != nil {
		e.finish(r.pr, e.initErr)
		return inflight
	}
	c, err := e.getComm(e.life)
	if err != nil {
		if s := e.stopped(); s != nil {
			err = s
		} else {
			e.initErr = err
		}
		e.finish(r.pr, err)
		return inflight
	}
	ev, err := e.launch(c, r.op)
	if err != nil {
		if s := e.stopped(); s != nil {
			err = s
		}
		e.finish(r.pr, err)
		return inflight
	}
	return append(inflight, &pending{pr: r.pr, op: r.op, ev: ev, c: c})
}

// poll completes the in-flight ops whose end events are done. Ops on one
// stream finish in order, so it stops at the first one still running.
func (e *Engine) poll(inflight []*pending) []*pending {
	n := 0
	for n < len(inflight) {
		p := inflight[n]
		if p.hung {
			if e.stopped() == nil {
				break
			}
			n++
			continue
		}
		done, err := e.cu.EventQuery(p.ev)
		if !done && err == nil {
			break
		}
		if err != nil {
			e.finish(p.pr, &comm.EngineError{Engine: "nccl", Rank: e.cfg.Rank, FP: p.op.FP, Msg: err.Error()})
		} else {
			if p.op.Type == comm.OpRecv {
				p.pr.SetSource(p.op.Peer)
			}
			e.finish(p.pr, e.stopped()) // nil unless aborted meanwhile (then already failed)
		}
		e.evPool = append(e.evPool, p.ev)
		n++
	}
	if n == 0 {
		return inflight
	}
	rest := copy(inflight, inflight[n:])
	clear(inflight[rest:])
	return inflight[:rest]
}

// teardown runs on the launch goroutine at Close (or after a failed
// start): it drops in-flight ops, ends the communicators and frees CUDA
// resources.
func (e *Engine) teardown(inflight []*pending) {
	busy := false
	for _, p := range inflight {
		if !p.hung {
			if done, _ := e.cu.EventQuery(p.ev); !done {
				busy = true
			}
			e.evPool = append(e.evPool, p.ev)
		}
	}
	e.mu.Lock()
	cs := make([]*communicator, 0, len(e.comms))
	for _, c := range e.comms {
		cs = append(cs, c)
	}
	clear(e.comms)
	e.mu.Unlock()
	for _, c := range cs {
		if busy {
			c.abort(e.nc)
		} else {
			c.finalize(e.nc, e.opts.FinalizeTimeout, e.log)
		}
		c.release(e.cu)
	}
	for _, ev := range e.evPool {
		_ = e.cu.EventDestroy(ev)
	}
	e.evPool = nil
	if e.ctx != 0 {
		_ = e.cu.PrimaryCtxRelease(e.dev)
		e.ctx = 0
	}
}

// event returns a pooled event (created with timing disabled).
func (e *Engine) event() (cuda.Event, error) {
	if n := len(e.evPool); n > 0 {
		ev := e.evPool[n-1]
		e.evPool = e.evPool[:n-1]
		return ev, nil
	}
	return e.cu.EventCreate(cuda.EventDisableTiming)
}

// globalRank maps a group rank to the job's global rank.
func (e *Engine) globalRank(r int) int { return enginekit.GlobalRank(&e.cfg, r) }
