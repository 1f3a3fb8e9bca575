package supervisor

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
)

var t0 = time.Unix(1_700_000_000, 0)

func fpAt(seq uint64) comm.Fingerprint {
	return comm.Fingerprint{Group: comm.GroupHash("default_pg"), Seq: seq, Op: comm.OpAllReduce, DType: comm.Float32,
		RedOp: comm.RedSum, Count: 1024, Root: -1}
}

// coreWith returns rank's core with default_pg of 4 ranks (timeout 2 s),
// seqs 1..done completed and seqs done+1..launched scheduled at t0 (the
// first of them started).
func coreWith(rank int, mode ErrorHandling, done, launched uint64) *WatchdogCore {
	c := NewWatchdogCore(CoreConfig{Rank: rank, Mode: mode})
	c.Step(EvAddGroup{Spec: GroupSpec{Name: "default_pg", Engine: "cpu", Members: []int{0, 1, 2, 3}, Timeout: 2 * time.Second}})
	for seq := uint64(1); seq <= launched; seq++ {
		c.Step(EvScheduled{ID: WorkID(seq), Group: "default_pg", FP: fpAt(seq), At: t0})
		if seq <= done+1 {
			c.Step(EvStarted{ID: WorkID(seq)})
		}
		if seq <= done {
			c.Step(EvCompleted{ID: WorkID(seq)})
		}
	}
	return c
}

func kinds(acts []Action) []string {
	var out []string
	for _, a := range acts {
		s := fmt.Sprintf("%T", a)
		s = strings.TrimPrefix(s, "supervisor.Act")
		if f, ok := a.(ActFailWork); ok {
			var te *comm.TimeoutError
			var ae *comm.AbortedError
			var re *comm.RemoteAbortError
			var ee *comm.EngineError
			switch {
			case errors.As(f.Err, &ae): // before TimeoutError: an AbortedError wraps its cause
				s += fmt.Sprintf("(%d,aborted)", f.ID)
			case errors.As(f.Err, &te):
				s += fmt.Sprintf("(%d,timeout)", f.ID)
			case errors.As(f.Err, &re):
				s += fmt.Sprintf("(%d,remote)", f.ID)
			case errors.As(f.Err, &ee):
				s += fmt.Sprintf("(%d,engine)", f.ID)
			default:
				s += fmt.Sprintf("(%d,%v)", f.ID, f.Err)
			}
		}
		out = append(out, s)
	}
	return out
}

func TestWatchdogTimeoutNamesStuckRank(t *testing.T) {
	c := coreWith(0, TearDown, 4, 5)
	// Peers' published progress: ranks 2 and 3 started seq 5; rank 1 only
	// launched it (its engine never began it).
	c.Step(EvProgress{CommID: "default_pg.0", Rank: 1, Progress: Progress{Launched: 5, Started: 4, Completed: 4}})
	c.Step(EvProgress{CommID: "default_pg.0", Rank: 2, Progress: Progress{Launched: 5, Started: 5, Completed: 4}})
	c.Step(EvProgress{CommID: "default_pg.0", Rank: 3, Progress: Progress{Launched: 6, Started: 5, Completed: 4}})
	c.Step(EvProgress{CommID: "other.0", Rank: 1, Progress: Progress{Launched: 9, Started: 9, Completed: 9}}) // ignored

	acts := c.Step(EvTick{Now: t0.Add(1999 * time.Millisecond)})
	want := []Action{ActPublishProgress{CommID: "default_pg.0", Progress: Progress{Launched: 5, Started: 5, Completed: 4}}}
	if !reflect.DeepEqual(acts, want) {
		t.Fatalf("before the deadline: %#v", acts)
	}
	acts = c.Step(EvTick{Now: t0.Add(2 * time.Second)})
	terr := &comm.TimeoutError{Rank: 0, FP: fpAt(5), Group: "default_pg", Timeout: 2 * time.Second, Elapsed: 2 * time.Second,
		Reached: []int{0, 2, 3}, NotReached: []int{1}}
	want = []Action{
		ActFailWork{ID: 5, Err: terr},
		ActAbortComm{Group: "default_pg", Reason: terr},
		ActWriteAbort{CommID: "default_pg.0", Record: AbortRecord{Rank: 0, Group: "default_pg", Reason: terr.Error(), Origin: new(1), Seq: 5}},
		ActDump{Reason: terr.Error()},
		ActTearDown{Code: ExitTearDown, Reason: terr.Error()},
	}
	if !reflect.DeepEqual(acts, want) {
		t.Fatalf("at the deadline:\n got %v\nwant %v", kinds(acts), kinds(want))
	}
	msg := terr.Error()
	for _, s := range []string{"ranks [1] have not reached seq 5", "seq 5 AllReduce", "2s"} {
		if !strings.Contains(msg, s) {
			t.Errorf("timeout message %q lacks %q", msg, s)
		}
	}
	if !errors.Is(acts[0].(ActFailWork).Err, comm.ErrTimeout) || !c.TornDown() {
		t.Error("not ErrTimeout, or not torn down")
	}
	if acts := c.Step(EvTick{Now: t0.Add(time.Hour)}); acts != nil {
		t.Errorf("after teardown the core still acts: %v", kinds(acts))
	}
}

func TestWatchdogHungRankNamesItself(t *testing.T) {
	// Rank 1's engine hangs before starting seq 5: its own report says so.
	c := NewWatchdogCore(CoreConfig{Rank: 1, Mode: CleanupOnly})
	c.Step(EvAddGroup{Spec: GroupSpec{Name: "default_pg", Members: []int{0, 1}, Timeout: time.Second}})
	c.Step(EvScheduled{ID: 5, Group: "default_pg", FP: fpAt(5), At: t0})
	c.Step(EvProgress{CommID: "default_pg.0", Rank: 0, Progress: Progress{Launched: 5, Started: 5, Completed: 4}})
	acts := c.Step(EvTick{Now: t0.Add(time.Second)})
	te := acts[0].(ActFailWork).Err.(*comm.TimeoutError)
	if !reflect.DeepEqual(te.NotReached, []int{1}) || !reflect.DeepEqual(te.Reached, []int{0}) {
		t.Errorf("reached %v not reached %v", te.Reached, te.NotReached)
	}
}

func TestWatchdogModes(t *testing.T) {
	for _, tc := range []struct {
		mode     ErrorHandling
		want     []string
		inFlight int
		aborted  bool
	}{
		{TearDown, []string{"FailWork(5,timeout)", "FailWork(6,aborted)", "AbortComm", "PublishProgress", "WriteAbort", "Dump", "TearDown"}, 0, true},
		{CleanupOnly, []string{"FailWork(5,timeout)", "FailWork(6,aborted)", "AbortComm", "PublishProgress", "WriteAbort", "Dump"}, 0, true},
		{SkipCleanup, []string{"FailWork(5,timeout)", "FailWork(6,aborted)", "PublishProgress", "WriteAbort", "Dump", "TearDown"}, 0, true},
		{NoHandling, []string{"FailWork(5,timeout)", "Dump", "PublishProgress"}, 1, false},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			c := coreWith(0, tc.mode, 4, 5)
			// Seq 6 is scheduled later with a later deadline.
			c.Step(EvScheduled{ID: 6, Group: "default_pg", FP: fpAt(6), At: t0.Add(time.Second)})
			got := kinds(c.Step(EvTick{Now: t0.Add(2500 * time.Millisecond)}))
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("actions %v, want %v", got, tc.want)
			}
			if c.InFlight() != tc.inFlight || c.Aborted("default_pg") != tc.aborted {
				t.Errorf("in flight %d aborted %v; want %d %v", c.InFlight(), c.Aborted("default_pg"), tc.inFlight, tc.aborted)
			}
			if tc.mode == CleanupOnly {
				// Later ops fail fast with ErrAborted; the process lives on.
				acts := c.Step(EvScheduled{ID: 7, Group: "default_pg", FP: fpAt(7), At: t0.Add(3 * time.Second)})
				if len(acts) != 1 || !errors.Is(acts[0].(ActFailWork).Err, comm.ErrAborted) ||
					!strings.Contains(acts[0].(ActFailWork).Err.Error(), "aborted") {
					t.Errorf("op after abort: %v", kinds(acts))
				}
				// A new epoch of the group works again.
				c.Step(EvAddGroup{Spec: GroupSpec{Name: "default_pg", Epoch: 1, Members: []int{0, 1, 2, 3}}})
				if acts := c.Step(EvScheduled{ID: 8, Group: "default_pg", FP: fpAt(1), At: t0.Add(3 * time.Second)}); len(acts) != 0 || c.InFlight() != 1 {
					t.Errorf("op after restart: %v, in flight %d", kinds(acts), c.InFlight())
				}
			}
			if tc.mode == NoHandling {
				// Seq 6 times out on its own deadline.
				got := kinds(c.Step(EvTick{Now: t0.Add(3 * time.Second)}))
				if !reflect.DeepEqual(got, []string{"FailWork(6,timeout)", "Dump"}) {
					t.Errorf("second timeout: %v", got)
				}
			}
		})
	}
}

func TestWatchdogDeadlines(t *testing.T) {
	c := NewWatchdogCore(CoreConfig{Rank: 0, Mode: CleanupOnly})
	c.Step(EvAddGroup{Spec: GroupSpec{Name: "g", Members: []int{0, 1}}}) // default 10 min
	c.Step(EvScheduled{ID: 1, Group: "g", FP: fpAt(1), At: t0})
	c.Step(EvScheduled{ID: 2, Group: "g", FP: fpAt(2), At: t0, Timeout: 3 * time.Second}) // per-op override
	if acts := c.Step(EvTick{Now: t0.Add(2999 * time.Millisecond)}); len(kinds(acts)) != 1 {
		t.Errorf("early tick: %v", kinds(acts)) // only progress
	}
	acts := c.Step(EvTick{Now: t0.Add(3 * time.Second)})
	if got := kinds(acts); got[0] != "FailWork(2,timeout)" || got[1] != "FailWork(1,aborted)" {
		t.Errorf("per-op override: %v", got)
	}

	c = NewWatchdogCore(CoreConfig{Rank: 0, Mode: NoHandling, Timeout: time.Minute})
	c.Step(EvAddGroup{Spec: GroupSpec{Name: "g", Members: []int{0, 1}}})
	c.Step(EvScheduled{ID: 1, Group: "g", FP: fpAt(1), At: t0})
	c.Step(EvSetTimeout{Group: "g", Timeout: 5 * time.Second}) // applies to later Works
	c.Step(EvScheduled{ID: 2, Group: "g", FP: fpAt(2), At: t0})
	if got := kinds(c.Step(EvTick{Now: t0.Add(5 * time.Second)})); !reflect.DeepEqual(got, []string{"FailWork(2,timeout)", "Dump", "PublishProgress"}) {
		t.Errorf("SetTimeout: %v", got)
	}
	if got := kinds(c.Step(EvTick{Now: t0.Add(time.Minute)})); got[0] != "FailWork(1,timeout)" {
		t.Errorf("core default: %v", got)
	}
	// Completed Works never time out.
	c.Step(EvScheduled{ID: 3, Group: "g", FP: fpAt(3), At: t0})
	c.Step(EvCompleted{ID: 3})
	if got := kinds(c.Step(EvTick{Now: t0.Add(time.Hour)})); len(got) > 1 {
		t.Errorf("completed work acted on: %v", got)
	}
}

func TestWatchdogP2PTimeout(t *testing.T) {
	c := NewWatchdogCore(CoreConfig{Rank: 0, Mode: CleanupOnly})
	c.Step(EvAddGroup{Spec: GroupSpec{Name: "g", Members: []int{0, 1}, Timeout: time.Second}})
	fp := comm.Fingerprint{Seq: 1, Op: comm.OpRecv, DType: comm.Int32, Count: 4, Root: 1}
	c.Step(EvScheduled{ID: 1, Group: "g", FP: fp, At: t0})
	acts := c.Step(EvTick{Now: t0.Add(time.Second)})
	te, ok := acts[0].(ActFailWork).Err.(*comm.TimeoutError)
	if !ok || te.FP.Op != comm.OpRecv || te.Reached != nil || te.NotReached != nil {
		t.Fatalf("P2P timeout: %v", kinds(acts))
	}
	if !strings.Contains(te.Error(), "Recv(int32×4, peer 1)") {
		t.Errorf("message %q", te.Error())
	}
}

func TestWatchdogAsyncError(t *testing.T) {
	c := coreWith(0, CleanupOnly, 2, 4)
	acts := c.Step(EvAsyncError{Group: "default_pg", Err: errors.New("ncclRemoteError: peer went away")})
	want := []string{"FailWork(3,engine)", "FailWork(4,engine)", "AbortComm", "PublishProgress", "WriteAbort", "Dump"}
	if got := kinds(acts); !reflect.DeepEqual(got, want) {
		t.Fatalf("async error: %v, want %v", got, want)
	}
	ee := acts[0].(ActFailWork).Err.(*comm.EngineError)
	if ee.Engine != "cpu" || ee.FP.Seq != 3 || !strings.Contains(ee.Error(), "peer went away") || !errors.Is(ee, comm.ErrEngine) {
		t.Errorf("engine error %#v", ee)
	}
	if acts := c.Step(EvAsyncError{Group: "default_pg", Err: errors.New("again")}); acts != nil {
		t.Errorf("second async error acted: %v", kinds(acts))
	}
	// A typed engine error is passed through as is.
	c = coreWith(0, NoHandling, 0, 1)
	orig := &comm.EngineError{Engine: "nccl", Rank: 0, FP: fpAt(1), Msg: "unhandled cuda error"}
	acts = c.Step(EvAsyncError{Group: "default_pg", Err: orig})
	if got := kinds(acts); !reflect.DeepEqual(got, []string{"FailWork(1,engine)", "Dump"}) || acts[0].(ActFailWork).Err != orig {
		t.Errorf("typed async error: %v", got)
	}
}

func TestWatchdogRemoteAbort(t *testing.T) {
	c := coreWith(3, TearDown, 4, 6)
	rec := AbortRecord{Rank: 0, Group: "default_pg", Reason: "comm: timeout: rank 0: seq 5 ...; ranks [1] have not reached seq 5"}
	if acts := c.Step(EvRemoteAbort{CommID: "default_pg.0", Record: AbortRecord{Rank: 3}}); acts != nil {
		t.Errorf("own abort echo acted: %v", kinds(acts))
	}
	acts := c.Step(EvRemoteAbort{CommID: "default_pg.0", Record: rec})
	want := []string{"FailWork(5,remote)", "FailWork(6,remote)", "AbortComm", "Dump", "TearDown"}
	if got := kinds(acts); !reflect.DeepEqual(got, want) {
		t.Fatalf("remote abort: %v, want %v", got, want)
	}
	re := acts[0].(ActFailWork).Err.(*comm.RemoteAbortError)
	if re.Rank != 0 || !errors.Is(re, comm.ErrRemoteAbort) || !strings.Contains(re.Error(), "ranks [1] have not reached seq 5") {
		t.Errorf("remote abort error %v", re)
	}
}

func TestWatchdogRemoteAbortBeforeGroupRegistered(t *testing.T) {
	c := NewWatchdogCore(CoreConfig{Rank: 1, Mode: CleanupOnly})
	if acts := c.Step(EvRemoteAbort{CommID: "pg1.2", Record: AbortRecord{Rank: 0, Reason: "boom"}}); acts != nil {
		t.Fatalf("abort of an unknown comm acted: %v", kinds(acts))
	}
	acts := c.Step(EvAddGroup{Spec: GroupSpec{Name: "pg1", Epoch: 2, Members: []int{0, 1}}})
	if got := kinds(acts); !reflect.DeepEqual(got, []string{"AbortComm", "Dump"}) || !c.Aborted("pg1") {
		t.Errorf("pending abort on registration: %v", got)
	}
	// Another epoch's abort does not touch the new communicator.
	c.Step(EvAddGroup{Spec: GroupSpec{Name: "pg1", Epoch: 3, Members: []int{0, 1}}})
	if acts := c.Step(EvRemoteAbort{CommID: "pg1.2", Record: AbortRecord{Rank: 0}}); acts != nil || c.Aborted("pg1") {
		t.Errorf("stale epoch's abort acted: %v", kinds(acts))
	}
}

func TestWatchdogEngineFailedWork(t *testing.T) {
	c := coreWith(0, SkipCleanup, 2, 4)
	terr := &comm.TransportError{Rank: 0, Peer: 2, FP: fpAt(3), Err: errors.New("connection reset")}
	acts := c.Step(EvCompleted{ID: 3, Err: terr})
	want := []string{"FailWork(4,aborted)", "PublishProgress", "WriteAbort", "Dump", "TearDown"}
	if got := kinds(acts); !reflect.DeepEqual(got, want) {
		t.Errorf("transport failure: %v, want %v", got, want)
	}
	// Failures that follow an abort, or the caller's own, are no incidents.
	c = coreWith(0, TearDown, 0, 3)
	for id, err := range map[WorkID]error{
		1: &comm.AbortedError{Group: "default_pg"},
		2: fmt.Errorf("%w: closed", comm.ErrClosed),
		3: &comm.ArgError{Msg: "bad"},
	} {
		if acts := c.Step(EvCompleted{ID: id, Err: err}); acts != nil {
			t.Errorf("completion with %v acted: %v", err, kinds(acts))
		}
	}
}

func TestWatchdogProgressRateLimited(t *testing.T) {
	c := NewWatchdogCore(CoreConfig{Rank: 0, ProgressInterval: time.Second})
	c.Step(EvAddGroup{Spec: GroupSpec{Name: "g", Members: []int{0}}})
	var published []Progress
	for i := 0; i < 30; i++ { // one op per 100 ms
		now := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		c.Step(EvScheduled{ID: WorkID(i + 1), Group: "g", FP: fpAt(uint64(i + 1)), At: now})
		c.Step(EvCompleted{ID: WorkID(i + 1)})
		for _, a := range c.Step(EvTick{Now: now}) {
			published = append(published, a.(ActPublishProgress).Progress)
		}
	}
	if len(published) != 3 || published[0].Completed != 1 || published[1].Completed != 11 || published[2].Completed != 21 {
		t.Errorf("published %+v, want seqs 1, 11, 21", published)
	}
	if acts := c.Step(EvTick{Now: t0.Add(time.Hour)}); len(acts) != 1 || acts[0].(ActPublishProgress).Progress.Completed != 30 {
		t.Errorf("final publish %v", acts)
	}
	if acts := c.Step(EvTick{Now: t0.Add(2 * time.Hour)}); acts != nil {
		t.Errorf("unchanged progress republished: %v", acts)
	}
}

func TestWatchdogRemoveGroup(t *testing.T) {
	c := coreWith(0, TearDown, 0, 3)
	c.Step(EvRemoveGroup{Group: "default_pg"})
	if c.InFlight() != 0 {
		t.Errorf("in flight %d after removal", c.InFlight())
	}
	if acts := c.Step(EvTick{Now: t0.Add(time.Hour)}); acts != nil {
		t.Errorf("removed group acted: %v", kinds(acts))
	}
}

func TestWatchdogNewEpochDropsOnlyOldWorks(t *testing.T) {
	c := coreWith(0, CleanupOnly, 0, 2) // epoch 0 Works 1 and 2 in flight
	fp := fpAt(1)
	fp.Epoch = 1
	c.Step(EvScheduled{ID: 10, Group: "default_pg", FP: fp, At: t0}) // the new epoch's first op, before registration
	c.Step(EvAddGroup{Spec: GroupSpec{Name: "default_pg", Epoch: 1, Members: []int{0, 1, 2, 3}, Timeout: time.Second}})
	if c.InFlight() != 1 {
		t.Fatalf("in flight %d, want only the epoch-1 Work", c.InFlight())
	}
	acts := c.Step(EvTick{Now: t0.Add(time.Hour)})
	if got := kinds(acts); len(got) == 0 || got[0] != "FailWork(10,timeout)" {
		t.Errorf("epoch-1 Work not watched: %v", got)
	}
}

// TestWatchdogKeepsTypedAsyncErrors: a mismatch or a remote abort the
// engine reports asynchronously keeps its type in every failed Work
// (errors.Is(err, comm.ErrMismatch) holds), and the abort record names
// where the failure started, not the rank that relays it.
func TestWatchdogKeepsTypedAsyncErrors(t *testing.T) {
	mm := &comm.MismatchError{LocalRank: 1, RemoteRank: 0, Local: fpAt(3), Remote: fpAt(3)}
	mm.Remote.Root = 0
	cases := []struct {
		name       string
		err        error
		sentinel   error
		origin     int
		seq        uint64
		wantReason string
	}{
		{"mismatch", mm, comm.ErrMismatch, 0, 3, "collective mismatch"},
		{"remote abort", &comm.RemoteAbortError{Rank: 2, Seq: 3, Relay: 1, Reason: "rank 2 gave up"}, comm.ErrRemoteAbort, 2, 3, "rank 2 gave up"},
		{"dead peer", &comm.TransportError{Rank: 0, Peer: 3, FP: fpAt(3), Err: errors.New("EOF")}, comm.ErrTransport, 3, 3, "EOF"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := coreWith(0, CleanupOnly, 2, 3)
			acts := c.Step(EvAsyncError{Group: "default_pg", Err: tc.err})
			var rec *AbortRecord
			for _, a := range acts {
				switch a := a.(type) {
				case ActFailWork:
					if !errors.Is(a.Err, tc.sentinel) {
						t.Errorf("failed Work %d with %v: errors.Is(%v) is false", a.ID, a.Err, tc.sentinel)
					}
				case ActWriteAbort:
					rec = &a.Record
				}
			}
			if rec == nil {
				t.Fatalf("no abort record written: %v", kinds(acts))
			}
			if rec.Rank != 0 || rec.OriginRank() != tc.origin || rec.Seq != tc.seq || !strings.Contains(rec.Reason, tc.wantReason) {
				t.Errorf("abort record %+v (origin %d), want written by 0, origin %d, seq %d, reason with %q", rec, rec.OriginRank(), tc.origin, tc.seq, tc.wantReason)
			}
			// A peer reading this record blames the origin and says who
			// reported it.
			p := coreWith(3, CleanupOnly, 2, 3)
			pa := p.Step(EvRemoteAbort{CommID: "default_pg.0", Record: *rec})
			var re *comm.RemoteAbortError
			if len(pa) == 0 || !errors.As(pa[0].(ActFailWork).Err, &re) || re.Rank != tc.origin || re.Relay != 0 || re.Seq != tc.seq {
				t.Errorf("peer's error %v, want a RemoteAbortError naming rank %d at seq %d, relayed by 0", pa, tc.origin, tc.seq)
			}
		})
	}
}

// TestWatchdogCoreTickCostsGroupsNotWorks checks the watermark design
// (issue 15): a tick with nothing due looks at one heap entry per group
// however many Works are in flight, finished Works leave without a sweep,
// and a steady stream of ops allocates nothing in the core.
func TestWatchdogCoreTickCostsGroupsNotWorks(t *testing.T) {
	c := NewWatchdogCore(CoreConfig{Rank: 0, Mode: TearDown, Timeout: time.Minute})
	groups := []string{"a", "b", "c"}
	for _, g := range groups {
		c.Step(EvAddGroup{Spec: GroupSpec{Name: g, Members: []int{0, 1}}})
	}
	id := WorkID(0)
	for i := range 30000 {
		id++
		c.Step(EvScheduled{ID: id, Group: groups[i%3], FP: fpAt(uint64(i/3 + 1)), At: t0.Add(time.Duration(i) * time.Microsecond)})
	}
	c.visited = 0
	if acts := c.Step(EvTick{Now: t0.Add(30 * time.Second)}); len(kinds(acts)) != 3 { // three progress publications
		t.Fatalf("tick: %v", kinds(acts))
	}
	if c.visited != len(groups) {
		t.Fatalf("a tick with 30000 Works in flight and none due looked at %d entries, want %d (one per group)", c.visited, len(groups))
	}
	// Completing all but the last Work of each group leaves no done
	// entries behind to sweep later.
	for i := WorkID(1); i <= id-3; i++ {
		c.Step(EvStarted{ID: i})
		c.Step(EvCompleted{ID: i})
	}
	if c.InFlight() != 3 {
		t.Fatalf("in flight %d, want 3", c.InFlight())
	}
	total := 0
	for _, g := range groups {
		total += len(c.groups[g].due)
	}
	if total > 3+3*(2*1+64) {
		t.Fatalf("%d heap entries kept for 3 Works in flight", total)
	}
	for _, g := range groups {
		if p := c.groups[g].local; p.Completed != 9999 || p.Launched != 10000 {
			t.Fatalf("group %s watermarks %+v, want completed 9999 launched 10000", g, p)
		}
	}
	// Steady state: schedule, start, complete, tick; no allocation.
	now := t0.Add(31 * time.Second)
	step := func() {
		id++
		c.Scheduled(EvScheduled{ID: id, Group: "a", FP: fpAt(uint64(id)), At: now})
		c.Started(id)
		c.Completed(id, nil)
	}
	for range 1000 {
		step()
	}
	if a := testing.AllocsPerRun(1000, step); a != 0 {
		t.Fatalf("%v allocations per op in the core, want 0", a)
	}
}

// TestWatchdogCoreEarliestDeadlineNotOldest: a later op with a shorter
// timeout (a ctx deadline) times out first, while the older op with the
// long timeout stays in flight (NoHandling fails only the timed-out Work).
func TestWatchdogCoreEarliestDeadlineNotOldest(t *testing.T) {
	c := NewWatchdogCore(CoreConfig{Rank: 0, Mode: NoHandling})
	c.Step(EvAddGroup{Spec: GroupSpec{Name: "default_pg", Members: []int{0, 1, 2, 3}, Timeout: 10 * time.Minute}})
	c.Step(EvScheduled{ID: 1, Group: "default_pg", FP: fpAt(1), At: t0})
	c.Step(EvScheduled{ID: 2, Group: "default_pg", FP: fpAt(2), Timeout: time.Second, At: t0.Add(time.Millisecond)})
	c.Step(EvScheduled{ID: 3, Group: "default_pg", FP: fpAt(3), Timeout: 2 * time.Second, At: t0.Add(2 * time.Millisecond)})
	if acts := c.Step(EvTick{Now: t0.Add(500 * time.Millisecond)}); slices.Contains(kinds(acts), "FailWork(2,timeout)") {
		t.Fatalf("early tick: %v", kinds(acts))
	}
	acts := c.Step(EvTick{Now: t0.Add(3 * time.Second)})
	var failed []string
	for _, k := range kinds(acts) {
		if strings.HasPrefix(k, "FailWork") {
			failed = append(failed, k)
		}
	}
	if !reflect.DeepEqual(failed, []string{"FailWork(2,timeout)", "FailWork(3,timeout)"}) {
		t.Fatalf("failed %v, want Works 2 then 3 timed out", failed)
	}
	if c.InFlight() != 1 || c.oldest("default_pg").id != 1 {
		t.Fatalf("in flight %d, want Work 1 only", c.InFlight())
	}
}

// TestWatchdogAbortSparesEarlierWorks: an abort that started at seq 5 (a
// peer's record, or the engine's async error naming it) while this
// rank's seq 4 is still in flight fails seq 5 and later at once, but
// neither seq 4 nor the communicator: every member that reached seq 5 had
// finished its part of seq 4, which completes here as it did there. The
// incident (the communicator's abort) follows when seq 4 ends; a Work of
// seq 6 launched meanwhile fails at once. An abort at the oldest Work's
// own seq, or one naming no seq, fails everything at once, as before.
func TestWatchdogAbortSparesEarlierWorks(t *testing.T) {
	remote := &comm.RemoteAbortError{Rank: 1, Seq: 5, Reason: "rank 1 timed out"}
	for name, ev := range map[string]WatchdogEvent{
		"remote record": EvRemoteAbort{CommID: "default_pg.0", Record: AbortRecord{Rank: 1, Group: "default_pg", Reason: "rank 1 timed out", Seq: 5}},
		"async error":   EvAsyncError{Group: "default_pg", Err: remote},
	} {
		t.Run(name, func(t *testing.T) {
			c := coreWith(0, CleanupOnly, 3, 5)
			if got := kinds(c.Step(ev)); !reflect.DeepEqual(got, []string{"FailWork(5,remote)"}) {
				t.Fatalf("abort at seq 5 with seq 4 in flight: %v, want only seq 5 failed", got)
			}
			if c.Aborted("default_pg") {
				t.Fatal("communicator aborted under seq 4")
			}
			if got := kinds(c.Step(EvScheduled{ID: 6, Group: "default_pg", FP: fpAt(6), At: t0})); !reflect.DeepEqual(got, []string{"FailWork(6,remote)"}) {
				t.Fatalf("seq 6 launched meanwhile: %v, want it failed at once", got)
			}
			acts := c.Step(EvCompleted{ID: 4})
			if got := kinds(acts); !slices.Contains(got, "AbortComm") || slices.ContainsFunc(got, func(k string) bool { return strings.HasPrefix(k, "FailWork") }) {
				t.Fatalf("seq 4 completed: %v, want the communicator aborted and no Work failed", got)
			}
			if !c.Aborted("default_pg") || c.InFlight() != 0 {
				t.Fatalf("after seq 4: aborted %v, %d in flight", c.Aborted("default_pg"), c.InFlight())
			}
		})
	}
	t.Run("seq 4 times out", func(t *testing.T) {
		c := coreWith(0, CleanupOnly, 3, 5)
		c.Step(EvRemoteAbort{CommID: "default_pg.0", Record: AbortRecord{Rank: 1, Group: "default_pg", Reason: "rank 1 timed out", Seq: 5}})
		got := kinds(c.Step(EvTick{Now: t0.Add(2 * time.Second)}))
		if !slices.Contains(got, "FailWork(4,timeout)") || !slices.Contains(got, "AbortComm") {
			t.Fatalf("seq 4 past its deadline: %v, want it timed out and the communicator aborted", got)
		}
	})
	for name, seq := range map[string]uint64{"at the oldest seq": 4, "no seq": 0} {
		t.Run(name, func(t *testing.T) {
			c := coreWith(0, CleanupOnly, 3, 5)
			got := kinds(c.Step(EvRemoteAbort{CommID: "default_pg.0", Record: AbortRecord{Rank: 1, Group: "default_pg", Reason: "x", Seq: seq}}))
			if !slices.Contains(got, "FailWork(4,remote)") || !slices.Contains(got, "FailWork(5,remote)") || !slices.Contains(got, "AbortComm") {
				t.Fatalf("%v, want seqs 4 and 5 failed and the communicator aborted at once", got)
			}
		})
	}
}

// TestWatchdogAbortRecordSeq: an incident whose cause names no seq (an
// AbortedError: a user's abort) writes the abort record at the first
// collective seq it fails: the oldest Work in flight, or, with none, the
// next seq, not 0 (which would tell the peers to fail every op they
// still run, including those this rank completed).
func TestWatchdogAbortRecordSeq(t *testing.T) {
	for _, c := range []struct {
		done, launched, want uint64
	}{{3, 3, 4}, {3, 5, 4}} {
		core := coreWith(0, CleanupOnly, c.done, c.launched)
		acts := core.Step(EvAsyncError{Group: "default_pg", Err: &comm.AbortedError{Group: "default_pg", Reason: errors.New("user abort")}})
		var rec *AbortRecord
		for _, a := range acts {
			if w, ok := a.(ActWriteAbort); ok {
				rec = &w.Record
			}
		}
		if rec == nil || rec.Seq != c.want {
			t.Fatalf("seqs 1..%d completed, up to %d launched: record %+v (actions %v), want seq %d", c.done, c.launched, rec, kinds(acts), c.want)
		}
	}
}
