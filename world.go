package ranktree

import (
	"context"
	"fmt"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/comm/cuda/nvmlinfo"
	"github.com/ranktree/ranktree/comm/nccl"
	"github.com/ranktree/ranktree/internal/envcontract"
	"github.com/ranktree/ranktree/internal/groups"
	"github.com/ranktree/ranktree/supervisor"
)

// EnvTransport selects the CPU engine's transport: "auto" (default: shared
// memory between ranks on one host, TCP otherwise), "shm" or "tcp".
const EnvTransport = envcontract.Transport

// EnvBackend selects the collective engine of every process group: "cpu"
// (the default: the built-in CPU engine, host buffers) or "nccl" (NCCL and
// the CUDA driver loaded at run time, device buffers; the rank's GPU is
// LOCAL_RANK modulo the node's GPU count). torch.distributed's
// init_process_group(backend=...).
const EnvBackend = envcontract.Backend

// EnvFault injects faults into the CPU engine (see comm.ParseFaults and
// docs/faults.md), e.g. "hang@rank=1,seq=5". Unset in normal runs. A fault
// applies to every epoch of a matching group: a group re-created by
// RestartGroup meets it again when its seq counter reaches S.
const EnvFault = envcontract.Fault

// WorldGroupName is the name of the default process group (c10d's default_pg).
const WorldGroupName = groups.WorldGroupName

// WithBackend makes Init create every process group's engine with f instead
// of the built-in CPU engine (cpu.Factory). Tests use it to run ranks in one
// process over the in-memory transport.
func WithBackend(f comm.BackendFactory) Option {
	return func(c *config) error {
		if f == nil {
			return &OptionError{Option: "WithBackend", Msg: "nil BackendFactory"}
		}
		c.backend = f
		return nil
	}
}

// WithDevice sets the accelerator every process group of the rank runs on:
// the CUDA ordinal the engine binds (c10d: init_process_group's device_id).
// Without it, RANKTREE_BACKEND=nccl picks LOCAL_RANK modulo the GPU count
// NVML sees, and every other engine runs on the host (device -1). Use it
// with WithBackend(nccl.Factory(opts)) to give the NCCL engine options of
// your own. A negative ordinal is an *OptionError.
func WithDevice(ordinal int) Option {
	return func(c *config) error {
		if ordinal < 0 {
			return &OptionError{Option: fmt.Sprintf("WithDevice(%d)", ordinal), Msg: "a CUDA ordinal is ≥ 0"}
		}
		c.device, c.deviceSet = ordinal, true
		return nil
	}
}

// supervisionOptions are the options that adjust the rank's supervision.
type supervisionOptions struct {
	actorPanic supervisor.PanicPolicy // WithActorPanic; 0: RANKTREE_ACTOR_PANIC
	exit       func(code int)         // WithExit; nil: os.Exit
}

// WithActorPanic sets what a panic in one of the rank's actors leads to
// (overrides RANKTREE_ACTOR_PANIC=escalate|restart):
//
//   - supervisor.PanicEscalate (the default): the flight recorder is
//     dumped and the process exits with supervisor.ExitEscalate (4), so
//     that rankrunner restarts the job;
//   - supervisor.PanicRestart: the actor is restarted, and a communicator
//     actor's panic makes every member re-create its group under the next
//     epoch, without restarting processes (see "Restart policy" in
//     groups.go for what the program must do).
//
// PanicRestart needs RANKTREE_ASYNC_ERROR_HANDLING=CleanupOnly or unset
// (it then selects CleanupOnly); otherwise Init fails with an *OptionError.
func WithActorPanic(p supervisor.PanicPolicy) Option {
	return func(c *config) error {
		if p != supervisor.PanicEscalate && p != supervisor.PanicRestart {
			return &OptionError{Option: fmt.Sprintf("WithActorPanic(%v)", p), Msg: "want supervisor.PanicEscalate or supervisor.PanicRestart"}
		}
		c.supOpts.actorPanic = p
		return nil
	}
}

// WithExit replaces os.Exit for the rank's teardowns: an escalated actor
// panic (code supervisor.ExitEscalate), a watchdog TearDown
// (supervisor.ExitTearDown) and a stalled watchdog
// (supervisor.ExitHeartbeat). The rank calls f at most once, after its
// dump and an event flush. Tests pass a recorder; a program may pass a
// function that saves its own state and then calls os.Exit. If f returns,
// the process goes on with the failed group aborted.
func WithExit(f func(code int)) Option {
	return func(c *config) error {
		if f == nil {
			return &OptionError{Option: "WithExit(nil)", Msg: "nil exit function"}
		}
		c.supOpts.exit = f
		return nil
	}
}

// initGroups picks the engine factory and the supervision config and
// starts the rank's process groups (internal/groups) with the default
// group over every rank of the job; it runs at the end of Init.
func (r *Runtime) initGroups(ctx context.Context, c *config) error {
	factory, device, err := engineFactory(c, r.localRank)
	if err != nil {
		return err
	}
	sup := c.sup
	if p := c.supOpts.actorPanic; p != 0 {
		// The option replaces RANKTREE_ACTOR_PANIC; the other variables
		// still apply, and restart may change the error-handling default.
		sup, err = c.env.SupervisionWith(supervisor.EnvActorPanic, p.String())
		if err != nil {
			return &OptionError{Option: fmt.Sprintf("WithActorPanic(%v)", p), Msg: err.Error()}
		}
	}
	r.grp, err = groups.Start(ctx, groups.Config{
		Job: r.job, Rank: r.rank, WorldSize: r.worldSize, Store: r.st, NATS: r.nc, Timeout: r.timeout,
		Incarnation: r.incarnation, Factory: factory, Device: device, Faults: c.env.Faults,
		Supervision: sup, Exit: c.supOpts.exit, EventTap: r.metricsTap(), Log: r.log,
	})
	if err != nil {
		return err
	}
	r.onClose(r.grp.Close)
	return nil
}

// engineFactory is WithBackend's factory, or the engine RANKTREE_BACKEND
// names, and the CUDA ordinal its groups run on (-1: host).
func engineFactory(c *config, localRank int) (comm.BackendFactory, int, error) {
	factory, device := c.backend, -1
	if factory == nil {
		switch b := c.env.Backend; b {
		case "", "cpu":
			o, err := cpuOptions(c)
			if err != nil {
				return nil, 0, err
			}
			factory = cpu.Factory(o)
		case "nccl":
			factory, device = nccl.Factory(nccl.Options{}), localRank
			if n, err := nvmlinfo.Count(); err == nil && n > 0 {
				if d, err := nvmlinfo.LocalDevice(localRank, n); err == nil {
					device = d
				}
			}
		default:
			return nil, 0, &EnvError{Var: EnvBackend, Value: b, Msg: `want "cpu" or "nccl"`}
		}
	}
	if c.deviceSet {
		device = c.device
	}
	return factory, device, nil
}
