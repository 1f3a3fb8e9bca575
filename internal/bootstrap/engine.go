package bootstrap

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

// startGroups picks the engine factory and the supervision config and
// starts the rank's process groups (internal/groups) with the default
// group over every rank of the job; it runs at the end of Init.
func (r *Rank) startGroups(ctx context.Context, c *Config) error {
	factory, device, err := engineFactory(c, r.LocalRank)
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
	r.Groups, err = groups.Start(ctx, groups.Config{
		Job: r.Job, Rank: r.Rank, WorldSize: r.WorldSize, Store: r.Store, NATS: r.NATS, Timeout: r.Timeout,
		Incarnation: r.Incarnation, Factory: factory, Device: device, Faults: c.env.Faults,
		Supervision: sup, Exit: c.supOpts.exit, EventTap: r.metricsTap(), WorkMetrics: r.workMetrics(), Log: r.Log,
	})
	if err != nil {
		return err
	}
	r.onClose(r.Groups.Close)
	return nil
}

// engineFactory is WithBackend's factory, or the engine RANKTREE_BACKEND
// names, and the CUDA ordinal its groups run on (-1: host).
func engineFactory(c *Config, localRank int) (comm.BackendFactory, int, error) {
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
			return nil, 0, &EnvError{Var: envcontract.Backend, Value: b, Msg: `want "cpu" or "nccl"`}
		}
	}
	if c.deviceSet {
		device = c.device
	}
	return factory, device, nil
}

// cpuOptions builds the CPU engine's options from the parsed environment
// (envcontract.CPUOptions: RANKTREE_TRANSPORT, then the listener's
// placement). Bad values give an *EnvError.
func cpuOptions(c *Config) (cpu.Options, error) {
	o, err := envcontract.CPUOptions(c.env.CPU, c.worldSize, c.localWorldSize, c.natsURL)
	return o, envErr(err)
}
