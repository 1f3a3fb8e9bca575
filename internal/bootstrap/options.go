package bootstrap

import (
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/internal/envcontract"
	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/store/natsstore"
	"github.com/ranktree/ranktree/supervisor"
)

// Option sets one field of Config; the root package's With* constructors
// (ranktree.Option) are these. A bad value is an *OptionError naming the
// option.
type Option = func(*Config) error

// Config is Init's merged view of options and environment: the options
// set it first (each records that it was set), Start merges in the parsed
// env contract for what no option set (merge) and checks the result
// (validate, which also fills the defaults). Its zero value plus options
// is a valid input to Start.
type Config struct {
	rank, worldSize, localRank, localWorldSize, nodeRank, restartCount int

	rankSet, worldSizeSet, localRankSet, localWorldSizeSet, nodeRankSet, restartCountSet bool

	natsURL, job       string
	natsURLSet, jobSet bool
	timeout            time.Duration
	timeoutSet         bool
	storeWait          bool                 // RANKTREE_STORE_WAIT (environment only)
	env                envcontract.Contract // the parsed environment (merge)
	store              store.Store
	log                *zerolog.Logger
	creds              natsstore.Credentials // RANKTREE_NATS_* (environment only)
	backend            comm.BackendFactory   // WithBackend (engine.go); nil: the CPU engine
	device             int                   // WithDevice (engine.go), if deviceSet
	deviceSet          bool
	sup                supervisor.Config  // from the environment, checked first in Init
	supOpts            supervisionOptions // WithActorPanic, WithExit (engine.go)
}

func nonNegative(name string, v int, dst *int, set *bool) Option {
	return func(c *Config) error {
		if v < 0 {
			return &OptionError{Option: fmt.Sprintf("%s(%d)", name, v), Msg: "must be ≥ 0"}
		}
		*dst, *set = v, true
		return nil
	}
}

// WithRank is ranktree.WithRank, which documents it.
func WithRank(rank int) Option {
	return func(c *Config) error { return nonNegative("WithRank", rank, &c.rank, &c.rankSet)(c) }
}

// WithWorldSize is ranktree.WithWorldSize, which documents it.
func WithWorldSize(n int) Option {
	return func(c *Config) error {
		if n < 1 {
			return &OptionError{Option: fmt.Sprintf("WithWorldSize(%d)", n), Msg: "must be ≥ 1"}
		}
		c.worldSize, c.worldSizeSet = n, true
		return nil
	}
}

// WithLocalRank is ranktree.WithLocalRank, which documents it.
func WithLocalRank(rank int) Option {
	return func(c *Config) error {
		return nonNegative("WithLocalRank", rank, &c.localRank, &c.localRankSet)(c)
	}
}

// WithLocalWorldSize is ranktree.WithLocalWorldSize, which documents it.
func WithLocalWorldSize(n int) Option {
	return func(c *Config) error {
		if n < 1 {
			return &OptionError{Option: fmt.Sprintf("WithLocalWorldSize(%d)", n), Msg: "must be ≥ 1"}
		}
		c.localWorldSize, c.localWorldSizeSet = n, true
		return nil
	}
}

// WithNodeRank is ranktree.WithNodeRank, which documents it.
func WithNodeRank(rank int) Option {
	return func(c *Config) error {
		return nonNegative("WithNodeRank", rank, &c.nodeRank, &c.nodeRankSet)(c)
	}
}

// WithRestartCount is ranktree.WithRestartCount, which documents it.
func WithRestartCount(n int) Option {
	return func(c *Config) error {
		return nonNegative("WithRestartCount", n, &c.restartCount, &c.restartCountSet)(c)
	}
}

// WithNATSURL is ranktree.WithNATSURL, which documents it.
func WithNATSURL(url string) Option {
	return func(c *Config) error {
		if url == "" {
			return &OptionError{Option: "WithNATSURL(\"\")", Msg: "empty URL"}
		}
		c.natsURL, c.natsURLSet = url, true
		return nil
	}
}

// WithJob is ranktree.WithJob, which documents it.
func WithJob(job string) Option {
	return func(c *Config) error {
		if job == "" {
			return &OptionError{Option: "WithJob(\"\")", Msg: "empty job"}
		}
		c.job, c.jobSet = job, true
		return nil
	}
}

// WithStore is ranktree.WithStore, which documents it.
func WithStore(s store.Store) Option {
	return func(c *Config) error {
		if s == nil {
			return &OptionError{Option: "WithStore(nil)", Msg: "nil store"}
		}
		c.store = s
		return nil
	}
}

// WithLogger is ranktree.WithLogger, which documents it.
func WithLogger(l zerolog.Logger) Option {
	return func(c *Config) error {
		c.log = &l
		return nil
	}
}

// WithTimeout is ranktree.WithTimeout, which documents it.
func WithTimeout(d time.Duration) Option {
	return func(c *Config) error {
		if d <= 0 {
			return &OptionError{Option: fmt.Sprintf("WithTimeout(%v)", d), Msg: "must be positive"}
		}
		c.timeout, c.timeoutSet = d, true
		return nil
	}
}

// WithBackend is ranktree.WithBackend, which documents it.
func WithBackend(f comm.BackendFactory) Option {
	return func(c *Config) error {
		if f == nil {
			return &OptionError{Option: "WithBackend", Msg: "nil BackendFactory"}
		}
		c.backend = f
		return nil
	}
}

// WithDevice is ranktree.WithDevice, which documents it.
func WithDevice(ordinal int) Option {
	return func(c *Config) error {
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

// WithActorPanic is ranktree.WithActorPanic, which documents it.
func WithActorPanic(p supervisor.PanicPolicy) Option {
	return func(c *Config) error {
		if p != supervisor.PanicEscalate && p != supervisor.PanicRestart {
			return &OptionError{Option: fmt.Sprintf("WithActorPanic(%v)", p), Msg: "want supervisor.PanicEscalate or supervisor.PanicRestart"}
		}
		c.supOpts.actorPanic = p
		return nil
	}
}

// WithExit is ranktree.WithExit, which documents it.
func WithExit(f func(code int)) Option {
	return func(c *Config) error {
		if f == nil {
			return &OptionError{Option: "WithExit(nil)", Msg: "nil exit function"}
		}
		c.supOpts.exit = f
		return nil
	}
}
