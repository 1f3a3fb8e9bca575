package groups

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/supervisor"
)

// The restart policy's decisions as a pure core, in the manner of
// supervisor.WatchdogCore: restartCore.Step takes the core's state, one
// event and the time, and returns the actions to carry out. It holds no
// goroutine, lock, store or clock; the Manager's owner loop feeds it (loop.go)
// and carries the actions out (RestartGroup in the background, Escalate,
// a log line). What it decides:
//
//   - an abort of the epoch this rank uses for a group, seen in the store
//     (abortObserved) or found already there when the group is created
//     (groupCreated), restarts that group once per epoch, when the policy
//     is restart;
//   - a group restarted automatically more than maxRestarts times within
//     window escalates instead;
//   - an automatic restart that fails (autoRestartFailed) escalates,
//     unless the runtime is closing or the program restarted the group
//     itself meanwhile.

// restartCore is the restart policy's state. The zero value is usable
// after newRestartCore; it is not safe for concurrent use.
type restartCore struct {
	policy      bool          // RANKTREE_ACTOR_PANIC=restart (or WithActorPanic) and the abort watch runs
	maxRestarts int           // MaxAutoRestarts
	window      time.Duration // AutoRestartWindow

	seen    map[string]supervisor.AbortRecord // CommID → first abort record seen for it
	started map[string]bool                   // CommIDs already restarted (or escalated) automatically
	history map[string][]time.Time            // group → its automatic restarts within window
}

func newRestartCore(policy bool, maxRestarts int, window time.Duration) *restartCore {
	return &restartCore{policy: policy, maxRestarts: maxRestarts, window: window,
		seen: map[string]supervisor.AbortRecord{}, started: map[string]bool{}, history: map[string][]time.Time{}}
}

// Events.
type (
	restartEvent interface{ restartEvent() }

	// abortObserved: abort/<CommID> with rec appeared in the store.
	// Current is the epoch this rank uses for rec.Group (HasCurrent false
	// if none); Closing reports that Close began.
	abortObserved struct {
		CommID     string
		Rec        supervisor.AbortRecord
		Current    uint32
		HasCurrent bool
		Closing    bool
	}
	// groupCreated: this rank made group Group at epoch Epoch (an abort of
	// it may have been seen before).
	groupCreated struct {
		Group string
		Epoch uint32
	}
	// autoRestartFailed: an automatic restart of Group from Epoch returned
	// Err. Closing reports that Close began or the abort watch ended.
	autoRestartFailed struct {
		Group   string
		Epoch   uint32
		Err     error
		Closing bool
	}
)

func (abortObserved) restartEvent()     {}
func (groupCreated) restartEvent()      {}
func (autoRestartFailed) restartEvent() {}

// Actions.
type (
	restartAction interface{ restartAction() }

	// restartGroupAction: restart Group from Epoch (RestartGroup in the
	// background) because of Rec.
	restartGroupAction struct {
		Group string
		Epoch uint32
		Rec   supervisor.AbortRecord
	}
	// escalateAction: the rank gives up on Group's epoch and escalates
	// (dump, exit supervisor.ExitEscalate). Count > 0: the group broke
	// Count times within the window; otherwise Err is the failed restart.
	escalateAction struct {
		Group string
		Epoch uint32
		Count int
		Rec   supervisor.AbortRecord
		Err   error
	}
	// quietAction: an automatic restart ended without effect (the runtime
	// is closing, or the program restarted the group); log it at debug.
	quietAction struct {
		Group string
		Epoch uint32
		Err   error
	}
)

func (restartGroupAction) restartAction() {}
func (escalateAction) restartAction()     {}
func (quietAction) restartAction()        {}

// Step applies ev at time now and returns what to do.
func (c *restartCore) Step(ev restartEvent, now time.Time) []restartAction {
	switch e := ev.(type) {
	case abortObserved:
		if _, ok := c.seen[e.CommID]; !ok {
			c.seen[e.CommID] = e.Rec
		}
		if e.Closing || !e.HasCurrent || e.Current != e.Rec.Epoch {
			return nil
		}
		return c.restart(e.Rec.Group, e.Rec.Epoch, e.Rec, now)
	case groupCreated:
		rec, ok := c.seen[supervisor.CommID(e.Group, e.Epoch)]
		if !ok {
			return nil
		}
		return c.restart(e.Group, e.Epoch, rec, now)
	case autoRestartFailed:
		if e.Closing || errors.Is(e.Err, comm.ErrClosed) || errors.Is(e.Err, comm.ErrInvalidArgument) {
			return []restartAction{quietAction{Group: e.Group, Epoch: e.Epoch, Err: e.Err}}
		}
		return []restartAction{escalateAction{Group: e.Group, Epoch: e.Epoch, Err: e.Err}}
	}
	return nil
}

// restart decides the automatic restart of group's epoch: nothing without
// the policy or when this epoch was handled already; escalation past the
// bound; a restart otherwise.
func (c *restartCore) restart(group string, epoch uint32, rec supervisor.AbortRecord, now time.Time) []restartAction {
	id := supervisor.CommID(group, epoch)
	if !c.policy || c.started[id] {
		return nil
	}
	c.started[id] = true
	recent := []time.Time{now}
	for _, at := range c.history[group] {
		if now.Sub(at) < c.window {
			recent = append(recent, at)
		}
	}
	c.history[group] = recent
	if len(recent) > c.maxRestarts {
		return []restartAction{escalateAction{Group: group, Epoch: epoch, Count: len(recent), Rec: rec}}
	}
	return []restartAction{restartGroupAction{Group: group, Epoch: epoch, Rec: rec}}
}

// parseAbort reads the abort record stored under abort/<commID>. A value
// that is not an AbortRecord (an older writer, or a bare reason) is taken
// as the reason, with the group and epoch read from commID
// ("<group>.<epoch>") and Rank -1. ok is false when neither can be read.
func parseAbort(commID string, value []byte) (rec supervisor.AbortRecord, ok bool) {
	if err := json.Unmarshal(value, &rec); err == nil && rec.Group != "" {
		return rec, true
	}
	i := strings.LastIndexByte(commID, '.')
	if i < 0 {
		return supervisor.AbortRecord{}, false
	}
	e, err := strconv.ParseUint(commID[i+1:], 10, 32)
	if err != nil {
		return supervisor.AbortRecord{}, false
	}
	return supervisor.AbortRecord{Rank: -1, Group: commID[:i], Epoch: uint32(e), Reason: string(value)}, true
}
