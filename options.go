package ranktree

import (
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/store/natsstore"
	"github.com/ranktree/ranktree/supervisor"
)

// Option overrides one setting of the env contract (or adds one the
// environment cannot carry, like WithStore). Options win over variables.
// A bad value makes Init return an *OptionError naming the option.
type Option func(*config) error

// config is Init's merged view of options and environment.
type config struct {
	rank, worldSize, localRank, localWorldSize, nodeRank, restartCount int

	rankSet, worldSizeSet, localRankSet, localWorldSizeSet, nodeRankSet, restartCountSet bool

	natsURL, job       string
	natsURLSet, jobSet bool
	timeout            time.Duration
	timeoutSet         bool
	storeWait          bool        // RANKTREE_STORE_WAIT (environment only)
	env                envContract // the parsed environment (merge)
	store              store.Store
	log                *zerolog.Logger
	creds              natsstore.Credentials // RANKTREE_NATS_* (environment only)
	backend            comm.BackendFactory   // WithBackend (world.go); nil: the CPU engine
	device             int                   // WithDevice (world.go), if deviceSet
	deviceSet          bool
	sup                supervisor.Config  // from the environment, checked first in Init
	supOpts            supervisionOptions // WithActorPanic, WithExit (world.go)
}

func nonNegative(name string, v int, dst *int, set *bool) Option {
	return func(c *config) error {
		if v < 0 {
			return &OptionError{Option: fmt.Sprintf("%s(%d)", name, v), Msg: "must be ≥ 0"}
		}
		*dst, *set = v, true
		return nil
	}
}

// WithRank sets the global rank (overrides RANK); 0 ≤ rank < world size.
func WithRank(rank int) Option {
	return func(c *config) error { return nonNegative("WithRank", rank, &c.rank, &c.rankSet)(c) }
}

// WithWorldSize sets the number of ranks (overrides WORLD_SIZE); ≥ 1.
func WithWorldSize(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return &OptionError{Option: fmt.Sprintf("WithWorldSize(%d)", n), Msg: "must be ≥ 1"}
		}
		c.worldSize, c.worldSizeSet = n, true
		return nil
	}
}

// WithLocalRank sets the rank within the node (overrides LOCAL_RANK).
func WithLocalRank(rank int) Option {
	return func(c *config) error {
		return nonNegative("WithLocalRank", rank, &c.localRank, &c.localRankSet)(c)
	}
}

// WithLocalWorldSize sets the ranks on this node (overrides LOCAL_WORLD_SIZE); ≥ 1.
func WithLocalWorldSize(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return &OptionError{Option: fmt.Sprintf("WithLocalWorldSize(%d)", n), Msg: "must be ≥ 1"}
		}
		c.localWorldSize, c.localWorldSizeSet = n, true
		return nil
	}
}

// WithNodeRank sets the node rank, the index of this rank's node among the
// job's nodes, 0 ≤ node rank < number of nodes (overrides GROUP_RANK,
// torchrun's name for it). It is not a rank within a process group: see
// comm.ProcessGroup.Rank for that.
func WithNodeRank(rank int) Option {
	return func(c *config) error {
		return nonNegative("WithNodeRank", rank, &c.nodeRank, &c.nodeRankSet)(c)
	}
}

// WithRestartCount sets the restart attempt (overrides RANKTREE_RESTART_COUNT).
// Store keys of attempt n live under "restart/<n>/".
func WithRestartCount(n int) Option {
	return func(c *config) error {
		return nonNegative("WithRestartCount", n, &c.restartCount, &c.restartCountSet)(c)
	}
}

// WithNATSURL sets the control-plane NATS URL (overrides RANKTREE_NATS_URL).
func WithNATSURL(url string) Option {
	return func(c *config) error {
		if url == "" {
			return &OptionError{Option: "WithNATSURL(\"\")", Msg: "empty URL"}
		}
		c.natsURL, c.natsURLSet = url, true
		return nil
	}
}

// WithJob sets the job id (overrides RANKTREE_JOB): it selects the KV bucket
// and the event subjects ranktree.<job>.events.>.
func WithJob(job string) Option {
	return func(c *config) error {
		if job == "" {
			return &OptionError{Option: "WithJob(\"\")", Msg: "empty job"}
		}
		c.job, c.jobSet = job, true
		return nil
	}
}

// WithStore makes Init use s as the job store instead of connecting to NATS
// (RANKTREE_NATS_URL is then not needed, and the job defaults to "local"):
// single-process jobs and tests pass a store.NewMemStore(). The caller keeps
// ownership: Runtime.Close does not close s.
func WithStore(s store.Store) Option {
	return func(c *config) error {
		if s == nil {
			return &OptionError{Option: "WithStore(nil)", Msg: "nil store"}
		}
		c.store = s
		return nil
	}
}

// WithLogger sets the base logger; the runtime adds job and rank fields.
// Default: JSON lines on stderr at info level.
func WithLogger(l zerolog.Logger) Option {
	return func(c *config) error {
		c.log = &l
		return nil
	}
}

// WithTimeout sets the store timeout and the init barrier's timeout
// (overrides RANKTREE_STORE_TIMEOUT; default 5 min, c10d's store default).
func WithTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return &OptionError{Option: fmt.Sprintf("WithTimeout(%v)", d), Msg: "must be positive"}
		}
		c.timeout, c.timeoutSet = d, true
		return nil
	}
}
