package groups

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/supervisor"
)

// The restart core is tested as supervisor's WatchdogCore is: events in,
// actions out, time as an argument; no process, store or goroutine.

func abortOf(group string, epoch uint32, current uint32) abortObserved {
	rec := supervisor.AbortRecord{Rank: 1, Group: group, Epoch: epoch, Reason: "panic"}
	return abortObserved{CommID: supervisor.CommID(group, epoch), Rec: rec, Current: current, HasCurrent: true}
}

func TestRestartCoreRestartsCurrentEpochOnce(t *testing.T) {
	c := newRestartCore(true, MaxAutoRestarts, AutoRestartWindow)
	t0 := time.Unix(1000, 0)
	ev := abortOf("default_pg", 3, 3)
	got := c.Step(ev, t0)
	want := []restartAction{restartGroupAction{Group: "default_pg", Epoch: 3, Rec: ev.Rec}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("first abort: %+v, want %+v", got, want)
	}
	if got := c.Step(ev, t0.Add(time.Second)); got != nil {
		t.Fatalf("the same epoch's abort again: %+v, want nothing (once per epoch)", got)
	}
	if got := c.Step(groupCreated{Group: "default_pg", Epoch: 3}, t0); got != nil {
		t.Fatalf("groupCreated for a handled epoch: %+v", got)
	}
}

func TestRestartCoreIgnores(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for name, tc := range map[string]struct {
		policy bool
		ev     abortObserved
	}{
		"policy off":          {false, abortOf("g", 1, 1)},
		"older epoch":         {true, abortOf("g", 1, 2)},
		"not a group of ours": {true, abortObserved{CommID: "h.1", Rec: supervisor.AbortRecord{Group: "h", Epoch: 1}}},
		"closing": {true, func() abortObserved {
			e := abortOf("g", 1, 1)
			e.Closing = true
			return e
		}()},
	} {
		c := newRestartCore(tc.policy, MaxAutoRestarts, AutoRestartWindow)
		if got := c.Step(tc.ev, t0); got != nil {
			t.Errorf("%s: %+v, want nothing", name, got)
		}
	}
}

// TestRestartCoreAbortBeforeGroup: an abort of an epoch this rank has not
// created yet is remembered; creating that epoch restarts it at once.
func TestRestartCoreAbortBeforeGroup(t *testing.T) {
	c := newRestartCore(true, MaxAutoRestarts, AutoRestartWindow)
	t0 := time.Unix(1000, 0)
	early := abortOf("g", 5, 4) // a peer is already at epoch 5
	if got := c.Step(early, t0); got != nil {
		t.Fatalf("abort of a future epoch: %+v", got)
	}
	later := early
	later.Rec.Reason = "second writer"
	c.Step(later, t0) // the first record seen is kept
	got := c.Step(groupCreated{Group: "g", Epoch: 5}, t0.Add(time.Second))
	want := []restartAction{restartGroupAction{Group: "g", Epoch: 5, Rec: early.Rec}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("groupCreated: %+v, want %+v", got, want)
	}
	if got := c.Step(groupCreated{Group: "g", Epoch: 6}, t0); got != nil {
		t.Fatalf("groupCreated without an abort: %+v", got)
	}
}

// TestRestartCoreBound: more than maxRestarts automatic restarts of one
// group within the window escalate; restarts that left the window no
// longer count; other groups count apart.
func TestRestartCoreBound(t *testing.T) {
	c := newRestartCore(true, 3, time.Minute)
	t0 := time.Unix(1000, 0)
	for e := uint32(0); e < 3; e++ {
		got := c.Step(abortOf("g", e, e), t0.Add(time.Duration(e)*time.Second))
		if len(got) != 1 || reflect.TypeOf(got[0]) != reflect.TypeOf(restartGroupAction{}) {
			t.Fatalf("restart %d: %+v, want a restart", e, got)
		}
	}
	if got := c.Step(abortOf("other", 0, 0), t0.Add(3*time.Second)); len(got) != 1 || got[0].(restartGroupAction).Group != "other" {
		t.Fatalf("another group: %+v", got)
	}
	got := c.Step(abortOf("g", 3, 3), t0.Add(4*time.Second))
	esc, ok := got[0].(escalateAction)
	if len(got) != 1 || !ok || esc.Count != 4 || esc.Group != "g" || esc.Epoch != 3 || esc.Rec.Reason != "panic" {
		t.Fatalf("fourth restart within a minute: %+v, want an escalation counting 4", got)
	}
	// A minute after the escalation, no earlier restart counts.
	got = c.Step(abortOf("g", 4, 4), t0.Add(64*time.Second))
	if len(got) != 1 || reflect.TypeOf(got[0]) != reflect.TypeOf(restartGroupAction{}) {
		t.Fatalf("after the window: %+v, want a restart", got)
	}
}

func TestRestartCoreFailedRestart(t *testing.T) {
	c := newRestartCore(true, MaxAutoRestarts, AutoRestartWindow)
	t0 := time.Unix(1000, 0)
	barrier := &barrierErr{}
	cases := []struct {
		ev   autoRestartFailed
		want restartAction
	}{
		{autoRestartFailed{Group: "g", Epoch: 1, Err: barrier}, escalateAction{Group: "g", Epoch: 1, Err: barrier}},
		{autoRestartFailed{Group: "g", Epoch: 1, Err: barrier, Closing: true}, quietAction{Group: "g", Epoch: 1, Err: barrier}},
		{autoRestartFailed{Group: "g", Epoch: 1, Err: fmt.Errorf("x: %w", comm.ErrClosed)}, nil},
		{autoRestartFailed{Group: "g", Epoch: 1, Err: fmt.Errorf("stale: %w", comm.ErrInvalidArgument)}, nil},
	}
	for i, tc := range cases {
		got := c.Step(tc.ev, t0)
		if len(got) != 1 {
			t.Fatalf("case %d: %+v", i, got)
		}
		if tc.want == nil {
			if _, ok := got[0].(quietAction); !ok {
				t.Errorf("case %d: %+v, want a quiet end", i, got)
			}
			continue
		}
		if !reflect.DeepEqual(got[0], tc.want) {
			t.Errorf("case %d: %+v, want %+v", i, got[0], tc.want)
		}
	}
}

type barrierErr struct{}

func (*barrierErr) Error() string { return "barrier timed out" }

func TestParseAbort(t *testing.T) {
	want := supervisor.AbortRecord{Rank: 2, Group: "sub", Epoch: 7, Reason: "timeout"}
	js, _ := json.Marshal(want)
	if got, ok := parseAbort("sub.7", js); !ok || got != want {
		t.Errorf("JSON record: %+v %v", got, ok)
	}
	if got, ok := parseAbort("a.b.12", []byte("engine error")); !ok ||
		got != (supervisor.AbortRecord{Rank: -1, Group: "a.b", Epoch: 12, Reason: "engine error"}) {
		t.Errorf("bare reason: %+v %v", got, ok)
	}
	for _, id := range []string{"noepoch", "g.x", "g.99999999999"} {
		if _, ok := parseAbort(id, []byte("?")); ok {
			t.Errorf("parseAbort(%q) accepted", id)
		}
	}
}
