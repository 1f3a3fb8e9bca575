package supervisor

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/actors"
)

// Heartbeat is the watchdog's liveness counter: the watchdog beats it once
// per tick, the heartbeat monitor reads it (c10d's heartbeat_ counter and
// heartbeatMonitor thread). Safe for concurrent use.
type Heartbeat struct{ n atomic.Uint64 }

// Beat records one unit of watchdog progress.
func (h *Heartbeat) Beat() { h.n.Add(1) }

// Load returns the number of beats so far.
func (h *Heartbeat) Load() uint64 { return h.n.Load() }

// HeartbeatCore decides, as a pure function of observations, when the
// watchdog has stalled: the beat count has not changed for Timeout. It then
// returns ActDump and ActTearDown{Code: ExitHeartbeat}, once.
type HeartbeatCore struct {
	timeout time.Duration
	last    uint64
	since   time.Time
	seen    bool
	fired   bool
}

// NewHeartbeatCore returns a core with the given stall timeout (0:
// DefaultHeartbeatTimeout).
func NewHeartbeatCore(timeout time.Duration) *HeartbeatCore {
	if timeout <= 0 {
		timeout = DefaultHeartbeatTimeout
	}
	return &HeartbeatCore{timeout: timeout}
}

// Observe feeds the beat count seen at now and returns the actions to take.
func (h *HeartbeatCore) Observe(now time.Time, beat uint64) []Action {
	if h.fired {
		return nil
	}
	if !h.seen || beat != h.last {
		h.seen, h.last, h.since = true, beat, now
		return nil
	}
	if stalled := now.Sub(h.since); stalled >= h.timeout {
		h.fired = true
		reason := fmt.Sprintf("heartbeat monitor: the watchdog made no progress for %v (timeout %v, last beat %d)",
			stalled.Round(time.Millisecond), h.timeout, beat)
		return []Action{ActDump{Reason: reason}, ActTearDown{Code: ExitHeartbeat, Reason: reason}}
	}
	return nil
}

// HeartbeatConfig configures a HeartbeatMonitor.
type HeartbeatConfig struct {
	Rank     int
	Timeout  time.Duration // RANKTREE_HEARTBEAT_TIMEOUT (0: default 8 min)
	Interval time.Duration // how often to look (0: Timeout/8, at most 10 s)
	Beat     *Heartbeat    // the watchdog's counter (required)
	// Dumper writes the flight recorder (nil: no dump); its call is bounded
	// by DumpTimeout (0: 10 s) so that teardown happens even if the store hangs.
	Dumper      DumpWriter
	DumpTimeout time.Duration
	Exit        func(code int) // nil: os.Exit
	Log         zerolog.Logger
	Now         func() time.Time // nil: time.Now
}

// HeartbeatMonitor is the actor that watches the watchdog: a separate actor
// with its own timer goroutine, so that a watchdog stuck in a call still
// gets caught. When HeartbeatCore fires it dumps and exits the process.
type HeartbeatMonitor struct {
	cfg    HeartbeatConfig
	core   *HeartbeatCore // owned by the actor
	system *actor.ActorSystem
	pid    *actor.PID
	stop   chan struct{}
	once   sync.Once
	fired  atomic.Bool
}

type heartbeatCheck struct{}

// NewHeartbeatMonitor validates cfg and returns an unstarted monitor.
func NewHeartbeatMonitor(cfg HeartbeatConfig) (*HeartbeatMonitor, error) {
	if cfg.Beat == nil {
		return nil, fmt.Errorf("supervisor: NewHeartbeatMonitor: nil Beat")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultHeartbeatTimeout
	}
	if cfg.Interval <= 0 {
		cfg.Interval = min(cfg.Timeout/8, 10*time.Second)
	}
	if cfg.DumpTimeout <= 0 {
		cfg.DumpTimeout = 10 * time.Second
	}
	if cfg.Exit == nil {
		cfg.Exit = os.Exit
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &HeartbeatMonitor{cfg: cfg, core: NewHeartbeatCore(cfg.Timeout), stop: make(chan struct{})}, nil
}

// Props returns the monitor's actor props (state lives in m).
func (m *HeartbeatMonitor) Props() *actor.Props {
	return actors.PersistentProps((*heartbeatActor)(m))
}

// Start spawns the monitor under parent (nil: the root) and starts its timer.
func (m *HeartbeatMonitor) Start(system *actor.ActorSystem, parent actors.Spawner) *actor.PID {
	m.system = system
	m.pid = actors.SpawnUnder(system, parent, m.Props(), "")
	go func() {
		t := time.NewTicker(m.cfg.Interval)
		defer t.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-t.C:
				system.Root.Send(m.pid, heartbeatCheck{})
			}
		}
	}()
	return m.pid
}

// Fired reports whether the monitor has torn the process down.
func (m *HeartbeatMonitor) Fired() bool { return m.fired.Load() }

// Stop stops the timer and the actor, waiting at most 2 s. Idempotent.
func (m *HeartbeatMonitor) Stop() {
	m.once.Do(func() {
		close(m.stop)
		actors.StopWithin(m.system, m.pid, actors.StopNow, 2*time.Second)
	})
}

type heartbeatActor HeartbeatMonitor

// Receive implements actor.Actor.
func (a *heartbeatActor) Receive(ctx actor.Context) {
	m := (*HeartbeatMonitor)(a)
	if _, ok := ctx.Message().(heartbeatCheck); !ok {
		return
	}
	for _, act := range m.core.Observe(m.cfg.Now(), m.cfg.Beat.Load()) {
		switch act := act.(type) {
		case ActDump:
			m.cfg.Log.Error().Int("rank", m.cfg.Rank).Str("reason", act.Reason).Msg("watchdog stalled; dumping flight recorder")
			if m.cfg.Dumper != nil {
				dctx, cancel := context.WithTimeout(context.Background(), m.cfg.DumpTimeout)
				if err := m.cfg.Dumper.Dump(dctx, act.Reason); err != nil {
					m.cfg.Log.Error().Err(err).Int("rank", m.cfg.Rank).Msg("heartbeat dump failed")
				}
				cancel()
			}
		case ActTearDown:
			m.fired.Store(true)
			m.cfg.Log.Error().Int("rank", m.cfg.Rank).Int("exit_code", act.Code).Msg("heartbeat monitor tearing the process down")
			m.cfg.Exit(act.Code)
		}
	}
}
