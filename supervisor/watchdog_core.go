package supervisor

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// This file is the watchdog's decision core: a plain state machine with no
// goroutine, clock, store or engine (etcd raft's raft.go). Watchdog (the
// actor) feeds it events, time included, and carries out the actions it
// returns. It follows c10d's ProcessGroupNCCL watchdog loop
// (watchdogHandler: check timeouts, check async errors, abort, dump, tear
// down per TORCH_NCCL_ASYNC_ERROR_HANDLING), with P2P ops under deadlines
// too and peers' progress in every timeout message.

// Exit codes of ActTearDown.
const (
	// ExitTearDown is the exit code after a timeout, async error or remote
	// abort in TearDown or SkipCleanup mode.
	ExitTearDown = 1
	// ExitHeartbeat is the exit code when the heartbeat monitor finds the
	// watchdog stalled.
	ExitHeartbeat = 2
)

// DefaultProgressInterval is how often, at most, a rank publishes its
// progress in a group while it changes.
const DefaultProgressInterval = time.Second

// WorkID identifies a tracked Work between the actor and the core.
type WorkID uint64

// CommID names one communicator (group × epoch) in store keys: "<group>.<epoch>".
func CommID(group string, epoch uint32) string {
	return group + "." + strconv.FormatUint(uint64(epoch), 10)
}

// AbortKey is the store key a rank writes when it aborts communicator commID:
// "abort/<comm-id>"; its value is an AbortRecord as JSON.
func AbortKey(commID string) string { return AbortPrefix + commID }

// ProgressKey is the store key of rank's progress in commID:
// "progress/<comm-id>/<rank>"; its value is a Progress as JSON.
func ProgressKey(commID string, rank int) string {
	return ProgressPrefix + commID + "/" + strconv.Itoa(rank)
}

// Store key prefixes watched by the watchdog.
const (
	AbortPrefix    = "abort/"
	ProgressPrefix = "progress/"
)

// AbortRecord is the value of abort/<comm-id>.
type AbortRecord struct {
	Rank   int    `json:"rank"` // global rank that aborted (wrote the record)
	Group  string `json:"group"`
	Epoch  uint32 `json:"epoch"`
	Reason string `json:"reason"`
	// Origin is the global rank where the failure started: Rank itself,
	// or the peer it blames (a dead peer, the origin of a remote abort).
	// Records without it (older writers) mean Rank.
	Origin *int `json:"origin,omitempty"`
	// Seq is the collective seq at which the failure started (0: unknown).
	Seq uint64 `json:"seq,omitempty"`
}

// OriginRank is the global rank where the failure started: Origin if set,
// else Rank.
func (r AbortRecord) OriginRank() int {
	if r.Origin != nil {
		return *r.Origin
	}
	return r.Rank
}

// Progress is one rank's collective progress in one communicator, as
// published under ProgressKey. A rank has "reached" seq s when its engine
// started executing it (Started ≥ s).
type Progress struct {
	Launched  uint64 `json:"launched"`  // last collective seq scheduled
	Started   uint64 `json:"started"`   // last collective seq the engine began
	Completed uint64 `json:"completed"` // last collective seq completed successfully
}

// GroupSpec describes a communicator to the watchdog.
type GroupSpec struct {
	Name    string
	Epoch   uint32
	CommID  string        // "" means CommID(Name, Epoch)
	Engine  string        // "cpu", "nccl": named in *comm.EngineError
	Members []int         // global ranks, by group rank
	Timeout time.Duration // the group's default deadline (0: the previous epoch's, else the core's)
	// Detail is added to the group's comm_init event (device UUID, PCI bus
	// id, NCCL version for the NCCL engine).
	Detail map[string]string
}

// WatchdogEvent is an input to WatchdogCore.Step.
type WatchdogEvent interface{ isWatchdogEvent() }

// Watchdog events.
type (
	// EvAddGroup registers a communicator (ProcessGroup creation, restart).
	EvAddGroup struct{ Spec GroupSpec }
	// EvRemoveGroup forgets a group and its Works (ProcessGroup.Destroy,
	// which fails them itself).
	EvRemoveGroup struct{ Group string }
	// EvSetTimeout changes a group's default deadline for Works scheduled
	// afterwards (ProcessGroup.SetTimeout).
	EvSetTimeout struct {
		Group   string
		Timeout time.Duration
	}
	// EvScheduled starts tracking a Work: At is when it was created; Timeout
	// the per-op override (0: the group's).
	EvScheduled struct {
		ID      WorkID
		Group   string
		FP      comm.Fingerprint
		Timeout time.Duration
		At      time.Time
	}
	// EvStarted: the engine began executing the Work.
	EvStarted struct{ ID WorkID }
	// EvCompleted: the Work completed, successfully if Err is nil.
	EvCompleted struct {
		ID  WorkID
		Err error
	}
	// EvTick is the periodic check: deadlines and progress publishing.
	EvTick struct{ Now time.Time }
	// EvAsyncError is an engine's first asynchronous error (Backend.AsyncError).
	EvAsyncError struct {
		Group string
		Err   error
	}
	// EvRemoteAbort is an abort/<comm-id> key seen in the store.
	EvRemoteAbort struct {
		CommID string
		Record AbortRecord
	}
	// EvProgress is a progress/<comm-id>/<rank> key seen in the store.
	EvProgress struct {
		CommID   string
		Rank     int
		Progress Progress
	}
)

func (EvAddGroup) isWatchdogEvent()    {}
func (EvRemoveGroup) isWatchdogEvent() {}
func (EvSetTimeout) isWatchdogEvent()  {}
func (EvScheduled) isWatchdogEvent()   {}
func (EvStarted) isWatchdogEvent()     {}
func (EvCompleted) isWatchdogEvent()   {}
func (EvTick) isWatchdogEvent()        {}
func (EvAsyncError) isWatchdogEvent()  {}
func (EvRemoteAbort) isWatchdogEvent() {}
func (EvProgress) isWatchdogEvent()    {}

// Action is an output of WatchdogCore.Step, to be carried out in order.
type Action interface{ isAction() }

// Watchdog actions.
type (
	// ActFailWork completes the Work with Err (*comm.TimeoutError,
	// *comm.EngineError, *comm.RemoteAbortError or *comm.AbortedError).
	ActFailWork struct {
		ID  WorkID
		Err error
	}
	// ActAbortComm aborts the group's communicator (Backend.Abort) without
	// evicting it, so later ops fail fast with comm.ErrAborted.
	ActAbortComm struct {
		Group  string
		Reason error
	}
	// ActWriteAbort writes Record as JSON under AbortKey(CommID).
	ActWriteAbort struct {
		CommID string
		Record AbortRecord
	}
	// ActPublishProgress writes Progress as JSON under ProgressKey(CommID, rank).
	ActPublishProgress struct {
		CommID   string
		Progress Progress
	}
	// ActDump dumps the flight recorder.
	ActDump struct{ Reason string }
	// ActTearDown ends the process with Code after the actions before it.
	ActTearDown struct {
		Code   int
		Reason string
	}
)

func (ActFailWork) isAction()        {}
func (ActAbortComm) isAction()       {}
func (ActWriteAbort) isAction()      {}
func (ActPublishProgress) isAction() {}
func (ActDump) isAction()            {}
func (ActTearDown) isAction()        {}

// CoreConfig configures a WatchdogCore.
type CoreConfig struct {
	Rank             int           // this process's global rank
	Mode             ErrorHandling // 0: TearDown
	Timeout          time.Duration // default group deadline (0: DefaultTimeout)
	ProgressInterval time.Duration // 0: DefaultProgressInterval
}

// WatchdogCore holds the watchdog's state: the groups, their in-flight
// Works with deadlines, local and peer progress, and what has been aborted.
// It is owned by one goroutine (the watchdog actor's); Step is not safe for
// concurrent use.
//
// A group keeps sequence watermarks (its local Progress: last launched,
// started and completed collective) and its in-flight Works in a min-heap
// by deadline, so a tick looks at each group's earliest deadline only: it
// costs O(groups) plus the Works that are due, not O(Works in flight).
// A Work's completion costs O(1) (it is marked done and leaves the heap
// when it reaches the top, or when done entries outnumber live ones);
// finished Works are recycled, so a steady stream of ops allocates
// nothing here.
type WatchdogCore struct {
	cfg      CoreConfig
	groups   map[string]*wdGroup
	names    []string // the groups' names, sorted (ticks visit groups in this order)
	byComm   map[string]*wdGroup
	works    map[WorkID]*wdWork     // live (not done) Works
	free     []*wdWork              // recycled Works
	pending  map[string]AbortRecord // aborts seen for comm-ids not (yet) registered
	tornDown bool
	visited  int      // heap entries a tick looked at (tests check a tick's cost)
	last     *wdGroup // the group last looked up by name (ops come in runs of one group)
}

type wdGroup struct {
	spec      GroupSpec
	timeout   time.Duration
	aborted   bool
	abortErr  error
	local     Progress
	published Progress
	lastPub   time.Time
	peers     map[int]Progress
	due       []*wdWork // in-flight Works, a min-heap by (deadline, id); done ones leave lazily
	nDone     int       // done entries still in due
	// deferred is a peer's or the engine's abort that started at a later
	// collective seq than Works still in flight here (abortAt): its
	// incident waits until they end.
	deferred *deferredAbort
}

// deferredAbort is an incident that waits for the Works before seq.
type deferredAbort struct {
	cause  error
	reason string
	seq    uint64
	remote bool
}

type wdWork struct {
	id       WorkID
	group    string
	fp       comm.Fingerprint
	at       time.Time
	timeout  time.Duration
	deadline time.Time
	done     bool // completed, failed or dropped: waiting to leave its group's heap
}

// NewWatchdogCore returns a core with no groups.
func NewWatchdogCore(cfg CoreConfig) *WatchdogCore {
	if cfg.Mode == 0 {
		cfg.Mode = TearDown
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.ProgressInterval <= 0 {
		cfg.ProgressInterval = DefaultProgressInterval
	}
	return &WatchdogCore{cfg: cfg, groups: map[string]*wdGroup{}, byComm: map[string]*wdGroup{},
		works: map[WorkID]*wdWork{}, pending: map[string]AbortRecord{}}
}

// InFlight is the number of tracked Works.
func (c *WatchdogCore) InFlight() int { return len(c.works) }

// TornDown reports whether the core has decided to end the process; it
// then ignores every event.
func (c *WatchdogCore) TornDown() bool { return c.tornDown }

// Aborted reports whether group's communicator has been aborted (by this
// rank or a peer).
func (c *WatchdogCore) Aborted(group string) bool {
	g := c.groups[group]
	return g != nil && g.aborted
}

// Step applies one event and returns the actions to carry out, in order.
func (c *WatchdogCore) Step(ev WatchdogEvent) []Action {
	if c.tornDown {
		return nil
	}
	switch e := ev.(type) {
	case EvAddGroup:
		return c.addGroup(e.Spec)
	case EvRemoveGroup:
		if g := c.groups[e.Group]; g != nil {
			c.last = nil
			delete(c.groups, e.Group)
			delete(c.byComm, g.spec.CommID)
			if i, ok := slices.BinarySearch(c.names, e.Group); ok {
				c.names = slices.Delete(c.names, i, i+1)
			}
			for _, w := range g.due {
				if !w.done {
					delete(c.works, w.id)
				}
			}
		}
	case EvSetTimeout:
		if e.Timeout > 0 {
			c.group(e.Group).timeout = e.Timeout
		}
	case EvScheduled:
		return c.Scheduled(e)
	case EvStarted:
		c.Started(e.ID)
	case EvCompleted:
		return c.Completed(e.ID, e.Err)
	case EvTick:
		return c.tick(e.Now)
	case EvAsyncError:
		return c.asyncError(e)
	case EvRemoteAbort:
		return c.remoteAbort(e.CommID, e.Record)
	case EvProgress:
		if g := c.byComm[e.CommID]; g != nil && e.Rank != c.cfg.Rank {
			g.peers[e.Rank] = e.Progress
		}
	}
	return nil
}

func (c *WatchdogCore) group(name string) *wdGroup {
	if g := c.last; g != nil && g.spec.Name == name {
		return g
	}
	g := c.groups[name]
	if g == nil {
		g = c.newGroup(GroupSpec{Name: name})
	}
	c.last = g
	return g
}

func (c *WatchdogCore) newGroup(spec GroupSpec) *wdGroup {
	if spec.CommID == "" {
		spec.CommID = CommID(spec.Name, spec.Epoch)
	}
	g := &wdGroup{spec: spec, timeout: spec.Timeout, peers: map[int]Progress{}}
	old := c.groups[spec.Name]
	c.last = nil
	switch {
	case g.timeout > 0:
	case old != nil: // a restarted group keeps its SetTimeout
		g.timeout = old.timeout
	default:
		g.timeout = c.cfg.Timeout
	}
	if old != nil {
		delete(c.byComm, old.spec.CommID)
		g.due, g.nDone = old.due, old.nDone // the Works in flight stay (addGroup drops other epochs')
	} else {
		i, _ := slices.BinarySearch(c.names, spec.Name)
		c.names = slices.Insert(c.names, i, spec.Name)
	}
	c.groups[spec.Name] = g
	c.byComm[spec.CommID] = g
	return g
}

func (c *WatchdogCore) addGroup(spec GroupSpec) []Action {
	// A new epoch of a group starts clean; Works of other epochs are
	// dropped (the old communicator fails them).
	if old := c.groups[spec.Name]; old != nil {
		for _, w := range old.due {
			if !w.done && w.fp.Epoch != spec.Epoch {
				c.drop(old, w)
			}
		}
	}
	g := c.newGroup(spec)
	if rec, ok := c.pending[g.spec.CommID]; ok {
		delete(c.pending, g.spec.CommID)
		return c.remoteAbort(g.spec.CommID, rec)
	}
	return nil
}

// Scheduled is Step(EvScheduled), without boxing the event (the watchdog
// actor calls it once per op).
func (c *WatchdogCore) Scheduled(e EvScheduled) []Action {
	if c.tornDown {
		return nil
	}
	g := c.group(e.Group)
	if g.aborted {
		return []Action{ActFailWork{ID: e.ID, Err: &comm.AbortedError{Group: e.Group, Reason: g.abortErr}}}
	}
	if d := g.deferred; d != nil && failsAt(e.FP, d.seq) {
		return []Action{ActFailWork{ID: e.ID, Err: d.cause}}
	}
	timeout := e.Timeout
	if timeout <= 0 {
		timeout = g.timeout
	}
	w := c.newWork()
	*w = wdWork{id: e.ID, group: e.Group, fp: e.FP, at: e.At, timeout: timeout, deadline: e.At.Add(timeout)}
	c.works[e.ID] = w
	g.push(w)
	if !e.FP.Op.IsP2P() {
		g.local.Launched = max(g.local.Launched, e.FP.Seq)
	}
	return nil
}

// Finished is Scheduled followed by Completed(nil) for a Work that had
// already completed successfully when the watchdog first saw it, without
// tracking it (no map entry, no heap push): the group's launched, started
// and completed watermarks move to its seq. It returns false, doing
// nothing, when the Work must take the full path instead: its group is
// aborted (Scheduled fails such Works). After a teardown it ignores the
// Work, as Scheduled does.
func (c *WatchdogCore) Finished(group string, fp comm.Fingerprint) bool {
	if c.tornDown {
		return true
	}
	g := c.group(group)
	if g.aborted {
		return false
	}
	if !fp.Op.IsP2P() {
		g.local.Launched = max(g.local.Launched, fp.Seq)
		g.local.Started = max(g.local.Started, fp.Seq)
		g.local.Completed = max(g.local.Completed, fp.Seq)
	}
	return true
}

// Started is Step(EvStarted{ID: id}), without boxing the event: it moves
// the group's started watermark.
func (c *WatchdogCore) Started(id WorkID) {
	if w := c.works[id]; w != nil && !c.tornDown && !w.fp.Op.IsP2P() {
		g := c.group(w.group)
		g.local.Started = max(g.local.Started, w.fp.Seq)
	}
}

// Completed is Step(EvCompleted{ID: id, Err: err}), without boxing the
// event: it moves the group's watermarks, or treats an engine-detected
// failure as an incident.
func (c *WatchdogCore) Completed(id WorkID, err error) []Action {
	w := c.works[id]
	if w == nil || c.tornDown {
		return nil
	}
	g := c.group(w.group)
	c.drop(g, w)
	if err == nil && !w.fp.Op.IsP2P() {
		g.local.Started = max(g.local.Started, w.fp.Seq)
		g.local.Completed = max(g.local.Completed, w.fp.Seq)
	}
	if d := g.deferred; d != nil {
		// An abort that started at a later seq waits for this group's
		// earlier Works (abortAt); it is the cause, whatever this one's
		// outcome.
		if c.liveBefore(g, d.seq) {
			return nil
		}
		g.deferred = nil
		return append(c.failGroupWorks(g.spec.Name, d.cause), c.incident(g, d.cause, d.reason, d.remote, d.seq)...)
	}
	if err == nil {
		return nil
	}
	// An engine-detected failure breaks the communicator: handle it like an
	// async error so that peers learn of it. Errors that are themselves
	// consequences of an abort, or the caller's, are not incidents.
	if g.aborted || !(errors.Is(err, comm.ErrTransport) || errors.Is(err, comm.ErrMismatch) || errors.Is(err, comm.ErrEngine)) {
		return nil
	}
	return c.incident(g, err, fmt.Sprintf("rank %d: %v failed: %v", c.cfg.Rank, w.fp, err), false, w.fp.Seq)
}

// newWork takes a recycled wdWork, or a new one.
func (c *WatchdogCore) newWork() *wdWork {
	if n := len(c.free); n > 0 {
		w := c.free[n-1]
		c.free = c.free[:n-1]
		return w
	}
	return &wdWork{}
}

// drop forgets live Work w of group g: it is marked done and leaves g's
// heap lazily (compacting the heap once done entries outnumber live ones).
// w's fields stay readable until the next Scheduled.
func (c *WatchdogCore) drop(g *wdGroup, w *wdWork) {
	delete(c.works, w.id)
	w.done = true
	g.nDone++
	if live := len(g.due) - g.nDone; g.nDone > 64 && g.nDone > 2*live {
		c.compact(g)
	}
}

// compact removes g's done entries from its heap and recycles them.
func (c *WatchdogCore) compact(g *wdGroup) {
	keep := g.due[:0]
	for _, w := range g.due {
		if w.done {
			c.free = append(c.free, w)
		} else {
			keep = append(keep, w)
		}
	}
	clear(g.due[len(keep):])
	g.due, g.nDone = keep, 0
	for i := len(g.due)/2 - 1; i >= 0; i-- {
		g.down(i)
	}
}

// popDone removes done entries from the top of g's heap.
func (c *WatchdogCore) popDone(g *wdGroup) {
	for len(g.due) > 0 && g.due[0].done {
		c.free = append(c.free, g.pop())
		g.nDone--
	}
}

// The deadline heap of a group: (deadline, id) order.
func wdLess(a, b *wdWork) bool {
	if d := a.deadline.Compare(b.deadline); d != 0 {
		return d < 0
	}
	return a.id < b.id
}

func (g *wdGroup) push(w *wdWork) {
	g.due = append(g.due, w)
	for i := len(g.due) - 1; i > 0; {
		p := (i - 1) / 2
		if !wdLess(g.due[i], g.due[p]) {
			break
		}
		g.due[i], g.due[p] = g.due[p], g.due[i]
		i = p
	}
}

func (g *wdGroup) pop() *wdWork {
	n := len(g.due) - 1
	top := g.due[0]
	g.due[0] = g.due[n]
	g.due[n] = nil
	g.due = g.due[:n]
	g.down(0)
	return top
}

func (g *wdGroup) down(i int) {
	for n := len(g.due); ; {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && wdLess(g.due[r], g.due[l]) {
			m = r
		}
		if !wdLess(g.due[m], g.due[i]) {
			return
		}
		g.due[i], g.due[m] = g.due[m], g.due[i]
		i = m
	}
}

// dueAt appends g's live Works whose deadline is not after now, walking
// only the heap's entries at or before now (and their children).
func (c *WatchdogCore) dueAt(g *wdGroup, i int, now time.Time, out []*wdWork) []*wdWork {
	if i >= len(g.due) {
		return out
	}
	c.visited++
	w := g.due[i]
	if now.Before(w.deadline) {
		return out
	}
	if !w.done {
		out = append(out, w)
	}
	out = c.dueAt(g, 2*i+1, now, out)
	return c.dueAt(g, 2*i+2, now, out)
}

func (c *WatchdogCore) tick(now time.Time) []Action {
	var acts []Action
	// Deadlines: each group's heap is looked at only down to its first
	// entry not yet due; the due Works of all groups fail earliest first
	// (then by id).
	var due []*wdWork
	for _, n := range c.names {
		g := c.groups[n]
		c.popDone(g)
		due = c.dueAt(g, 0, now, due)
	}
	if len(due) > 1 {
		slices.SortFunc(due, func(a, b *wdWork) int {
			if wdLess(a, b) {
				return -1
			}
			return 1
		})
	}
	for _, w := range due {
		if c.tornDown {
			break
		}
		if w.done { // already failed by an earlier incident
			continue
		}
		g := c.group(w.group)
		terr := c.timeoutError(g, w, now)
		c.drop(g, w)
		acts = append(acts, ActFailWork{ID: w.id, Err: terr})
		acts = append(acts, c.incident(g, terr, terr.Error(), false, w.fp.Seq)...)
	}
	if c.tornDown {
		return acts
	}
	// Progress publishing, rate-limited per group.
	for _, n := range c.names {
		g := c.groups[n]
		if g.local != g.published && now.Sub(g.lastPub) >= c.cfg.ProgressInterval {
			g.published, g.lastPub = g.local, now
			acts = append(acts, ActPublishProgress{CommID: g.spec.CommID, Progress: g.local})
		}
	}
	return acts
}

// timeoutError builds the report for w, naming which members have reached
// (started) and completed its seq, from local and published progress.
func (c *WatchdogCore) timeoutError(g *wdGroup, w *wdWork, now time.Time) *comm.TimeoutError {
	e := &comm.TimeoutError{Rank: c.cfg.Rank, FP: w.fp, Group: w.group, Timeout: w.timeout, Elapsed: now.Sub(w.at)}
	if w.fp.Op.IsP2P() {
		return e // P2P has its own sequence; peers' collective progress says nothing
	}
	s := w.fp.Seq
	for _, r := range g.spec.Members {
		p, ok := g.peers[r]
		if r == c.cfg.Rank {
			p, ok = g.local, true // exact: a rank whose engine never began s names itself
		}
		switch {
		case ok && p.Completed >= s:
			e.Completed = append(e.Completed, r)
			e.Reached = append(e.Reached, r)
		case ok && p.Started >= s:
			e.Reached = append(e.Reached, r)
		default:
			e.NotReached = append(e.NotReached, r)
		}
	}
	return e
}

func (c *WatchdogCore) asyncError(e EvAsyncError) []Action {
	g := c.groups[e.Group]
	if g == nil || g.aborted || e.Err == nil {
		return nil
	}
	// Typed errors (a mismatch, a remote abort, a dead peer) keep their
	// type, so that errors.Is/As still find them in every failed Work;
	// anything else becomes an *EngineError.
	cause := e.Err
	if !isTyped(cause) {
		ee := &comm.EngineError{Engine: g.spec.Engine, Rank: c.cfg.Rank, Msg: e.Err.Error()}
		if w := c.oldest(e.Group); w != nil {
			ee.FP = w.fp
		}
		cause = ee
	}
	_, seq := comm.Blame(cause, c.cfg.Rank, g.spec.Members)
	return c.abortAt(g, cause, seq, fmt.Sprintf("rank %d: async engine error on group %q: %v", c.cfg.Rank, e.Group, cause), false)
}

func (c *WatchdogCore) remoteAbort(commID string, rec AbortRecord) []Action {
	if rec.Rank == c.cfg.Rank {
		return nil // our own abort, echoed by the watch
	}
	g := c.byComm[commID]
	if g == nil {
		c.pending[commID] = rec
		return nil
	}
	if g.aborted {
		return nil
	}
	err := &comm.RemoteAbortError{Rank: rec.OriginRank(), Reason: rec.Reason, Seq: rec.Seq, Relay: rec.Rank}
	return c.abortAt(g, err, rec.Seq, fmt.Sprintf("rank %d: %v (group %q)", c.cfg.Rank, err, g.spec.Name), true)
}

// abortAt fails group g's Works with cause, an abort that started at
// collective seq (0: unknown), and applies the incident; but while Works
// of g before seq are still in flight it fails only those from seq on
// (and point-to-point ones, which every failure concerns) and defers the
// rest until the earlier ones end (Completed) or time out (tick). Those
// are ops that every member which reached seq had finished its part of:
// they run on and complete here as they did there, instead of failing on
// this rank alone because the watchdog aborted the communicator under
// them (docs/semantics.md, "An abort is final"). Works launched meanwhile
// from seq on fail at once (Scheduled). An earlier Work that cannot
// complete (it waits on a third rank that hangs) ends at its own deadline
// (tick), with a TimeoutError naming the ranks that never reached it.
func (c *WatchdogCore) abortAt(g *wdGroup, cause error, seq uint64, reason string, remote bool) []Action {
	if seq == 0 {
		seq = c.failingSeq(g)
	}
	if !c.liveBefore(g, seq) {
		return append(c.failGroupWorks(g.spec.Name, cause), c.incident(g, cause, reason, remote, seq)...)
	}
	if g.deferred == nil {
		g.deferred = &deferredAbort{cause: cause, reason: reason, seq: seq, remote: remote}
	}
	return c.failWorksFrom(g, g.deferred.cause, g.deferred.seq)
}

// failingSeq is the first collective seq of g that a failure naming none
// concerns (a user's abort): g's oldest collective Work in flight, which
// it fails, else the next one g launches. The collectives g completed
// succeeded here and must not fail on the peers for its sake (the CPU
// engine's failingSeq, for its own notices).
func (c *WatchdogCore) failingSeq(g *wdGroup) uint64 {
	seq := g.local.Launched + 1
	for _, w := range g.due {
		if !w.done && !w.fp.Op.IsP2P() && w.fp.Seq < seq {
			seq = w.fp.Seq
		}
	}
	return seq
}

// failsAt reports whether an abort that started at collective seq fails
// the op of fp: a collective from seq on, or a point-to-point op.
func failsAt(fp comm.Fingerprint, seq uint64) bool {
	return fp.Op.IsP2P() || fp.Seq >= seq
}

// liveBefore reports whether a collective of g before seq is in flight.
func (c *WatchdogCore) liveBefore(g *wdGroup, seq uint64) bool {
	for _, w := range g.due {
		if !w.done && !failsAt(w.fp, seq) {
			return true
		}
	}
	return false
}

// incident applies the error-handling mode after cause broke group g.
// remote says the abort came from a peer (nothing to announce); seq is
// the collective seq where it started when cause names none
// (comm.Blame), for the abort record.
func (c *WatchdogCore) incident(g *wdGroup, cause error, reason string, remote bool, seq uint64) []Action {
	mode := c.cfg.Mode
	g.deferred = nil // this incident is the one that counts now
	var acts []Action
	if mode != NoHandling {
		g.aborted, g.abortErr = true, cause
		acts = append(acts, c.failGroupWorks(g.spec.Name, &comm.AbortedError{Group: g.spec.Name, Reason: cause})...)
	}
	if mode.abortsComm() {
		acts = append(acts, ActAbortComm{Group: g.spec.Name, Reason: cause})
	}
	if mode.announces() && !remote {
		if g.local != g.published { // peers' diagnosis wants our latest progress
			g.published = g.local
			acts = append(acts, ActPublishProgress{CommID: g.spec.CommID, Progress: g.local})
		}
		origin, blamed := comm.Blame(cause, c.cfg.Rank, g.spec.Members)
		if blamed != 0 {
			seq = blamed
		}
		rec := AbortRecord{Rank: c.cfg.Rank, Group: g.spec.Name, Epoch: g.spec.Epoch, Reason: cause.Error(), Origin: &origin, Seq: seq}
		var ra *comm.RemoteAbortError
		if errors.As(cause, &ra) {
			rec.Reason = ra.Reason // the origin's words, not our relay's
		}
		acts = append(acts, ActWriteAbort{CommID: g.spec.CommID, Record: rec})
	}
	acts = append(acts, ActDump{Reason: reason})
	if mode.exits() {
		c.tornDown = true
		acts = append(acts, ActTearDown{Code: ExitTearDown, Reason: reason})
	}
	return acts
}

// failGroupWorks fails every tracked Work of group with err, in id order.
func (c *WatchdogCore) failGroupWorks(group string, err error) []Action {
	g := c.groups[group]
	if g == nil {
		return nil
	}
	return c.failWorksFrom(g, err, 0)
}

// failWorksFrom fails g's Works in flight that an abort starting at
// collective seq concerns (failsAt; seq 0: every one) with err, in id
// order.
func (c *WatchdogCore) failWorksFrom(g *wdGroup, err error, seq uint64) []Action {
	var acts []Action
	for _, w := range c.sortedLive(g) {
		if failsAt(w.fp, seq) {
			c.drop(g, w)
			acts = append(acts, ActFailWork{ID: w.id, Err: err})
		}
	}
	return acts
}

// sortedLive is g's Works in flight, in id order.
func (c *WatchdogCore) sortedLive(g *wdGroup) []*wdWork {
	var live []*wdWork
	for _, w := range g.due {
		if !w.done {
			live = append(live, w)
		}
	}
	slices.SortFunc(live, func(a, b *wdWork) int { return cmpU64(uint64(a.id), uint64(b.id)) })
	return live
}

// oldest is group's earliest-launched Work in flight (nil if none).
func (c *WatchdogCore) oldest(group string) *wdWork {
	g := c.groups[group]
	if g == nil {
		return nil
	}
	var o *wdWork
	for _, w := range g.due {
		if !w.done && (o == nil || w.id < o.id) {
			o = w
		}
	}
	return o
}

// isTyped reports whether err carries one of comm's failure sentinels, so
// that the watchdog passes it on as it is.
func isTyped(err error) bool {
	for _, s := range []error{comm.ErrMismatch, comm.ErrRemoteAbort, comm.ErrTransport, comm.ErrEngine,
		comm.ErrTimeout, comm.ErrAborted, comm.ErrClosed} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}
