package groups

import (
	"context"
	"fmt"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/nccl"
	"github.com/ranktree/ranktree/supervisor"
)

// CreateGroup creates a new group (Start, NewGroup, Split: it implements
// comm.GroupFactory) under the next epoch for its name: the incarnation's
// base epoch the first time, one more than the last otherwise, so that a
// name used again never meets the store keys of its earlier communicator.
// Errors: comm.ErrClosed once Close began; engine connection errors.
func (m *Manager) CreateGroup(ctx context.Context, spec comm.GroupSpec) (*comm.ProcessGroup, error) {
	return m.createAt(ctx, spec, 0, nil)
}

// reserve claims epoch for name on the loop (the next one for name unless
// fixed) and returns it; it fails once Close began.
func (m *Manager) reserve(name string, epoch uint32, fixed bool) (uint32, error) {
	closing := true
	m.do(func(s *state) {
		if closing = s.closing; closing {
			return
		}
		if !fixed {
			epoch = BaseEpoch(m.cfg.Incarnation)
			if e, ok := s.epochs[name]; ok {
				epoch = e + 1
			}
		}
		s.epochs[name] = max(s.epochs[name], epoch)
	})
	if closing {
		return 0, m.closedErr("creating", name)
	}
	return epoch, nil
}

// createAt connects an engine for spec under epoch, puts it under
// supervision, wraps it in a communicator actor and returns the process
// group. prev is the group a restart replaces (its epoch is fixed by the
// restart barrier); nil for a new group, which takes the next epoch of its
// name. The connection runs on
// the caller's goroutine; the loop only records the result. Errors:
// comm.ErrClosed once Close began; engine connection errors.
func (m *Manager) createAt(ctx context.Context, spec comm.GroupSpec, epoch uint32, prev *comm.ProcessGroup) (*comm.ProcessGroup, error) {
	epoch, err := m.reserve(spec.Name, epoch, prev != nil)
	if err != nil {
		return nil, err
	}
	log := m.cfg.Log.With().Str("group", spec.Name).Uint32("epoch", epoch).Logger()
	// Injected faults (RANKTREE_FAULT) strike a group's first communicator
	// only: a restarted one, whose seqs start at 1 again, runs clean.
	faults := m.cfg.Faults
	if epoch != BaseEpoch(m.cfg.Incarnation) {
		faults = nil
	}
	be, err := m.cfg.Factory(ctx, comm.BackendConfig{
		Group: spec.Name, Epoch: epoch, Rank: spec.Rank, Size: len(spec.GlobalRanks),
		GlobalRanks: spec.GlobalRanks, Store: m.cfg.Store, Device: m.cfg.Device, Timeout: m.cfg.Timeout,
		Faults: faults, Log: log,
	})
	if err != nil {
		return nil, fmt.Errorf("ranktree: rank %d: connecting group %q (epoch %d): %w", m.cfg.Rank, spec.Name, epoch, err)
	}
	if spec.Timeout <= 0 {
		spec.Timeout = m.cfg.Supervision.Timeout
	}
	l, pg, err := m.supervise(ctx, be, spec, epoch)
	if err != nil {
		return nil, err
	}
	if !m.register(l, prev) { // Close began while the engine connected
		_ = pg.Destroy(ctx)
		return nil, m.closedErr("creating", spec.Name)
	}
	log.Debug().Str("engine", be.Name()).Ints("ranks", spec.GlobalRanks).Msg("process group created")
	return pg, nil
}

// supervise puts a connected engine under the watchdog and flight
// recorder, spawns its communicator actor under the supervision root and
// builds the ProcessGroup over it. On error the engine is closed.
func (m *Manager) supervise(ctx context.Context, be comm.Backend, spec comm.GroupSpec, epoch uint32) (*member, *comm.ProcessGroup, error) {
	name := spec.Name
	cm, err := actors.NewCommunicator(m.system, be, actors.CommunicatorConfig{
		Group: name, Epoch: epoch, Log: m.cfg.Log, Rank: m.cfg.Rank,
		// The watchdog watches the communicator itself: its AsyncError
		// is the engine's or the actor's first panic.
		Supervise: func(c *actors.Communicator) actors.Observer {
			return m.sv.AttachGroup(supervisor.GroupSpec{Name: name, Epoch: epoch, Engine: be.Name(),
				Members: spec.GlobalRanks, Timeout: spec.Timeout, Detail: deviceDetail(be)}, spec.Rank, c)
		},
		// The rank's supervision root is the actor's parent: its panics
		// follow the policy (RANKTREE_ACTOR_PANIC).
		Parent: m.sv.Root, OnPanic: func(p *actors.Panic) { m.sv.ActorPanicked(p) },
		BlockingWait: m.cfg.Supervision.BlockingWait, CloseGrace: CloseGrace, CloseBound: closeCommBound,
		OnClosed: func(c *actors.Communicator) { m.closed(name, c) },
	})
	if err != nil {
		m.sv.DetachGroup(name)
		be.Close()
		return nil, nil, err
	}
	pg, err := comm.NewProcessGroup(comm.GroupConfig{
		Name: name, Epoch: epoch, Rank: spec.Rank, Size: len(spec.GlobalRanks), GlobalRanks: spec.GlobalRanks,
		Launcher: cm, Engine: be.Name(), Device: m.cfg.Device, Factory: m, Timeout: spec.Timeout, Store: m.cfg.Store, Log: m.cfg.Log,
	})
	if err != nil {
		cm.Close(ctx)
		return nil, nil, err
	}
	return &member{cm: cm, pg: pg, group: name, epoch: epoch}, pg, nil
}

// register makes l its group's live communicator (on the loop), and the
// world group if it is the first default group or replaces prev, the
// world, in a restart (so World, Group and Restarted change together); it
// lets the restart core see it: a peer may have aborted this epoch before
// it was ours. It reports false once Close began.
func (m *Manager) register(l *member, prev *comm.ProcessGroup) bool {
	ok := false
	m.do(func(s *state) {
		if s.closing {
			return
		}
		ok = true
		s.comms = append(s.comms, l)
		s.current[l.group] = l
		if l.group == WorldGroupName {
			m.world.CompareAndSwap(prev, l.pg)
		}
		s.notify()
		m.step(s, groupCreated{Group: l.group, Epoch: l.epoch})
	})
	return ok
}

// deviceDetail describes a GPU engine's device for the comm_init event
// (NVML UUID, PCI bus id, name, NCCL version); nil for host engines.
func deviceDetail(be comm.Backend) map[string]string {
	if t, ok := be.(interface{ Transport() string }); ok {
		// the CPU engine's links (shm, tcp, shm+tcp), for the byte metrics
		return map[string]string{"transport": t.Transport()}
	}
	e, ok := be.(interface{ DeviceInfo() nccl.DeviceInfo })
	if !ok {
		return nil
	}
	d := e.DeviceInfo()
	return map[string]string{"device": fmt.Sprint(d.Ordinal), "device_name": d.Name, "uuid": d.UUID,
		"pci_bus_id": d.PCIBusID, "nccl_version": d.NCCLVersion}
}
