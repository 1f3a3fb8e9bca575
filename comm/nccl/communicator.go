package nccl

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cuda"
)

// commKey keys the engine's communicator cache: (group, device), as
// c10d's devNCCLCommMap.
type commKey struct {
	group  string
	device int
}

// communicator is one NCCL communicator with its stream. The launch
// goroutine makes every call on it; Abort and AsyncError may run on other
// goroutines, so calls on handle hold mu.
type communicator struct {
	key     commKey
	uidKey  string
	stream  cuda.Stream
	startEv cuda.Event     // records the caller's stream; the stream waits on it
	scratch cuda.DevicePtr // 4 bytes for Barrier's allreduce

	mu      sync.Mutex
	handle  Comm // 0 once aborted or destroyed
	ready   bool // init finished
	aborted bool
}

// UIDKey is the store key under which rank 0 publishes the unique id of
// the n-th communicator (from 0) that the engine creates for group at
// epoch: "nccl/<group>/e<epoch>/uid/<n>". Like c10d's per-PG counter, n
// advances identically on every rank because ranks create communicators
// in the same order.
func UIDKey(group string, epoch uint32, n int) string {
	return fmt.Sprintf("nccl/%s/e%d/uid/%d", group, epoch, n)
}

// getComm returns the communicator for the engine's device, creating it
// on first use (launch goroutine only). ctx bounds the store wait together
// with Options.InitTimeout.
func (e *Engine) getComm(ctx context.Context) (*communicator, error) {
	key := commKey{group: e.cfg.Group, device: e.cfg.Device}
	e.mu.Lock()
	c := e.comms[key]
	e.mu.Unlock()
	if c != nil {
		return c, nil
	}
	start := time.Now()
	deadline := start.Add(e.opts.InitTimeout)
	uidKey := UIDKey(e.cfg.Group, e.cfg.Epoch, e.uidSeq)
	e.uidSeq++
	tmo := func(phase string, err error) error {
		return &InitTimeoutError{Group: e.cfg.Group, Epoch: e.cfg.Epoch, Rank: e.cfg.Rank, Size: e.cfg.Size,
			Device: e.cfg.Device, Key: uidKey, Phase: phase, Timeout: e.opts.InitTimeout, Err: err}
	}
	id, err := e.exchangeUID(ctx, uidKey, deadline)
	if err != nil {
		if s := e.stopped(); s != nil {
			return nil, s
		}
		if ctx.Err() != nil && !errors.Is(err, context.DeadlineExceeded) {
			return nil, ctx.Err()
		}
		if errors.Is(err, comm.ErrInvalidArgument) {
			return nil, err
		}
		return nil, tmo("waiting for the unique id from rank 0", err)
	}
	c = &communicator{key: key, uidKey: uidKey}
	if err := c.alloc(e.cu, e.opts.HighPriorityStream); err != nil {
		c.release(e.cu)
		return nil, err
	}
	cfg := NewConfig(e.nc.Version())
	cfg.Blocking = 0
	h, r, err := e.nc.CommInitRankConfig(e.cfg.Size, id, e.cfg.Rank, cfg)
	if err != nil {
		c.release(e.cu)
		return nil, &comm.EngineError{Engine: "nccl", Rank: e.cfg.Rank, Msg: err.Error()}
	}
	c.handle = h
	// Registered before init ends so that Abort can cancel a stuck init.
	e.mu.Lock()
	e.comms[key] = c
	e.mu.Unlock()
	if e.stopped() != nil { // Abort raced with the registration
		c.abort(e.nc)
	}
	sleep := 10 * time.Microsecond
	for r == InProgress {
		select {
		case <-ctx.Done():
			e.dropComm(c)
			if s := e.stopped(); s != nil {
				return nil, s
			}
			return nil, ctx.Err()
		default:
		}
		if time.Now().After(deadline) {
			e.dropComm(c)
			return nil, tmo("ncclCommInitRankConfig still in progress (a peer has not joined)", nil)
		}
		time.Sleep(sleep)
		sleep = min(2*sleep, time.Millisecond)
		c.mu.Lock()
		if c.handle == 0 {
			c.mu.Unlock()
			e.dropComm(c)
			if s := e.stopped(); s != nil {
				return nil, s
			}
			return nil, &comm.EngineError{Engine: "nccl", Rank: e.cfg.Rank, Msg: "communicator aborted during init"}
		}
		r, err = e.nc.CommGetAsyncError(c.handle)
		c.mu.Unlock()
		if err != nil {
			break
		}
	}
	if err == nil && r != Success {
		err = &Error{Call: "ncclCommInitRankConfig", Code: r, Msg: e.nc.ErrorString(r), Last: e.nc.LastError(c.handle)}
	}
	if err != nil {
		e.dropComm(c)
		return nil, &comm.EngineError{Engine: "nccl", Rank: e.cfg.Rank, Msg: err.Error()}
	}
	c.mu.Lock()
	c.ready = true
	c.mu.Unlock()
	e.log.Info().Str("uid_key", uidKey).Dur("took", time.Since(start)).Int("size", e.cfg.Size).Msg("nccl communicator ready")
	return c, nil
}

// exchangeUID gets the unique id: rank 0 creates and publishes it; the
// others wait for it in the store until deadline.
func (e *Engine) exchangeUID(ctx context.Context, key string, deadline time.Time) (UniqueID, error) {
	var id UniqueID
	if e.cfg.Rank == 0 {
		var err error
		if id, err = e.nc.GetUniqueID(); err != nil {
			return id, &comm.EngineError{Engine: "nccl", Rank: e.cfg.Rank, Msg: err.Error()}
		}
		if e.cfg.Store != nil && e.cfg.Size > 1 {
			sctx, cancel := context.WithDeadline(ctx, deadline)
			defer cancel()
			if err := e.cfg.Store.Set(sctx, key, id.Internal[:]); err != nil {
				return id, fmt.Errorf("publishing the unique id: %w", err)
			}
		}
		return id, nil
	}
	sctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	b, err := e.cfg.Store.Get(sctx, key)
	if err != nil {
		return id, err
	}
	if len(b) != UniqueIDBytes {
		return id, fmt.Errorf("%w: nccl: unique id under %s has %d bytes, want %d", comm.ErrInvalidArgument, key, len(b), UniqueIDBytes)
	}
	copy(id.Internal[:], b)
	return id, nil
}

// dropComm aborts c (ncclCommAbort cancels a nonblocking init) and removes
// it from the cache.
func (e *Engine) dropComm(c *communicator) {
	c.abort(e.nc)
	c.release(e.cu)
	e.mu.Lock()
	if e.comms[c.key] == c {
		delete(e.comms, c.key)
	}
	e.mu.Unlock()
}

// alloc creates the stream, the start event and the barrier scratch word.
func (c *communicator) alloc(cu *cuda.Lib, highPriority bool) error {
	prio := 0
	if highPriority {
		if _, greatest, err := cu.StreamPriorityRange(); err == nil {
			prio = greatest
		}
	}
	var err error
	if c.stream, err = cu.StreamCreate(cuda.StreamNonBlocking, prio); err != nil {
		return err
	}
	if c.startEv, err = cu.EventCreate(cuda.EventDisableTiming); err != nil {
		return err
	}
	if c.scratch, err = cu.MemAlloc(4); err != nil {
		return err
	}
	return nil
}

// release frees c's CUDA resources (the stream's queued work still runs).
func (c *communicator) release(cu *cuda.Lib) {
	if c.scratch != 0 {
		_ = cu.MemFree(c.scratch)
		c.scratch = 0
	}
	if c.startEv != 0 {
		_ = cu.EventDestroy(c.startEv)
		c.startEv = 0
	}
	if c.stream != 0 {
		_ = cu.StreamDestroy(c.stream)
		c.stream = 0
	}
}

// abort calls ncclCommAbort once; any goroutine.
func (c *communicator) abort(nc *Lib) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.handle == 0 {
		return
	}
	_ = nc.CommAbort(c.handle)
	c.handle = 0
	c.aborted = true
}

// finalize ends c cleanly: ncclCommFinalize, poll until done (at most
// timeout), ncclCommDestroy; falls back to ncclCommAbort.
func (c *communicator) finalize(nc *Lib, timeout time.Duration, log zerolog.Logger) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.handle == 0 {
		return
	}
	h := c.handle
	c.handle = 0
	if !c.ready {
		_ = nc.CommAbort(h)
		return
	}
	r, err := nc.CommFinalize(h)
	deadline := time.Now().Add(timeout)
	for err == nil && r == InProgress && time.Now().Before(deadline) {
		time.Sleep(100 * time.Microsecond)
		r, err = nc.CommGetAsyncError(h)
	}
	if err != nil || r != Success {
		log.Warn().Err(err).Str("state", r.String()).Msg("ncclCommFinalize did not finish; aborting the communicator")
		_ = nc.CommAbort(h)
		return
	}
	if err := nc.CommDestroy(h); err != nil {
		log.Warn().Err(err).Msg("ncclCommDestroy failed")
	}
}

// asyncError polls ncclCommGetAsyncError; "" while healthy (or still
// initializing), else the result and ncclGetLastError's text. It never
// blocks its caller (the watchdog): while the launch goroutine is inside a
// call on the communicator it reports nothing this time, and that
// goroutine's own polling sees any error.
func (c *communicator) asyncError(nc *Lib) string {
	if !c.mu.TryLock() {
		return ""
	}
	defer c.mu.Unlock()
	if c.handle == 0 || !c.ready {
		return ""
	}
	r, err := nc.CommGetAsyncError(c.handle)
	if err != nil {
		return err.Error()
	}
	if r == Success || r == InProgress {
		return ""
	}
	s := fmt.Sprintf("ncclCommGetAsyncError: %v: %s", r, nc.ErrorString(r))
	if last := nc.LastError(c.handle); last != "" {
		s += ": " + last
	}
	return s
}

// waitIdle polls a nonblocking communicator after a call returned
// InProgress, until it leaves that state; mu held by the caller.
func (c *communicator) waitIdle(nc *Lib, abort <-chan struct{}) (Result, error) {
	sleep := time.Microsecond
	for {
		r, err := nc.CommGetAsyncError(c.handle)
		if err != nil || r != InProgress {
			return r, err
		}
		select {
		case <-abort:
			return InProgress, errors.New("aborted while a nonblocking NCCL call was in progress")
		default:
		}
		time.Sleep(sleep)
		sleep = min(2*sleep, 100*time.Microsecond)
	}
}
