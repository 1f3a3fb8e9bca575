package actors

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// The protoactor shell every long-lived actor of a rank shares (the
// communicator actor, the event publisher, the watchdog, the heartbeat
// monitor and the supervision root): props over one persistent state, a
// spawn under a parent that may name its child, and a bounded stop. The
// actors keep only their Receive and their own state.

// PersistentProps returns props whose producer always returns a, so that
// a supervisor restarting the actor after a panic keeps its state
// (sequence counters, tracked Works, queued events). opts are protoactor's
// (a dispatcher, a supervisor strategy).
func PersistentProps(a actor.Actor, opts ...actor.PropsOption) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return a }, opts...)
}

// prefixSpawner is a Spawner that can name its child.
type prefixSpawner interface {
	SpawnPrefix(props *actor.Props, prefix string) *actor.PID
}

// SpawnUnder spawns props as a child of parent, or of system's root when
// parent is nil. A non-empty prefix names the child "<prefix><n>" when the
// parent can name children (the root context, supervisor.Root); otherwise
// the name is generated. It returns nil when the parent could not spawn
// (a stopped supervision root).
func SpawnUnder(system *actor.ActorSystem, parent Spawner, props *actor.Props, prefix string) *actor.PID {
	if parent == nil {
		if prefix == "" {
			return system.Root.Spawn(props)
		}
		return system.Root.SpawnPrefix(props, prefix)
	}
	if p, ok := parent.(prefixSpawner); ok && prefix != "" {
		return p.SpawnPrefix(props, prefix)
	}
	return parent.Spawn(props)
}

// StopMode says how StopWithin stops an actor.
type StopMode int

const (
	// StopNow stops the actor after the message it is handling; messages
	// still in its mailbox are not handled (protoactor's Stop).
	StopNow StopMode = iota
	// StopDrain lets the actor handle every message already in its
	// mailbox first (protoactor's Poison).
	StopDrain
)

// StopWithin stops pid as mode says and waits at most timeout for it to
// stop. It reports whether the actor stopped in time; a nil pid counts as
// stopped. After a StopDrain that timed out the actor is stopped with
// StopNow (not waited for), so it never outlives the call by more than
// its current message.
func StopWithin(system *actor.ActorSystem, pid *actor.PID, mode StopMode, timeout time.Duration) bool {
	if pid == nil {
		return true
	}
	var f *actor.Future
	if mode == StopDrain {
		f = system.Root.PoisonFuture(pid)
	} else {
		f = system.Root.StopFuture(pid)
	}
	done := make(chan struct{})
	go func() { _ = f.Wait(); close(done) }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		if mode == StopDrain {
			system.Root.Stop(pid)
		}
		return false
	}
}
