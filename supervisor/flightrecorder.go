package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
)

// DumpVersion is the schema version written in every Dump.
const DumpVersion = "ranktree-fr/1"

// MaxStoreDumpBytes bounds a dump written to the store (values of at least
// 1 MiB must be supported by every Store); older entries are left out of
// the store copy until it fits (the file copy is complete).
const MaxStoreDumpBytes = 1000 << 10

// Entry is one flight-recorder record, after c10d's flight recorder
// (torch.distributed FlightRecorder "entries"). Times are Unix nanoseconds,
// 0 meaning "not yet".
type Entry struct {
	RecordID uint64 `json:"record_id"`     // unique per rank, increasing in launch order across groups
	Group    string `json:"process_group"` // process group name
	Epoch    uint32 `json:"epoch"`
	Seq      uint64 `json:"collective_seq_id"` // collective seq (0 for Send/Recv)
	P2PSeq   uint64 `json:"p2p_seq_id"`        // P2P seq for Send/Recv (0 otherwise)
	Op       string `json:"op"`                // c10d OpType name, e.g. "ALLREDUCE"
	IsP2P    bool   `json:"is_p2p"`
	DType    string `json:"dtype"` // the fingerprint's dtype
	Count    int64  `json:"count"` // elements per rank, from the fingerprint
	Root     int32  `json:"root"`  // root of rooted ops, peer of P2P, else -1
	RedOp    string `json:"redop,omitempty"`
	// InputSizes/OutputSizes are the buffers' shapes ([elements] each, as
	// ranktree buffers are flat); the dtypes are listed per buffer.
	InputSizes      [][]int64 `json:"input_sizes"`
	InputDTypes     []string  `json:"input_dtypes"`
	OutputSizes     [][]int64 `json:"output_sizes"`
	OutputDTypes    []string  `json:"output_dtypes"`
	State           string    `json:"state"` // actors.State*: scheduled, started, completed, failed
	TimeCreatedNS   int64     `json:"time_created_ns"`
	TimeStartedNS   int64     `json:"time_discovered_started_ns"`
	TimeCompletedNS int64     `json:"time_discovered_completed_ns"`
	DurationMS      float64   `json:"duration_ms,omitempty"` // completed − started (or created)
	TimeoutMS       int64     `json:"timeout_ms"`
	Error           string    `json:"error,omitempty"`
}

// GroupStatus is one group's progress on the dumping rank (c10d "pg_status").
// The Last* fields survive ring-buffer eviction.
type GroupStatus struct {
	Group            string `json:"name"`
	Epoch            uint32 `json:"epoch"`
	GroupRank        int    `json:"group_rank"` // -1 if unknown
	Ranks            []int  `json:"ranks"`      // members' global ranks by group rank (nil if unknown)
	LastEnqueued     uint64 `json:"last_enqueued_collective"`
	LastStarted      uint64 `json:"last_started_collective"`
	LastCompleted    uint64 `json:"last_completed_collective"`
	LastEnqueuedP2P  uint64 `json:"last_enqueued_p2p"`
	LastCompletedP2P uint64 `json:"last_completed_p2p"`
	Evicted          uint64 `json:"evicted_entries"` // entries overwritten by the ring
}

// Dump is one rank's flight-recorder snapshot, as written to
// RANKTREE_TRACE_DIR and to the store under TraceKey(rank).
type Dump struct {
	Version   string        `json:"version"` // DumpVersion
	Job       string        `json:"job"`
	Rank      int           `json:"rank"` // global rank
	WorldSize int           `json:"world_size"`
	Reason    string        `json:"reason,omitempty"` // why it was dumped (timeout, abort, request)
	TimeNS    int64         `json:"dump_time_ns"`
	Groups    []GroupStatus `json:"pg_status"`
	Entries   []Entry       `json:"entries"` // by RecordID
	// Truncated counts the oldest entries left out to fit the store.
	Truncated int `json:"truncated_entries,omitempty"`
}

// RecorderConfig configures a FlightRecorder.
type RecorderConfig struct {
	Job       string
	Rank      int // global rank
	WorldSize int
	// Capacity is the ring size per group (0: DefaultTraceBufferSize;
	// TraceDisabled: record nothing but group progress).
	Capacity int
	// Now is the clock for entries without a Work and for dumps (nil: time.Now).
	Now func() time.Time
}

// FlightRecorder keeps the last Capacity ops of every process group of one
// rank. The communicator actors are its writers (Record, AddGroup, one call
// per launch); the watchdog, the heartbeat monitor and dump requests read it
// (Dump) from their own goroutines. The recorder owns its rings under one
// mutex held only for memory work, never for I/O. Work states are read from
// the Works themselves at dump time (their timestamps are atomics), so
// engines never call the recorder.
//
// Each group's ring is allocated once, at the group's first record or
// AddGroup: a slot holds the op's raw identity (fingerprint, type, timeout,
// Work) and its buffer lengths inline, and Record only copies those in, so
// recording an op allocates nothing (ops with more than slotCounts buffers
// reuse the slot's overflow slice once it is big enough) and converts
// nothing: no time, no string. The group's progress counters outlive
// eviction: a slot's progress is folded into them from the slot itself
// (its Work's state), as soon as its Work has ended while the slot is
// recent and still in the CPU's caches (foldEnded), else when it is
// evicted. Entries, with their strings, times and shapes, are built at
// Dump time.
//
// A slot reads its Work only while the Work is in flight: once it has
// ended, the slot copies its final state (times and error) in and drops
// it (endSlot), at the fold or at the eviction. The Observer's slots hold
// their op's Promise (Promise.Retain) until then, so that a blocking op's
// block (comm.Blocking), recycled once nothing holds it, is never reused
// under a slot.
type FlightRecorder struct {
	mu     sync.Mutex
	cfg    RecorderConfig
	nextID uint64
	groups map[string]*ring
}

// slotCounts is how many buffer lengths a slot holds inline (an op's
// input and output buffer); more go to the ring's overflow slices.
const slotCounts = 2

// slot is one recorded op, in the raw form Record copies (see
// FlightRecorder); entryState and entryNow turn it into an Entry. It holds
// only what every record needs, in 128 bytes (two cache lines: a full
// ring's oldest slot, which Record overwrites, has long left the caches).
// The final state of a Work that ended while recent lives beside it, in
// the ring's ends.
type slot struct {
	id      uint64
	w       *comm.Work    // nil: a record without a Work (its state is in man), or ended
	p       *comm.Promise // w's Promise if the slot holds it (Observer, counted), else nil
	man     *manualState  // the state of a record without a Work (SetState)
	fp      comm.Fingerprint
	timeout time.Duration
	nIn, n  int32 // counts[:nIn] are inputs, the rest outputs; n buffer lengths in all
	typ     comm.OpType
	inline  [slotCounts]int64
}

// slotEnd is the final state of a slot's Work, copied in when the Work
// ended while the slot was recent (foldEnded, endSlot): times in Unix ns,
// and its error.
type slotEnd struct {
	created, started, completed int64
	err                         error
}

// manualState is the state of a record without a Work, as SetState sets it.
type manualState struct {
	created, started, completed int64 // Unix ns
	state                       string
	err                         string
}

type ring struct {
	status GroupStatus
	slots  []slot
	next   int // index of the next write
	n      int // live slots
	// folded[i]: slot i's Work had ended when it was folded into status
	// (foldEnded), so its eviction need not read the slot again; its final
	// state is then ends[i], and the slot no longer holds the Work.
	folded []bool
	ends   []slotEnd
	// more[i] holds slot i's buffer lengths when they are more than
	// slotCounts (nil until an op needs it; kept across laps).
	more [][]int64
}

// counts returns slot i's buffer lengths, inputs first.
func (g *ring) counts(i int) []int64 {
	s := &g.slots[i]
	if s.n <= slotCounts {
		return s.inline[:s.n]
	}
	return g.more[i][:s.n]
}

// NewFlightRecorder returns an empty recorder.
func NewFlightRecorder(cfg RecorderConfig) *FlightRecorder {
	if cfg.Capacity == 0 {
		cfg.Capacity = DefaultTraceBufferSize
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &FlightRecorder{cfg: cfg, groups: map[string]*ring{}}
}

// AddGroup registers a group's membership (global ranks by group rank) and
// this rank's group rank, so that dumps can name missing ranks. A group with
// a new epoch replaces the old one's status (its entries stay in the ring).
func (r *FlightRecorder) AddGroup(group string, epoch uint32, groupRank int, ranks []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.ring(group)
	if g.status.Epoch != epoch {
		g.status = GroupStatus{Group: group, Epoch: epoch, Evicted: g.status.Evicted}
	}
	g.status.GroupRank = groupRank
	g.status.Ranks = slices.Clone(ranks)
}

func (r *FlightRecorder) ring(group string) *ring {
	g := r.groups[group]
	if g == nil {
		n := max(r.cfg.Capacity, 0)
		g = &ring{status: GroupStatus{Group: group, GroupRank: -1}, slots: make([]slot, n), folded: make([]bool, n), ends: make([]slotEnd, n)}
		r.groups[group] = g
	}
	return g
}

// Record adds a scheduled entry for op, launched on group with the given
// deadline, and returns its record id. w (may be nil) is the op's Work,
// which the recorder only reads; the entry's state and times follow it
// (without a Work, SetState sets them). For Send/Recv op.FP.Seq is the
// P2P seq. With a Work it allocates nothing once the group's ring exists
// (see FlightRecorder).
//
// The recorder reads w until it has ended; a Work whose block may be
// reused (a blocking op's) must be recorded through its Promise, by the
// Observer.
func (r *FlightRecorder) Record(group string, op *comm.Op, w *comm.Work, timeout time.Duration) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.record(r.ring(group), op, w, nil, timeout)
}

// recordHeld is Record of p's Work, which the slot holds (Promise.Retain)
// until the Work has ended.
func (r *FlightRecorder) recordHeld(group string, op *comm.Op, p *comm.Promise, timeout time.Duration) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.record(r.ring(group), op, p.Work(), p, timeout)
}

// record is Record into group ring g, with r.mu held; p, if not nil, is
// w's Promise, which the slot then holds.
func (r *FlightRecorder) record(g *ring, op *comm.Op, w *comm.Work, p *comm.Promise, timeout time.Duration) uint64 {
	p2p := op.Type.IsP2P()
	group := g.status.Group
	r.nextID++
	id := r.nextID
	epoch := op.FP.Epoch
	if epoch > g.status.Epoch { // a restarted communicator: progress starts over
		g.status = GroupStatus{Group: group, Epoch: epoch, GroupRank: g.status.GroupRank,
			Ranks: g.status.Ranks, Evicted: g.status.Evicted}
	}
	switch {
	case epoch != g.status.Epoch:
		// An op of an older epoch, still being recorded: keep it, move no counters.
	case p2p:
		g.status.LastEnqueuedP2P = max(g.status.LastEnqueuedP2P, op.FP.Seq)
	default:
		g.status.LastEnqueued = max(g.status.LastEnqueued, op.FP.Seq)
	}
	if len(g.slots) == 0 {
		return id
	}
	i := g.next
	if g.n == len(g.slots) {
		if !g.folded[i] {
			g.foldSlot(&g.slots[i])
		}
		g.slots[i].drop()
		g.status.Evicted++
	} else {
		g.n++
	}
	if p != nil && !p.Retain() {
		p = nil // not counted: nothing to release
	}
	g.slots[i] = slot{id: id, fp: op.FP, typ: op.Type, timeout: timeout, w: w, p: p}
	g.folded[i] = false
	if w == nil {
		g.slots[i].man = &manualState{created: r.cfg.Now().UnixNano(), state: actors.StateScheduled}
	}
	g.fillCounts(i, op)
	g.foldEnded()
	g.next = (i + 1) % len(g.slots)
	return id
}

// foldBack are the distances back from the newest slot at which Record
// looks for a Work that has ended, to fold it early (foldEnded): the
// previous op (a caller that waits for each op) and one a few ops back
// (ops launched in bursts, as DDP's buckets).
var foldBack = [...]int{1, 16}

// foldEnded folds the slots foldBack records before the newest one (at
// g.next) into the group's counters if their Works have ended, and marks
// them folded, so that their eviction, thousands of records later, need
// not read their Works again: by then a Work has long left the CPU's
// caches, and reading it cost a launch more than the rest of Record. The
// counters are maxima and an ended Work's state is final, so folding it
// early or at eviction gives the same counters.
func (g *ring) foldEnded() {
	for _, back := range foldBack {
		if back >= g.n {
			return
		}
		i := g.next - back
		if i < 0 {
			i += len(g.slots)
		}
		if g.folded[i] { // folded already: the slot need not be read
			continue
		}
		if s := &g.slots[i]; s.w != nil && s.w.IsCompleted() {
			g.foldSlot(s)
			g.endSlot(i)
			g.folded[i] = true
		}
	}
}

// endSlot copies the final state of slot i's Work, which has ended, into
// ends[i] and drops the Work (releasing its Promise if the slot held it):
// from then on the slot is read alone.
func (g *ring) endSlot(i int) {
	s, e := &g.slots[i], &g.ends[i]
	e.created, e.started, e.completed = s.w.UnixNanos()
	e.err = s.w.Err()
	s.drop()
}

// endOf is slot i's final state if its Work ended while recent (endSlot),
// else nil.
func (g *ring) endOf(i int) *slotEnd {
	if g.folded[i] && g.slots[i].w == nil && g.slots[i].man == nil {
		return &g.ends[i]
	}
	return nil
}

// drop lets go of the slot's Work: before the slot is overwritten, or
// once its state is copied (end).
func (s *slot) drop() {
	if s.p != nil {
		s.p.Release()
		s.p = nil
	}
	s.w = nil
}

// SetState records a state change for an entry recorded without a Work
// (entries with a Work follow the Work). Unknown or evicted ids are ignored.
func (r *FlightRecorder) SetState(id uint64, state string, at time.Time, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, g := range r.groups {
		for i := range g.slots {
			s := &g.slots[i]
			if s.id != id || s.man == nil {
				continue
			}
			m := s.man
			m.state = state
			switch state {
			case actors.StateStarted:
				m.started = at.UnixNano()
			case actors.StateCompleted, actors.StateFailed:
				m.completed = at.UnixNano()
			}
			if err != nil {
				m.err = err.Error()
			}
			return
		}
	}
}

// fillCounts stores the element counts of op's input buffers followed by
// its output buffers (children's included, in order) in slot i, and how
// many are inputs. All buffers of an op share the fingerprint's dtype
// (ProcessGroup validates it), so dtypes are not stored.
func (g *ring) fillCounts(i int, op *comm.Op) {
	nIn, n := countBufs(op)
	s := &g.slots[i]
	s.nIn, s.n = int32(nIn), int32(n)
	var dst []int64
	if n <= slotCounts {
		dst = s.inline[:n]
	} else {
		if g.more == nil {
			g.more = make([][]int64, len(g.slots))
		}
		if cap(g.more[i]) < n {
			g.more[i] = make([]int64, n)
		}
		dst = g.more[i][:n]
	}
	in, out := 0, nIn
	putCounts(op, dst, &in, &out)
}

// putCounts writes the lengths of op's and its children's buffers into
// dst: inputs from *in on, outputs from *out on.
func putCounts(op *comm.Op, dst []int64, in, out *int) {
	for i := range op.In {
		dst[*in] = int64(op.In[i].Len())
		*in++
	}
	for i := range op.Out {
		dst[*out] = int64(op.Out[i].Len())
		*out++
	}
	for _, ch := range op.Children {
		putCounts(ch, dst, in, out)
	}
}

// countBufs is the number of input buffers of op and its children, and of
// all their buffers.
func countBufs(op *comm.Op) (nIn, n int) {
	nIn, n = len(op.In), len(op.In)+len(op.Out)
	for _, ch := range op.Children {
		i, m := countBufs(ch)
		nIn, n = nIn+i, n+m
	}
	return nIn, n
}

// shapes expands counts into c10d-style sizes ([n] per buffer) and dtypes.
func shapes(counts []int64, dtype string) ([][]int64, []string) {
	sizes := make([][]int64, len(counts))
	dts := make([]string, len(counts))
	for i := range counts {
		sizes[i] = []int64{counts[i]}
		dts[i] = dtype
	}
	return sizes, dts
}

// entryNow is slot i's entry with its buffer shapes, and state and times
// read from its Work.
func (g *ring) entryNow(i int) Entry {
	s := &g.slots[i]
	e := entryStateEnd(g.status.Group, s, g.endOf(i))
	c := g.counts(i)
	e.InputSizes, e.InputDTypes = shapes(c[:s.nIn], e.DType)
	e.OutputSizes, e.OutputDTypes = shapes(c[s.nIn:], e.DType)
	return e
}

// entryState is the entry (without buffer shapes) of slot s of group, with
// state and times read from its Work.
func entryState(group string, s *slot) Entry { return entryStateEnd(group, s, nil) }

// entryStateEnd is entryState, with state and times from end instead if
// the slot's Work has ended and dropped (not nil).
func entryStateEnd(group string, s *slot, end *slotEnd) Entry {
	fp := s.fp
	e := Entry{RecordID: s.id, Group: group, Epoch: fp.Epoch, Op: s.typ.String(), IsP2P: s.typ.IsP2P(),
		DType: fp.DType.String(), Count: fp.Count, Root: fp.Root, TimeoutMS: s.timeout.Milliseconds()}
	if m := s.man; m != nil {
		e.State, e.TimeCreatedNS, e.TimeStartedNS, e.TimeCompletedNS, e.Error = m.state, m.created, m.started, m.completed, m.err
	}
	if end != nil {
		e.State = actors.StateCompleted
		e.TimeCreatedNS, e.TimeStartedNS, e.TimeCompletedNS = end.created, end.started, end.completed
		if end.err != nil {
			e.State = actors.StateFailed
			e.Error = end.err.Error()
		}
	}
	if s.w != nil {
		e.State = actors.StateScheduled
		e.TimeCreatedNS = s.w.Timings().Created.UnixNano()
	}
	if fp.RedOp != 0 {
		e.RedOp = fp.RedOp.String()
	}
	if e.IsP2P {
		e.P2PSeq = fp.Seq
	} else {
		e.Seq = fp.Seq
	}
	if s.w != nil {
		t := s.w.Timings()
		if !t.Started.IsZero() {
			e.TimeStartedNS = t.Started.UnixNano()
			e.State = actors.StateStarted
		}
		if !t.Completed.IsZero() {
			e.TimeCompletedNS = t.Completed.UnixNano()
			e.State = actors.StateCompleted
			if err := s.w.Err(); err != nil {
				e.State = actors.StateFailed
				e.Error = err.Error()
			}
		}
	}
	if e.TimeCompletedNS != 0 {
		from := e.TimeStartedNS
		if from == 0 {
			from = e.TimeCreatedNS
		}
		e.DurationMS = float64(e.TimeCompletedNS-from) / 1e6
	}
	return e
}

// foldSlot is fold(entryState(s)) without building the entry: it reads
// the slot and its Work's state only (no time or string conversion), so
// that evicting a slot on Record costs a few loads.
func (g *ring) foldSlot(s *slot) {
	st := &g.status
	if s.fp.Epoch != st.Epoch {
		return
	}
	var started, completed bool
	if m := s.man; m != nil {
		started, completed = m.started != 0, m.state == actors.StateCompleted
	}
	if s.w != nil {
		completed = s.w.IsSuccess()
		started = completed || !s.w.Timings().Started.IsZero()
	}
	if s.typ.IsP2P() {
		if completed {
			st.LastCompletedP2P = max(st.LastCompletedP2P, s.fp.Seq)
		}
		return
	}
	if started || completed {
		st.LastStarted = max(st.LastStarted, s.fp.Seq)
	}
	if completed {
		st.LastCompleted = max(st.LastCompleted, s.fp.Seq)
	}
}

// fold advances the group's Last* counters with e (of the current epoch).
func (g *ring) fold(e Entry) {
	st := &g.status
	if e.Epoch != st.Epoch {
		return
	}
	if e.IsP2P {
		if e.State == actors.StateCompleted {
			st.LastCompletedP2P = max(st.LastCompletedP2P, e.P2PSeq)
		}
		return
	}
	if e.TimeStartedNS != 0 || e.State == actors.StateCompleted {
		st.LastStarted = max(st.LastStarted, e.Seq)
	}
	if e.State == actors.StateCompleted {
		st.LastCompleted = max(st.LastCompleted, e.Seq)
	}
}

// Dump returns a snapshot of every group's entries and progress. reason
// says why (e.g. "timeout", "abort", "request").
func (r *FlightRecorder) Dump(reason string) Dump {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := Dump{Version: DumpVersion, Job: r.cfg.Job, Rank: r.cfg.Rank, WorldSize: r.cfg.WorldSize,
		Reason: reason, TimeNS: r.cfg.Now().UnixNano(), Entries: []Entry{}}
	names := make([]string, 0, len(r.groups))
	for name := range r.groups {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		g := r.groups[name]
		// Work on a copy of the status so that a dump never moves counters.
		snap := ring{status: g.status}
		snap.status.Ranks = slices.Clone(g.status.Ranks)
		for i := 0; i < g.n; i++ {
			e := g.entryNow((g.next - g.n + i + len(g.slots)) % len(g.slots))
			snap.fold(e)
			d.Entries = append(d.Entries, e)
		}
		d.Groups = append(d.Groups, snap.status)
	}
	slices.SortFunc(d.Entries, func(a, b Entry) int { return cmpU64(a.RecordID, b.RecordID) })
	return d
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ParseDump decodes a JSON dump and checks its version.
func ParseDump(b []byte) (Dump, error) {
	var d Dump
	if err := json.Unmarshal(b, &d); err != nil {
		return Dump{}, fmt.Errorf("supervisor: bad flight-recorder dump: %w", err)
	}
	if !strings.HasPrefix(d.Version, "ranktree-fr/") {
		return Dump{}, fmt.Errorf("supervisor: bad flight-recorder dump: version %q, want %s", d.Version, DumpVersion)
	}
	return d, nil
}

// TraceKey is the store key of rank's latest dump: "trace/<rank>".
func TraceKey(rank int) string { return "trace/" + strconv.Itoa(rank) }

// TraceFile is the path of rank's dump under dir: dir/ranktree_trace_rank<rank>.json.
func TraceFile(dir string, rank int) string {
	return filepath.Join(dir, fmt.Sprintf("ranktree_trace_rank%d.json", rank))
}

// WriteDump writes d as JSON to TraceFile(dir, d.Rank) (if dir is not
// empty; atomically, by rename) and to st under TraceKey(d.Rank) (if st is
// not nil; shortened to MaxStoreDumpBytes by leaving out the oldest
// entries). It tries both and returns their errors joined.
func WriteDump(ctx context.Context, d Dump, dir string, st store.Store) error {
	var errs []error
	if dir != "" {
		if err := writeDumpFile(d, dir); err != nil {
			errs = append(errs, err)
		}
	}
	if st != nil {
		data, err := storeDumpBytes(d)
		if err == nil {
			err = st.Set(ctx, TraceKey(d.Rank), data)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("supervisor: writing rank %d's dump to the store key %q: %w", d.Rank, TraceKey(d.Rank), err))
		}
	}
	return errors.Join(errs...)
}

func writeDumpFile(d Dump, dir string) error {
	data, err := json.MarshalIndent(d, "", " ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("supervisor: trace dir: %w", err)
	}
	path := TraceFile(dir, d.Rank)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("supervisor: writing rank %d's dump: %w", d.Rank, err)
	}
	_, werr := tmp.Write(append(data, '\n'))
	cerr := tmp.Close()
	if werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), path)
	}
	if werr != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("supervisor: writing rank %d's dump to %s: %w", d.Rank, path, werr)
	}
	return nil
}

func storeDumpBytes(d Dump) ([]byte, error) {
	for {
		data, err := json.Marshal(d)
		if err != nil || len(data) <= MaxStoreDumpBytes || len(d.Entries) == 0 {
			return data, err
		}
		cut := max(len(d.Entries)/4, 1)
		d.Truncated += cut
		d.Entries = d.Entries[cut:]
	}
}

// ReadDumps fetches the dumps of ranks 0..world-1 from st without waiting
// for missing ones (as `rankrunner diagnose` does); ranks without a dump
// are simply absent from the result.
func ReadDumps(ctx context.Context, st store.Store, world int) ([]Dump, error) {
	var out []Dump
	for rank := 0; rank < world; rank++ {
		ok, err := st.Check(ctx, []string{TraceKey(rank)})
		if err != nil {
			return out, err
		}
		if !ok {
			continue
		}
		b, err := st.Get(ctx, TraceKey(rank))
		if err != nil {
			return out, err
		}
		d, err := ParseDump(b)
		if err != nil {
			return out, fmt.Errorf("rank %d: %w", rank, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// Dumper snapshots a FlightRecorder and writes it where Config says: the
// watchdog's and the heartbeat monitor's dump action.
type Dumper struct {
	Rec   *FlightRecorder
	Dir   string      // RANKTREE_TRACE_DIR ("" for none)
	Store store.Store // nil for none
}

// Dump snapshots the recorder with reason and writes it (see WriteDump).
func (d Dumper) Dump(ctx context.Context, reason string) error {
	if d.Rec == nil {
		return errors.New("supervisor: Dumper has no flight recorder")
	}
	return WriteDump(ctx, d.Rec.Dump(reason), d.Dir, d.Store)
}

// Observer returns the actors.Observer that records every op scheduled on
// group's communicator. groupTimeout (may be nil) gives the group's current
// default deadline, recorded for ops without their own.
// The group's ring is looked up once, here (rings are never removed).
func (r *FlightRecorder) Observer(group string, groupTimeout func() time.Duration) actors.Observer {
	r.mu.Lock()
	g := r.ring(group)
	r.mu.Unlock()
	return actors.ObserverFunc(func(op *comm.Op, p *comm.Promise) {
		d := op.Timeout
		if d <= 0 && groupTimeout != nil {
			d = groupTimeout()
		}
		r.mu.Lock()
		r.record(g, op, p.Work(), p, d)
		r.mu.Unlock()
	})
}
