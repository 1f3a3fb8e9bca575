// Package actors holds ranktree's protoactor-go actors: the communicator
// actor (communicator.go; one per process group × device, it owns the
// group's engine, assigns sequence numbers and launches ops in the order
// of its launch queue) and the event publisher (publisher.go; work and communicator
// events on NATS, schema in event.go).
//
// The communicator's duties towards its callers (comm.ProcessGroup):
//
//  1. Submit never blocks on communication; errors complete the Work.
//  2. Ops get sequence numbers in launch order: the collective counter, or
//     the P2P counter for Send/Recv and all-P2P batches (comm.UsesP2PSeq).
//     The launch order is the order in which Submits enter the group's
//     launch queue (launchQueue): the Submit that finds the queue idle
//     launches on its own goroutine, one op at a time, every op queued
//     meanwhile included, so a small op costs no hand-off to the actor.
//  3. The Observer sees each op after its fingerprint is complete and
//     before Backend.Launch (watchdog deadlines, flight recorder, events).
//  4. Abort goes straight to the engine; Close gives the last op
//     CloseGrace, drains the launch queue and the mailbox, stops the actor
//     and closes the engine, bounded by CloseBound and its ctx
//     (communicator_life.go).
//  5. A panic while the communicator launches an op fails that op's Work
//     with an *comm.EngineError naming the panic, then reaches the actor's
//     supervisor (CommunicatorConfig.Parent) as a *Panic, whose policy
//     decides what follows (supervisor.Root: restart or escalate): a
//     launch on a Submit's goroutine hands the panic to the actor, which
//     raises it, and from then on every launch goes through the actor's
//     mailbox, behind it. The panic is also the communicator's AsyncError,
//     which the watchdog polls (CommunicatorConfig.Supervise).
//  6. Supervision is the communicator's own: the op's deadline (op
//     timeout, or an earlier ctx deadline) goes to the Observer, a
//     cancelled ctx aborts the group and fails its in-flight ops
//     (comm.CtxWatch), with BlockingWait every Work gets its deadline, and
//     a communicator replaced by a restart (Retire) fails later ops with
//     comm.ErrAborted.
//  7. A Promise it keeps past the Submit that handed it over (an op queued
//     for another Submit or the actor to launch, the last op submitted) it
//     holds with Promise.Retain, so that a blocking op's block
//     (comm.Blocking) is not reused under it; Observers that keep p do the
//     same.
package actors

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
)

// Observer is told about every op the communicator schedules, after the
// op's sequence number and fingerprint are set and before Backend.Launch,
// one op at a time in launch order, on the goroutine that launches it (a
// Submit's, or the actor's). The watchdog (deadline registration), the
// flight recorder ("scheduled" entries) and the event publisher implement
// it. Scheduled must return quickly and must not block on the op's Work;
// it may watch p.Work().Done() from another goroutine, and complete p (the
// watchdog fails it at its deadline). c10d: the work-enqueue hooks of
// ProcessGroupNCCL (flight recorder record, watchdog work list). An
// Observer that keeps p or reads its Work after Scheduled returns must
// hold it (p.Retain(), then p.Release()): a blocking op's Promise, Work
// and Op are reused once nothing holds them.
type Observer interface {
	Scheduled(op *comm.Op, p *comm.Promise)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(op *comm.Op, p *comm.Promise)

// Scheduled calls f.
func (f ObserverFunc) Scheduled(op *comm.Op, p *comm.Promise) { f(op, p) }

// Observers fans Scheduled out to each non-nil observer, in order.
type Observers []Observer

// Scheduled calls every observer.
func (os Observers) Scheduled(op *comm.Op, p *comm.Promise) {
	for _, o := range os {
		if o != nil {
			o.Scheduled(op, p)
		}
	}
}

// CommunicatorConfig configures NewCommunicator.
type CommunicatorConfig struct {
	// Group is the process group's name (hashed into fingerprints with
	// comm.GroupHash) and Epoch its communicator epoch.
	Group string
	Epoch uint32
	// Observer, if not nil, sees every scheduled op.
	Observer Observer
	// Log is the logger, already carrying rank fields.
	Log zerolog.Logger
	// Dispatcher runs the actor's mailbox loop. nil selects protoactor's
	// synchronized dispatcher (the loop runs on the goroutine that posts
	// to an idle actor) and launches ops on the Submit's goroutine
	// through the launch queue (duty 2), with no mailbox message per op;
	// the mailbox then carries only control messages (Close's drain, a
	// panic to raise) and, after a panic, every launch. A non-nil
	// Dispatcher sends every launch through the mailbox on it, as one
	// message per op (actor.NewDefaultDispatcher(300): the loop runs on a
	// goroutine of its own, a hand-off per op).
	Dispatcher actor.Dispatcher
	// Parent spawns the actor and supervises it: a panic while the actor
	// handles an op reaches Parent's supervisor strategy (after the op's
	// Work has failed). Pass the rank's supervision root (supervisor.Root)
	// so that its policy decides; nil spawns at the actor system's root,
	// whose default strategy restarts the actor in place (at most 10 times
	// in 10 s, then stops it). If Parent also has a SpawnPrefix method
	// (actor.RootContext, actor.Context, supervisor.Root), the actor's id
	// starts with "comm-<group>-e<epoch>-".
	Parent Spawner
	// OnPanic, if not nil, is called on the actor's goroutine when it
	// panics handling an op, before that op's Work fails and before the
	// panic goes on to Parent (supervisor.Rank.ActorPanicked). It must not
	// block.
	OnPanic func(p *Panic)
	// Supervise, if not nil, puts the new communicator under supervision
	// before its actor starts and returns the Observer of its ops (it
	// replaces Observer then): supervisor.Rank.AttachGroup, given the
	// communicator itself as the engine to watch, so that the watchdog
	// sees its AsyncError (the engine's or its own panic) and aborts it.
	Supervise func(c *Communicator) Observer
	// Rank is this process's global rank, named by the *comm.TimeoutError
	// of BlockingWait.
	Rank int
	// BlockingWait gives every Work with an op timeout its deadline
	// (RANKTREE_BLOCKING_WAIT, torch's TORCH_NCCL_BLOCKING_WAIT): Wait
	// returns a *comm.TimeoutError once it has passed, whatever the
	// watchdog does.
	BlockingWait bool
	// CloseGrace is how long Close lets the last submitted op finish
	// before closing the engine under it (0: no wait). CloseBound, if
	// positive, bounds closing the actor and the engine after that: a
	// close still running then is left to finish in the background and
	// Close reports it.
	CloseGrace, CloseBound time.Duration
	// OnClosed, if not nil, runs once after Close has closed the engine
	// (the group's owner forgets the communicator and takes it off the
	// watchdog).
	OnClosed func(c *Communicator)
}

// Panic is the reason a communicator actor hands its supervisor when it
// panics while launching an op (the supervisor's HandleFailure sees it as
// reason): which communicator and op, the panic value and the stack.
type Panic struct {
	Group string
	Epoch uint32
	FP    comm.Fingerprint // the op being handled (Seq 0 if it had none yet)
	Value any              // what the code panicked with
	Stack []byte           // the panicking goroutine's stack
}

// Error describes the panic without the stack.
func (p *Panic) Error() string {
	return fmt.Sprintf("communicator actor of group %q (epoch %d) panicked handling %v: %v", p.Group, p.Epoch, p.FP, p.Value)
}

// Communicator is the communicator actor of one process group on one
// device (c10d: the ProcessGroupNCCL object with its work queue). It owns
// the group's engine and its sequence counters. ProcessGroup methods reach
// it through Submit; ops are launched one at a time in the order they
// enter its launch queue, which is the order they get sequence numbers and
// reach the engine. The actor (protoactor) is its supervised identity: it
// raises a launch's panic to the supervisor, and carries Close's drain.
//
// It implements comm.Launcher. Safe for concurrent use.
type Communicator struct {
	system  *actor.ActorSystem
	pid     *actor.PID
	backend comm.Backend
	group   string
	epoch   uint32
	cfg     CommunicatorConfig
	log     zerolog.Logger
	state   *commActor
	lq      launchQueue

	// retired is set when a restart replaces this communicator: later
	// Submits fail with it (Retire).
	retired atomic.Pointer[comm.AbortedError]
	// last is the Promise of the last op submitted, which it holds
	// (Promise.Retain) until the next Submit replaces it or Close ends:
	// Close's grace waits for it (waitLast, pinLast).
	last atomic.Pointer[comm.Promise]

	// closed and senders make Close wait for Submits already past their
	// closed check (a Dekker-style handshake on sequentially consistent
	// atomics), so no launch can start after Close drained: a Submit
	// counts as a sender until it has queued its op, or, if it found the
	// launch queue idle, until it has launched every op queued meanwhile.
	closed   atomic.Bool
	senders  atomic.Int64
	stopOnce sync.Once
	stopErr  error

	closeOnce sync.Once // CloseBy: grace, stop, OnClosed
	closeErr  error
}

// launchQueue orders a group's launches: the per-group ticket that
// replaces a mailbox message per op. The Submit that finds it idle
// (busy false) becomes its runner and launches its own op and then
// every op queued meanwhile by other Submits, in order, on its own
// goroutine; viaActor sends every launch to the actor's mailbox instead
// (a non-nil Dispatcher, or after a launch panicked).
type launchQueue struct {
	mu       sync.Mutex
	pending  []launchMsg // FIFO; the array is reused
	busy     bool
	viaActor bool
}

// launchMsg is one op to launch, with the ctx given to its ProcessGroup
// method. Through the mailbox it travels as a pooled *launchMsg: the actor
// returns one after a launch that returned normally (a panicking launch
// leaves its message to the supervisor's failure report and the GC).
//
// held says that the message holds a reference to p (Promise.Retain),
// released once the launch is done with p (after CtxWatch.Bind): an op
// queued behind the runner's, or posted to the actor, may complete, and
// a blocking op's caller release it, before its launcher is done with
// it. The runner's own op needs none: its caller waits in Submit.
type launchMsg struct {
	ctx  context.Context
	op   *comm.Op
	p    *comm.Promise
	held bool
}

var launchMsgs = sync.Pool{New: func() any { return new(launchMsg) }}

// panicMsg hands the actor the panic of a launch that ran on a Submit's
// goroutine: the actor raises it, so that it reaches its supervisor as a
// launch's panic in the actor always has.
type panicMsg struct{ p *Panic }

// stopMsg drains the mailbox: the actor closes done when it reaches it,
// after every launch posted before Close.
type stopMsg struct{ done chan struct{} }

// commActor is the communicator's launch state. Only the launch queue's
// runner, or the actor, writes it, one launch at a time; the counters are
// atomics so that LastSeq/LastP2PSeq may read them anywhere.
type commActor struct {
	backend  comm.Backend
	group    string
	hash     uint64
	epoch    uint32
	observer Observer
	onPanic  func(p *Panic)
	ctxw     *comm.CtxWatch // the launched ops' ctxs (communicator_life.go)
	log      zerolog.Logger
	seq      atomic.Uint64                    // last collective seq assigned
	p2pSeq   atomic.Uint64                    // last P2P seq assigned
	dead     atomic.Bool                      // set by a Close that timed out: fail instead of launching
	stopped  atomic.Bool                      // the actor stopped (Close, or its supervisor)
	panicErr atomic.Pointer[comm.EngineError] // the first panic's error
}

// NewCommunicator spawns the communicator actor for a connected backend in
// system, under cfg.Parent. The actor owns backend from now on: Close
// closes it. Errors: comm.ErrInvalidArgument for a nil system or backend or
// an empty Group; comm.ErrClosed if Parent has stopped (backend is then
// not closed: the caller still owns it).
func NewCommunicator(system *actor.ActorSystem, backend comm.Backend, cfg CommunicatorConfig) (*Communicator, error) {
	if system == nil || backend == nil {
		return nil, fmt.Errorf("%w: NewCommunicator needs an actor system and a backend", comm.ErrInvalidArgument)
	}
	if cfg.Group == "" {
		return nil, fmt.Errorf("%w: NewCommunicator: CommunicatorConfig.Group is empty", comm.ErrInvalidArgument)
	}
	log := cfg.Log.With().Str("group", cfg.Group).Uint32("epoch", cfg.Epoch).Logger()
	st := &commActor{
		backend:  backend,
		group:    cfg.Group,
		hash:     comm.GroupHash(cfg.Group),
		epoch:    cfg.Epoch,
		observer: cfg.Observer,
		onPanic:  cfg.OnPanic,
		log:      log,
	}
	// The producer returns the same state on a restart, so a supervisor
	// restart never resets the sequence counters.
	disp := cfg.Dispatcher
	if disp == nil {
		disp = actor.NewSynchronizedDispatcher(300)
	}
	c := &Communicator{system: system, backend: backend, group: cfg.Group, epoch: cfg.Epoch, cfg: cfg, log: log, state: st}
	c.lq.viaActor = cfg.Dispatcher != nil
	st.ctxw = comm.NewCtxWatch(c.ctxDone)
	if cfg.Supervise != nil {
		st.observer = cfg.Supervise(c)
	}
	c.pid = SpawnUnder(system, cfg.Parent, PersistentProps(st, actor.WithDispatcher(disp)),
		fmt.Sprintf("comm-%s-e%d-", cfg.Group, cfg.Epoch))
	if c.pid == nil {
		return nil, fmt.Errorf("%w: NewCommunicator: the parent of group %q (epoch %d) could not spawn its actor (stopped?)", comm.ErrClosed, cfg.Group, cfg.Epoch)
	}
	return c, nil
}

// Submit launches op (comm.Launcher): on the calling goroutine if the
// group's launch queue is idle, else after the ops queued before it, on
// the goroutine launching those (or through the actor's mailbox, see
// CommunicatorConfig.Dispatcher). After Close, or once the actor's
// supervisor has stopped it, p fails with comm.ErrClosed; once Retire was
// called, with the retirement's *comm.AbortedError. The communicator owns
// the op's deadline: op.Timeout, or ctx's deadline if that is earlier, and
// a cancelled ctx aborts it and fails p with a *comm.CanceledError
// (applyContext, ctxDone); with BlockingWait, p's Work gets that deadline
// too. ctx may be nil (no bound but the timeout).
func (c *Communicator) Submit(ctx context.Context, op *comm.Op, p *comm.Promise) {
	if e := c.retired.Load(); e != nil {
		p.Complete(e)
		return
	}
	c.applyContext(ctx, op, p)
	if c.cfg.BlockingWait && op.Timeout > 0 {
		c.setDeadline(op, p)
	}
	p.Retain() // c.last's reference
	if old := c.last.Swap(p); old != nil {
		old.Release()
	}
	c.senders.Add(1)
	if c.closed.Load() {
		c.senders.Add(-1)
		p.Complete(fmt.Errorf("%w: communicator of group %q is closed (%v)", comm.ErrClosed, c.group, op.Type))
		return
	}
	if c.state.stopped.Load() {
		c.senders.Add(-1)
		p.Complete(fmt.Errorf("%w: the communicator actor of group %q was stopped by its supervisor (%v)", comm.ErrClosed, c.group, op.Type))
		return
	}
	c.enqueue(launchMsg{ctx: ctx, op: op, p: p})
	c.senders.Add(-1)
}

// enqueue takes m into the launch queue: it launches m and whatever is
// queued meanwhile if the queue is idle, queues m behind the runner
// otherwise, or posts it to the actor.
func (c *Communicator) enqueue(m launchMsg) {
	q := &c.lq
	q.mu.Lock()
	switch {
	case q.viaActor:
		q.mu.Unlock()
		m.held = m.p.Retain()
		c.post(m)
		return
	case q.busy:
		m.held = m.p.Retain()
		q.pending = append(q.pending, m)
		q.mu.Unlock()
		return
	}
	q.busy = true
	q.mu.Unlock()
	for {
		if pan := c.state.launch(m.op, m.p); pan != nil {
			c.handOver(pan)
			return
		}
		c.state.ctxw.Bind(m.ctx, m.p)
		if m.held {
			m.p.Release()
		}
		q.mu.Lock()
		if len(q.pending) == 0 {
			q.busy = false
			q.mu.Unlock()
			return
		}
		m = q.pending[0]
		k := copy(q.pending, q.pending[1:])
		q.pending[k] = launchMsg{}
		q.pending = q.pending[:k]
		q.mu.Unlock()
	}
}

// post sends m to the actor's mailbox as a pooled message.
func (c *Communicator) post(m launchMsg) {
	pm := launchMsgs.Get().(*launchMsg)
	*pm = m
	c.system.Root.Send(c.pid, pm)
}

// handOver gives the actor a launch's panic (duty 5) and makes the
// mailbox the launch path from now on: the panic, then the ops queued
// behind the panicking one, then every later Submit's, in order (the
// queue's lock is held until they are posted, so no later op overtakes
// them).
func (c *Communicator) handOver(pan *Panic) {
	q := &c.lq
	q.mu.Lock()
	defer q.mu.Unlock()
	q.viaActor, q.busy = true, false
	c.system.Root.Send(c.pid, &panicMsg{p: pan})
	for i, m := range q.pending {
		c.post(m)
		q.pending[i] = launchMsg{}
	}
	q.pending = nil
}

// Abort aborts the engine: in-flight and later ops fail with an error
// wrapping comm.ErrAborted and reason (comm.Launcher). Called directly, not
// through the launch queue, so it is not stuck behind queued launches.
func (c *Communicator) Abort(reason error) {
	c.log.Warn().AnErr("reason", reason).Msg("aborting communicator")
	c.backend.Abort(reason)
}

// Close gives the last submitted op CloseGrace to finish, then stops
// accepting ops, launches every op already queued (launch queue, mailbox),
// stops the actor and closes the backend (whose in-flight ops fail with
// ErrClosed), within CloseBound, and runs OnClosed. If ctx ends first the
// engine is aborted and closed anyway and ctx's error is returned.
// Idempotent: later calls return the first result (comm.Launcher;
// ProcessGroup.Destroy).
func (c *Communicator) Close(ctx context.Context) error {
	return c.CloseBy(ctx, time.Now().Add(c.cfg.CloseGrace))
}

// stop is Close after the grace period: drain the launch queue and the
// mailbox, stop the actor, stop watching the ops' ctxs, close the engine.
func (c *Communicator) stop(ctx context.Context) error {
	c.stopOnce.Do(func() {
		c.closed.Store(true)
		waitErr := c.drain(ctx)
		if waitErr != nil {
			// The actor is stuck in Launch. Ops still queued behind it
			// fail with ErrClosed once it returns; the actor is left to
			// finish that rather than stopped under it.
			c.state.dead.Store(true)
			c.backend.Abort(waitErr)
		} else {
			c.system.Root.Stop(c.pid)
		}
		c.state.ctxw.Close()
		c.stopErr = errors.Join(waitErr, c.backend.Close())
		c.log.Debug().Uint64("seq", c.state.seq.Load()).Uint64("p2p_seq", c.state.p2pSeq.Load()).Msg("communicator closed")
	})
	return c.stopErr
}

// drain waits until no Submit is in progress (a Submit that runs the
// launch queue counts until the queue is empty) and the actor has handled
// every message posted before the stop message, or ctx ends.
func (c *Communicator) drain(ctx context.Context) error {
	for c.senders.Load() > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("closing the communicator of group %q: a Submit is still in progress: %w", c.group, ctx.Err())
		case <-time.After(50 * time.Microsecond):
		}
	}
	if c.state.stopped.Load() {
		return nil // stopped by its supervisor: nothing will drain
	}
	done := make(chan struct{})
	c.system.Root.Send(c.pid, &stopMsg{done: done})
	// The supervisor may stop the actor meanwhile (the stop message then
	// goes to dead letters): look at stopped now and then.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return nil
		case <-tick.C:
			if c.state.stopped.Load() {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("closing the communicator of group %q: mailbox not drained: %w", c.group, ctx.Err())
		}
	}
}

// Backend is the engine the actor owns.
func (c *Communicator) Backend() comm.Backend { return c.backend }

// PID is the actor's process id in its actor system.
func (c *Communicator) PID() *actor.PID { return c.pid }

// LastSeq is the last collective sequence number assigned (0: none yet).
func (c *Communicator) LastSeq() uint64 { return c.state.seq.Load() }

// LastP2PSeq is the last P2P sequence number assigned (0: none yet).
func (c *Communicator) LastP2PSeq() uint64 { return c.state.p2pSeq.Load() }

// AsyncError is the communicator's asynchronous error
// (supervisor.AsyncErrorSource, polled by the watchdog): its engine's
// (comm.Backend.AsyncError), or else the actor's first panic (PanicErr), so
// that a panic breaks the group — abort, abort/<comm-id> for the peers,
// dump — even if the panicking op was never put under the watchdog.
func (c *Communicator) AsyncError() error {
	if err := c.backend.AsyncError(); err != nil {
		return err
	}
	return c.PanicErr()
}

// PanicErr is the *comm.EngineError of the first panic the actor met while
// handling an op, or nil; AsyncError reports it to the watchdog.
func (c *Communicator) PanicErr() error {
	if e := c.state.panicErr.Load(); e != nil {
		return e
	}
	return nil
}

// Stopped reports whether the actor has stopped (after Close, or when its
// supervisor stopped it).
func (c *Communicator) Stopped() bool { return c.state.stopped.Load() }

// Receive handles the actor's messages.
func (a *commActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *launchMsg:
		if pan := a.launch(m.op, m.p); pan != nil {
			panic(pan) // to the actor's supervisor (duty 5)
		}
		a.ctxw.Bind(m.ctx, m.p)
		if m.held {
			m.p.Release()
		}
		*m = launchMsg{}
		launchMsgs.Put(m)
	case *panicMsg:
		panic(m.p) // a launch's panic on a Submit's goroutine (handOver)
	case *stopMsg:
		close(m.done)
	case *actor.Stopped:
		a.stopped.Store(true)
	}
}

// launch assigns the sequence number, completes the fingerprint, tells the
// observer and launches on the engine. A panic on the way (engine or
// observer) fails the op's Work with an *EngineError naming it and is
// returned as a *Panic, for the actor's supervisor (see
// CommunicatorConfig.Parent); nil otherwise.
func (a *commActor) launch(op *comm.Op, pr *comm.Promise) (pan *Panic) {
	if a.dead.Load() {
		pr.Complete(fmt.Errorf("%w: communicator of group %q was closed while its engine was stuck (%v)", comm.ErrClosed, a.group, op.Type))
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			pan = a.panicked(op, pr, r)
		}
	}()
	var seq uint64
	if comm.UsesP2PSeq(op) {
		seq = a.p2pSeq.Add(1)
	} else {
		seq = a.seq.Add(1)
	}
	op.SetIdentity(a.hash, a.epoch, seq)
	pr.SetFingerprint(op.FP)
	if a.observer != nil {
		a.observer.Scheduled(op, pr)
	}
	a.backend.Launch(op, pr)
	return nil
}

// panicked records a launch's panic r: the communicator's PanicErr, the
// log, OnPanic, and the op's Work failed with an *EngineError; it returns
// the *Panic for the supervisor.
func (a *commActor) panicked(op *comm.Op, pr *comm.Promise, r any) *Panic {
	p := &Panic{Group: a.group, Epoch: a.epoch, FP: op.FP, Value: r, Stack: debug.Stack()}
	ee := &comm.EngineError{Engine: a.backend.Name(), Rank: a.backend.Rank(), FP: op.FP,
		Msg: fmt.Sprintf("panic in the communicator actor: %v", r)}
	a.panicErr.CompareAndSwap(nil, ee)
	a.log.Error().Interface("panic", r).Str("op", op.FP.String()).Bytes("stack", p.Stack).
		Msg("communicator actor panicked; failing the op and handing the panic to the supervisor")
	if a.onPanic != nil {
		a.onPanic(p)
	}
	pr.Complete(ee)
	return p
}

var _ comm.Launcher = (*Communicator)(nil)
