package supervisor

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/actors"
)

// ExitEscalate is the exit code when a child actor's panic is escalated.
const ExitEscalate = 4

// Decision is the root's answer to a child actor's panic.
type Decision uint8

// Decisions.
const (
	// Restart restarts the child actor in place (protoactor restart: its
	// producer runs again; ranktree's actors keep their state across it).
	Restart Decision = iota + 1
	// StopChild stops the child and calls RootConfig.OnStopped, which may
	// re-create it (a communicator under a new epoch, coordinated through
	// the store).
	StopChild
	// Escalate dumps the flight recorder and exits the process with
	// ExitEscalate, so that rankrunner restarts the job.
	Escalate
)

// String is the decision's name: restart, stop or escalate.
func (d Decision) String() string {
	switch d {
	case Restart:
		return "restart"
	case StopChild:
		return "stop"
	case Escalate:
		return "escalate"
	}
	return fmt.Sprintf("Decision(%d)", uint8(d))
}

// PanicPolicy is what a panic in one of the rank's actors (a communicator
// actor above all) leads to (RANKTREE_ACTOR_PANIC). The zero value means
// "unset" and behaves as PanicEscalate.
type PanicPolicy uint8

// Panic policies.
const (
	// PanicEscalate (default): dump the flight recorder and exit the
	// process with ExitEscalate, so that rankrunner restarts the job
	// (torchrun's answer to a failed worker).
	PanicEscalate PanicPolicy = iota + 1
	// PanicRestart: restart the actor in place (it keeps its state). A
	// communicator's panic also breaks its group: the panicking op fails
	// with comm.ErrEngine, the watchdog aborts the communicator and writes
	// abort/<comm-id>, and every member's runtime re-creates the group under
	// the next epoch (ranktree.Runtime's restart policy, internal/groups). Needs
	// ErrorHandling CleanupOnly, which it selects when unset.
	PanicRestart
)

// String is the policy's name: escalate or restart.
func (p PanicPolicy) String() string {
	switch p {
	case PanicEscalate:
		return "escalate"
	case PanicRestart:
		return "restart"
	case 0:
		return "unset"
	}
	return fmt.Sprintf("PanicPolicy(%d)", uint8(p))
}

// ParsePanicPolicy parses "escalate" or "restart" (case-insensitive).
func ParsePanicPolicy(s string) (PanicPolicy, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "escalate":
		return PanicEscalate, nil
	case "restart":
		return PanicRestart, nil
	}
	return 0, fmt.Errorf("want escalate or restart")
}

// Decide is the policy as a RootConfig.Policy: Restart for PanicRestart,
// Escalate otherwise, whatever the child.
func (p PanicPolicy) Decide(*actor.PID, any) Decision {
	if p == PanicRestart {
		return Restart
	}
	return Escalate
}

// RootConfig configures the rank's supervision root.
type RootConfig struct {
	Rank int
	// Policy decides what a child's panic leads to (nil: Escalate). It runs
	// on the root actor's goroutine and must not block.
	Policy func(child *actor.PID, reason any) Decision
	// MaxRestarts within Within turn further Restart decisions for that
	// child into Escalate (0: 3 within 1 min).
	MaxRestarts int
	Within      time.Duration
	// OnStopped runs, on its own goroutine, after a StopChild decision.
	OnStopped func(child *actor.PID, reason any)
	// OnRestarted runs, on its own goroutine, after a Restart decision.
	OnRestarted func(child *actor.PID, reason any)
	// Escalating, if not nil, is called when an escalation begins, before
	// the dump; if it returns false another teardown of the process is
	// already under way and the root neither dumps nor exits. StartRank
	// uses it so that the process exits once, with ExitEscalate, even if
	// the watchdog reacts to the same panic's failed op meanwhile.
	Escalating func() bool
	Dumper     DumpWriter     // nil: no dump on escalation
	Events     EventSink      // nil: no events
	Exit       func(code int) // nil: os.Exit
	Log        zerolog.Logger
}

// Root is the rank's supervision root (a protoactor actor): the
// communicator actors, the watchdog, the event publisher and the heartbeat
// monitor are its children, and a panic in any of them reaches Policy
// instead of killing the process. c10d has no counterpart; torchrun's
// elastic agent restarts whole workers, which is what Escalate leads to.
type Root struct {
	cfg    RootConfig
	system *actor.ActorSystem
	pid    *actor.PID
	once   sync.Once
}

type spawnReq struct {
	props  *actor.Props
	prefix string // "": a generated name
}

// StartRoot spawns the root actor in system.
func StartRoot(system *actor.ActorSystem, cfg RootConfig) *Root {
	if cfg.MaxRestarts <= 0 {
		cfg.MaxRestarts = 3
	}
	if cfg.Within <= 0 {
		cfg.Within = time.Minute
	}
	if cfg.Exit == nil {
		cfg.Exit = os.Exit
	}
	r := &Root{cfg: cfg, system: system}
	props := actor.PropsFromFunc(func(ctx actor.Context) {
		if m, ok := ctx.Message().(spawnReq); ok {
			if m.prefix != "" {
				ctx.Respond(ctx.SpawnPrefix(m.props, m.prefix))
			} else {
				ctx.Respond(ctx.Spawn(m.props))
			}
		}
	}, actor.WithSupervisor(rootStrategy{r}))
	r.pid = actors.SpawnUnder(system, nil, props, fmt.Sprintf("rank%d-root-", cfg.Rank))
	return r
}

// PID is the root actor's PID.
func (r *Root) PID() *actor.PID { return r.pid }

// Spawn starts a child of the root (actors.Spawner), so that its panics
// reach Policy. It returns nil if the root has stopped.
func (r *Root) Spawn(props *actor.Props) *actor.PID { return r.SpawnPrefix(props, "") }

// SpawnPrefix is Spawn with a child id starting with prefix (the
// communicator actors name themselves "comm-<group>-e<epoch>-").
func (r *Root) SpawnPrefix(props *actor.Props, prefix string) *actor.PID {
	res, err := r.system.Root.RequestFuture(r.pid, spawnReq{props: props, prefix: prefix}, 10*time.Second).Result()
	if err != nil {
		r.cfg.Log.Error().Err(err).Int("rank", r.cfg.Rank).Msg("supervision root: spawn failed")
		return nil
	}
	pid, _ := res.(*actor.PID)
	return pid
}

// Stop stops the root and all its children, waiting at most timeout.
// Idempotent.
func (r *Root) Stop(timeout time.Duration) error {
	var err error
	r.once.Do(func() {
		if !actors.StopWithin(r.system, r.pid, actors.StopNow, timeout) {
			err = fmt.Errorf("supervisor: root of rank %d did not stop within %v", r.cfg.Rank, timeout)
		}
	})
	return err
}

// rootStrategy applies RootConfig.Policy to a failing child.
type rootStrategy struct{ r *Root }

// HandleFailure implements actor.SupervisorStrategy.
func (s rootStrategy) HandleFailure(_ *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, rs *actor.RestartStatistics, reason any, _ any) {
	cfg := s.r.cfg
	d := Escalate
	if cfg.Policy != nil {
		d = cfg.Policy(child, reason)
	}
	if d == Restart {
		rs.Fail()
		if rs.NumberOfFailures(cfg.Within) > cfg.MaxRestarts {
			d = Escalate
		}
	}
	cfg.Log.Error().Int("rank", cfg.Rank).Str("child", child.Id).Interface("panic", reason).
		Str("decision", d.String()).Msg("supervised actor panicked")
	if cfg.Events != nil {
		cfg.Events.Emit(actors.Event{Kind: actors.KindRestart, Action: d.String(), Error: fmt.Sprint(reason),
			Detail: map[string]string{"actor": child.Id}})
	}
	switch d {
	case Restart:
		sup.RestartChildren(child)
		if cfg.OnRestarted != nil {
			go cfg.OnRestarted(child, reason)
		}
	case StopChild:
		sup.StopChildren(child)
		if cfg.OnStopped != nil {
			go cfg.OnStopped(child, reason)
		}
	default:
		sup.StopChildren(child)
		if cfg.Escalating != nil && !cfg.Escalating() {
			cfg.Log.Warn().Int("rank", cfg.Rank).Str("child", child.Id).Msg("escalation skipped: the process is already being torn down")
			return
		}
		reasonText := fmt.Sprintf("actor %s panicked: %v", child.Id, reason)
		if cfg.Dumper != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := cfg.Dumper.Dump(ctx, reasonText); err != nil {
				cfg.Log.Error().Err(err).Int("rank", cfg.Rank).Msg("escalation dump failed")
			}
			cancel()
		}
		cfg.Exit(ExitEscalate)
	}
}
