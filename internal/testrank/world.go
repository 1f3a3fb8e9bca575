package testrank

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
)

// QuietSystem returns a protoactor system whose own logger discards output
// (tests log through zerolog).
func QuietSystem() *actor.ActorSystem {
	return actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
}

// Factory is a comm.GroupFactory for tests: it creates a backend with
// NewBackend, wraps it in a communicator actor in System and returns the
// ProcessGroup. It records every spec it was asked for.
type Factory struct {
	System     *actor.ActorSystem
	Engine     string
	NewBackend func(ctx context.Context, spec comm.GroupSpec) (comm.Backend, error)
	Observer   actors.Observer
	Log        zerolog.Logger
	// Store is handed to every group (GroupConfig.Store); may be nil.
	Store store.Store

	mu    sync.Mutex
	specs []comm.GroupSpec
}

// CreateGroup implements comm.GroupFactory.
func (f *Factory) CreateGroup(ctx context.Context, spec comm.GroupSpec) (*comm.ProcessGroup, error) {
	f.mu.Lock()
	f.specs = append(f.specs, spec)
	f.mu.Unlock()
	be, err := f.NewBackend(ctx, spec)
	if err != nil {
		return nil, err
	}
	c, err := actors.NewCommunicator(f.System, be, actors.CommunicatorConfig{Group: spec.Name, Observer: f.Observer, Log: f.Log})
	if err != nil {
		be.Close()
		return nil, err
	}
	return comm.NewProcessGroup(comm.GroupConfig{
		Name: spec.Name, Rank: spec.Rank, Size: len(spec.GlobalRanks), GlobalRanks: spec.GlobalRanks,
		Launcher: c, Engine: f.Engine, Factory: f, Timeout: spec.Timeout, Store: f.Store, Log: f.Log,
	})
}

// Specs returns the specs CreateGroup was called with.
func (f *Factory) Specs() []comm.GroupSpec {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]comm.GroupSpec(nil), f.specs...)
}

// World creates the world group ("default_pg", global ranks 0..size-1) of
// one rank through f.
func (f *Factory) World(ctx context.Context, rank, size int) (*comm.ProcessGroup, error) {
	global := make([]int, size)
	for i := range global {
		global[i] = i
	}
	return f.CreateGroup(ctx, comm.GroupSpec{Name: "default_pg", GlobalRanks: global, Rank: rank, Timeout: 30 * time.Second})
}

// RecorderFactory returns a Factory whose backends are Recorders; the
// Recorders are reported through created (may be nil).
func RecorderFactory(system *actor.ActorSystem, created func(spec comm.GroupSpec, r *Recorder)) *Factory {
	return &Factory{
		System: system, Engine: "recorder", Log: zerolog.New(io.Discard),
		NewBackend: func(_ context.Context, spec comm.GroupSpec) (comm.Backend, error) {
			r := NewRecorder(spec.Rank, len(spec.GlobalRanks))
			if created != nil {
				created(spec, r)
			}
			return r, nil
		},
	}
}

// BackendFactoryFactory returns a Factory whose backends come from an engine's
// comm.BackendFactory (e.g. comm/cpu.New) over st, all ranks of a job
// sharing st (e.g. store.NewMemStore()).
func BackendFactoryFactory(system *actor.ActorSystem, engine string, bf comm.BackendFactory, st store.Store, log zerolog.Logger) *Factory {
	return &Factory{
		System: system, Engine: engine, Log: log, Store: st,
		NewBackend: func(ctx context.Context, spec comm.GroupSpec) (comm.Backend, error) {
			be, err := bf(ctx, comm.BackendConfig{
				Group: spec.Name, Rank: spec.Rank, Size: len(spec.GlobalRanks), GlobalRanks: spec.GlobalRanks,
				Store: st, Device: -1, Timeout: 30 * time.Second, Log: log,
			})
			if err != nil {
				return nil, fmt.Errorf("engine %s for group %q rank %d: %w", engine, spec.Name, spec.Rank, err)
			}
			return be, nil
		},
	}
}
