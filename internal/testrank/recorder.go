// Package testrank holds test helpers for ranktree's packages: a recording
// comm.Backend, an in-process world of communicator actors, and the re-exec
// helper that runs a test binary as several ranks (Gloo's multiproc_test).
// It is imported by tests only.
package testrank

import (
	"sync"

	"github.com/ranktree/ranktree/comm"
)

// Recorder is a comm.Backend that records every op launched on it and, by
// default, completes it at once with success (a Recv from AnySource reports
// source 0, or 1 on rank 0; an all-gather fills every rank's part of the
// output with this rank's input, as if every rank had passed the same). With Hold set, Works stay in flight until
// Release, Abort or Close. Safe for concurrent use.
type Recorder struct {
	rank, size int

	mu       sync.Mutex
	ops      []*comm.Op
	held     []*comm.Promise
	hold     bool
	aborted  error
	closed   bool
	onLaunch func(op *comm.Op, p *comm.Promise)
}

// NewRecorder returns a Recorder for group rank rank of size.
func NewRecorder(rank, size int) *Recorder { return &Recorder{rank: rank, size: size} }

// Name is "recorder".
func (r *Recorder) Name() string { return "recorder" }

// Rank is the group rank.
func (r *Recorder) Rank() int { return r.rank }

// Size is the group size.
func (r *Recorder) Size() int { return r.size }

// SetHold makes later ops stay in flight (true) or complete at once (false).
func (r *Recorder) SetHold(hold bool) {
	r.mu.Lock()
	r.hold = hold
	r.mu.Unlock()
}

// OnLaunch installs a hook run (outside the lock) for every launched op
// before it is completed; the hook may panic to test engine failures.
func (r *Recorder) OnLaunch(f func(op *comm.Op, p *comm.Promise)) {
	r.mu.Lock()
	r.onLaunch = f
	r.mu.Unlock()
}

// Launch records op and completes p unless holding.
func (r *Recorder) Launch(op *comm.Op, p *comm.Promise) {
	p.Retain() // the recorded op stays readable (a blocking op's block is never reused)
	r.mu.Lock()
	r.ops = append(r.ops, op)
	hook, hold, aborted, closed := r.onLaunch, r.hold, r.aborted, r.closed
	if hold && aborted == nil && !closed {
		r.held = append(r.held, p)
	}
	r.mu.Unlock()
	if op.Type == comm.OpAllGather || op.Type == comm.OpAllGatherV {
		echoGather(op, r.size) // before the hook, which may overwrite it
	}
	if hook != nil {
		hook(op, p)
	}
	switch {
	case aborted != nil:
		p.Complete(&comm.AbortedError{Group: "recorder", Reason: aborted})
	case closed:
		p.Complete(comm.ErrClosed)
	case hold:
	default:
		p.MarkStarted()
		if op.Type == comm.OpRecv {
			src := op.Peer
			if src == comm.AnySource {
				src = 0
				if r.rank == 0 {
					src = 1
				}
			}
			p.SetSource(src)
		}
		p.Complete(nil)
	}
}

// Release completes every held Work with err.
func (r *Recorder) Release(err error) {
	r.mu.Lock()
	held := r.held
	r.held = nil
	r.mu.Unlock()
	for _, p := range held {
		p.Complete(err)
	}
}

// Abort fails held and later ops with an *AbortedError.
func (r *Recorder) Abort(reason error) {
	r.mu.Lock()
	if r.aborted == nil {
		r.aborted = reason
		if reason == nil {
			r.aborted = comm.ErrAborted
		}
	}
	r.mu.Unlock()
	r.Release(&comm.AbortedError{Group: "recorder", Reason: reason})
}

// AsyncError is the abort reason, if any.
func (r *Recorder) AsyncError() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.aborted
}

// Close fails held and later ops with ErrClosed.
func (r *Recorder) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.Release(comm.ErrClosed)
	return nil
}

// Closed reports whether Close was called.
func (r *Recorder) Closed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// Ops returns the ops launched so far, in launch order.
func (r *Recorder) Ops() []*comm.Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*comm.Op(nil), r.ops...)
}

// Reset forgets the recorded ops.
func (r *Recorder) Reset() {
	r.mu.Lock()
	r.ops = nil
	r.mu.Unlock()
}

// echoGather copies a host all-gather's input into every rank's part of
// its output.
func echoGather(op *comm.Op, size int) {
	if len(op.In) != 1 || !op.In[0].IsHost() {
		return
	}
	in := op.In[0].Bytes()
	for i := range size {
		var c comm.Buffer
		if len(op.Out) > 1 {
			c = op.Out[i]
		} else if len(op.Out) == 1 && op.RecvCounts != nil {
			c = comm.Chunk(op.Out, i, op.RecvCounts, 0)
		} else if len(op.Out) == 1 && op.Out[0].Len() == size*op.In[0].Len() {
			c = comm.Chunk(op.Out, i, nil, op.In[0].Len())
		}
		if c.IsHost() && c.NumBytes() == len(in) {
			copy(c.Bytes(), in)
		}
	}
}
