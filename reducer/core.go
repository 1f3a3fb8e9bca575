package reducer

import (
	"fmt"
	"slices"

	"github.com/ranktree/ranktree/comm"
)

// This file is the reducer's pure core: the bucket layout and the
// per-iteration state machine of c10d's Reducer (ready counters, in-order
// launch, unused parameters, static graph, rebuild decision). It holds no
// goroutine, lock, clock or buffer; Reducer feeds it events and carries out
// the actions it returns (zero a view, launch bucket b, allreduce the
// local-used map, rebuild in an order).

// bucketSpec is one bucket: a flat run of one dtype holding its parameters
// back to back.
type bucketSpec struct {
	dtype   comm.DType
	params  []int // parameter indices, in bucket order
	offsets []int // element offset of each parameter in the bucket
	counts  []int // element count of each parameter
	numel   int   // total elements
	limit   int   // the size limit (bytes) the assignment used
}

// paramLoc says where a parameter's gradient lives.
type paramLoc struct {
	bucket int // bucket index
	offset int // element offset in the bucket
	count  int // elements
}

// layout is an immutable bucket assignment.
type layout struct {
	buckets []bucketSpec
	loc     []paramLoc // by parameter index
}

// newLayout builds the layout of an assignment from
// ComputeBucketAssignmentBySize. Every parameter must appear exactly once.
func newLayout(infos []TensorInfo, buckets [][]int, limits []int) (*layout, error) {
	l := &layout{buckets: make([]bucketSpec, len(buckets)), loc: make([]paramLoc, len(infos))}
	seen := make([]bool, len(infos))
	for b, idx := range buckets {
		spec := bucketSpec{limit: limits[b]}
		for _, p := range idx {
			if p < 0 || p >= len(infos) || seen[p] {
				return nil, fmt.Errorf("%w: reducer: bucket %d holds parameter %d twice or out of range", comm.ErrInvalidArgument, b, p)
			}
			seen[p] = true
			if len(spec.params) == 0 {
				spec.dtype = infos[p].DType
			} else if infos[p].DType != spec.dtype {
				return nil, fmt.Errorf("%w: reducer: bucket %d mixes %v and %v", comm.ErrInvalidArgument, b, spec.dtype, infos[p].DType)
			}
			spec.params = append(spec.params, p)
			spec.offsets = append(spec.offsets, spec.numel)
			spec.counts = append(spec.counts, infos[p].Count)
			l.loc[p] = paramLoc{bucket: b, offset: spec.numel, count: infos[p].Count}
			spec.numel += infos[p].Count
		}
		l.buckets[b] = spec
	}
	for p, ok := range seen {
		if !ok {
			return nil, fmt.Errorf("%w: reducer: parameter %d is in no bucket", comm.ErrInvalidArgument, p)
		}
	}
	return l, nil
}

// bucketIndices returns the parameter indices of every bucket (a copy).
func (l *layout) bucketIndices() [][]int {
	out := make([][]int, len(l.buckets))
	for i, b := range l.buckets {
		out[i] = append([]int(nil), b.params...)
	}
	return out
}

// phase is where the core is in an iteration. Phases only move forward
// within an iteration: idle → backward → reducing → idle, or
// backward → ended (a failed EndBackward) which only a new reducer leaves.
type phase uint8

const (
	phaseIdle     phase = iota // finalized; the next event starts an iteration
	phaseBackward              // gradients are being marked ready
	phaseReducing              // EndBackward launched everything and waits
	phaseEnded                 // EndBackward failed: the iteration cannot finish
)

// core is the per-iteration state machine.
type core struct {
	rank       int
	names      []string
	lay        *layout
	findUnused bool
	static     bool

	iter    int64 // synced iterations finalized
	phase   phase
	marked  []bool // marked ready (used or unused) this iteration
	used    []bool // marked by a gradient (locally used) this iteration
	pending []int  // per bucket: parameters not yet marked
	next    int    // every bucket below next has been launched
	order   []int  // parameters in the order their gradients were marked

	staticKnown  bool   // the static graph's first iteration is done
	staticUnused []bool // parameters unused in the static graph's first iteration
	rebuilt      bool   // the one-time rebuild happened (or is not wanted)
}

func newCore(rank int, names []string, lay *layout, findUnused, static bool) *core {
	n := len(names)
	c := &core{rank: rank, names: names, lay: lay, findUnused: findUnused, static: static,
		marked: make([]bool, n), used: make([]bool, n)}
	c.reset()
	return c
}

func (c *core) reset() {
	clear(c.marked)
	clear(c.used)
	c.pending = c.pending[:0]
	for _, b := range c.lay.buckets {
		c.pending = append(c.pending, len(b.params))
	}
	c.next = 0
	c.order = c.order[:0]
}

func (c *core) err(sentinel error, param int, format string, args ...any) *Error {
	e := &Error{Rank: c.rank, Iteration: c.iter, Param: param, Err: sentinel, Msg: fmt.Sprintf(format, args...)}
	if param >= 0 && param < len(c.names) {
		e.Name = c.names[param]
	}
	return e
}

// missing lists the parameters not marked ready in this iteration.
func (c *core) missing() []int {
	var out []int
	for p, m := range c.marked {
		if !m {
			out = append(out, p)
		}
	}
	return out
}

// needsLocalUsedMap reports whether this iteration ends with an allreduce
// of the local-used map (c10d: dynamic_graph_find_unused() ||
// static_graph_first_iteration()).
func (c *core) needsLocalUsedMap() bool { return c.findUnused || (c.static && !c.staticKnown) }

// wantsRebuild reports whether the one-time rebuild is still due (c10d
// should_rebuild_buckets: static graph or no unused-parameter search).
func (c *core) wantsRebuild() bool { return !c.rebuilt && (c.static || !c.findUnused) }

func (c *core) unfinished() *Error {
	miss := c.missing()
	if len(miss) == 0 {
		return c.err(ErrUnfinishedReduction, -1, "Expected to have finished reduction in the prior iteration before starting a new one: every parameter was marked ready but EndBackward did not finish; call EndBackward once after each backward pass")
	}
	return c.err(ErrUnfinishedReduction, -1, "Expected to have finished reduction in the prior iteration before starting a new one. This error indicates that your module has parameters that were not used in producing loss. Enable unused parameter detection with Config.FindUnusedParameters (c10d: find_unused_parameters=True) or pass them to PrepareForBackward. Parameter indices which did not receive grad for rank %d: %s", c.rank, paramList(miss, c.names))
}

// checkBegin validates the start of an iteration; unused are parameters
// the caller declares locally unused. It returns the set to mark unused.
// It changes nothing, so the caller may run collectives between checkBegin
// and begin.
func (c *core) checkBegin(unused []int) ([]bool, error) {
	switch c.phase {
	case phaseBackward, phaseEnded:
		return nil, c.unfinished()
	case phaseReducing:
		return nil, c.err(ErrBadState, -1, "a new iteration started while EndBackward is still reducing")
	}
	n := len(c.names)
	if len(unused) > 0 && !c.findUnused && !c.static {
		return nil, c.err(comm.ErrInvalidArgument, -1, "unused parameters %v were given but neither FindUnusedParameters nor StaticGraph is set", unused)
	}
	set := make([]bool, n)
	for _, p := range unused {
		if p < 0 || p >= n {
			return nil, c.err(comm.ErrInvalidArgument, -1, "unused parameter index %d out of range [0, %d)", p, n)
		}
		if set[p] {
			return nil, c.err(comm.ErrInvalidArgument, p, "listed twice as unused")
		}
		set[p] = true
	}
	if c.static && c.staticKnown {
		if len(unused) > 0 {
			for p := range n {
				if set[p] != c.staticUnused[p] {
					return nil, c.staticChanged(p, set[p])
				}
			}
		}
		set = slices.Clone(c.staticUnused)
	}
	return set, nil
}

// begin starts an iteration with the unused set from checkBegin. It
// returns the parameters it marked unused (the caller zeroes their views)
// and the buckets now due for launch, in order.
func (c *core) begin(unused []bool) (marked, launch []int) {
	c.reset()
	c.phase = phaseBackward
	for p, u := range unused {
		if u {
			marked = append(marked, p)
			launch = append(launch, c.markOne(p, false)...)
		}
	}
	return marked, launch
}

func (c *core) staticChanged(p int, nowUnused bool) *Error {
	if nowUnused {
		return c.err(ErrStaticGraphChanged, p, "Your training graph has changed in this iteration, e.g., one parameter is used in first iteration, but then got unused in the second iteration. This is not compatible with StaticGraph")
	}
	return c.err(ErrStaticGraphChanged, p, "Your training graph has changed in this iteration, e.g., one parameter is unused in first iteration, but then got used in the second iteration. This is not compatible with StaticGraph")
}

// markOne records p as ready and returns the buckets that become due, in
// index order (only a prefix of consecutive ready buckets launches).
func (c *core) markOne(p int, used bool) []int {
	c.marked[p] = true
	c.used[p] = used
	if used {
		c.order = append(c.order, p)
	}
	c.pending[c.lay.loc[p].bucket]--
	var launch []int
	for c.next < len(c.pending) && c.pending[c.next] == 0 {
		launch = append(launch, c.next)
		c.next++
	}
	return launch
}

// mark records that p's gradient is ready and returns the buckets due for
// launch. The iteration must have begun.
func (c *core) mark(p int) ([]int, error) {
	if p < 0 || p >= len(c.names) {
		return nil, c.err(comm.ErrInvalidArgument, -1, "parameter index %d out of range [0, %d)", p, len(c.names))
	}
	switch c.phase {
	case phaseEnded:
		return nil, c.unfinished()
	case phaseReducing:
		return nil, c.err(ErrBadState, p, "GradReady called while EndBackward is reducing")
	case phaseIdle:
		return nil, c.err(ErrBadState, p, "GradReady before the iteration began")
	}
	if c.marked[p] {
		if c.static && c.staticKnown && c.staticUnused[p] {
			return nil, c.staticChanged(p, false)
		}
		if !c.used[p] {
			return nil, c.err(ErrMarkedTwice, p, "Expected to mark a variable ready only once: the parameter was declared unused in this iteration and then got a gradient")
		}
		return nil, c.err(ErrMarkedTwice, p, "Expected to mark a variable ready only once: GradReady was called twice for this parameter in one backward pass. Sum every use of a parameter into one gradient before GradReady (autograd does this for a parameter used twice), and call EndBackward once per iteration")
	}
	return c.markOne(p, true), nil
}

// end closes the backward pass. Parameters never marked become unused when
// the mode allows it (FindUnusedParameters, or the static graph's first
// iteration); they are returned so the caller zeroes their views. needMap
// says whether to allreduce the local-used map after the last bucket.
func (c *core) end() (unused, launch []int, needMap bool, err error) {
	switch c.phase {
	case phaseIdle:
		return nil, nil, false, c.err(ErrBadState, -1, "EndBackward before the iteration began")
	case phaseReducing:
		return nil, nil, false, c.err(ErrBadState, -1, "EndBackward called twice concurrently")
	}
	miss := c.missing()
	if len(miss) > 0 {
		switch {
		case c.findUnused || (c.static && !c.staticKnown):
			for _, p := range miss {
				launch = append(launch, c.markOne(p, false)...)
			}
			unused = miss
		case c.static:
			c.phase = phaseEnded
			return nil, nil, false, c.staticChanged(miss[0], true)
		default:
			c.phase = phaseEnded
			return nil, nil, false, c.err(ErrMissingGradients, -1, "EndBackward: parameter indices which did not receive grad for rank %d: %s; the reduction cannot finish. Call GradReady for them, or set Config.FindUnusedParameters (c10d: find_unused_parameters=True) to reduce them as unused", c.rank, paramList(miss, c.names))
		}
	}
	if c.next != len(c.lay.buckets) {
		// Unreachable when every parameter is marked; kept as a guard.
		c.phase = phaseEnded
		return nil, nil, false, c.err(ErrBadState, -1, "internal: %d of %d buckets launched after every parameter was marked", c.next, len(c.lay.buckets))
	}
	c.phase = phaseReducing
	return unused, launch, c.needsLocalUsedMap(), nil
}

// finalize completes a reduced iteration. It returns the rebuild order
// (every parameter, gradients in ready order then unused ones in reverse
// index order) when the one-time rebuild is due, else nil.
func (c *core) finalize() []int {
	if c.static && !c.staticKnown {
		c.staticUnused = make([]bool, len(c.names))
		for p := range c.names {
			c.staticUnused[p] = !c.used[p]
		}
		c.staticKnown = true
	}
	var order []int
	if c.wantsRebuild() {
		order = append(order, c.order...)
		for p := len(c.names) - 1; p >= 0; p-- {
			if !c.used[p] {
				order = append(order, p)
			}
		}
		c.rebuilt = true
	}
	c.iter++
	c.phase = phaseIdle
	c.reset()
	return order
}

// shadow runs a joined rank's stand-in iteration (c10d's Join main hook):
// the caller reduces zeros for every bucket, then the local-used map if
// needMap. finishShadow returns the rebuild order when the rebuild is due
// (the default reverse order: rank 0's broadcast decides anyway).
func (c *core) shadow() (needMap bool, err error) {
	if c.phase != phaseIdle {
		return false, c.err(ErrBadState, -1, "Join during an unfinished iteration")
	}
	return c.needsLocalUsedMap(), nil
}

func (c *core) finishShadow() []int {
	if c.static && !c.staticKnown {
		c.staticUnused = make([]bool, len(c.names))
		c.staticKnown = true
	}
	var order []int
	if c.wantsRebuild() {
		for p := len(c.names) - 1; p >= 0; p-- {
			order = append(order, p)
		}
		c.rebuilt = true
	}
	c.iter++
	return order
}

// setLayout installs a rebuilt layout; only between iterations.
func (c *core) setLayout(l *layout) {
	c.lay = l
	c.reset()
}
