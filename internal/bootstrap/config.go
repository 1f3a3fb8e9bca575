package bootstrap

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/ranktree/ranktree/internal/envcontract"
	"github.com/ranktree/ranktree/store"
)

// Errors returned by Init (the root package re-exports them).
var (
	// ErrEnv is returned (as *EnvError) when a required variable of the env
	// contract is missing or malformed.
	ErrEnv = errors.New("ranktree: bad environment")
	// ErrInvalidOption is returned (as *OptionError) for a bad option value.
	ErrInvalidOption = errors.New("ranktree: invalid option")
)

// EnvError reports a missing or malformed env-contract variable. A missing
// one reads like c10d's env:// rendezvous: "environment variable RANK
// expected, but not set". It unwraps to ErrEnv.
type EnvError struct {
	Var   string
	Value string // the malformed value ("" when missing)
	Msg   string // "" when missing
}

// Error implements error: the message names what failed and why.
func (e *EnvError) Error() string {
	if e.Msg == "" {
		return fmt.Sprintf("ranktree: error initializing from the environment: environment variable %s expected, but not set (set it, or pass the matching ranktree.With* option)", e.Var)
	}
	return fmt.Sprintf("ranktree: error initializing from the environment: %s=%q: %s", e.Var, e.Value, e.Msg)
}

// Unwrap returns ErrEnv.
func (e *EnvError) Unwrap() error { return ErrEnv }

// OptionError reports a bad option value; Option names it ("WithRank").
// It unwraps to ErrInvalidOption and to the underlying cause, if any.
type OptionError struct {
	Option string
	Msg    string
	Err    error
}

// Error implements error: the message names what failed and why.
func (e *OptionError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("ranktree: invalid option %s: %s: %v", e.Option, e.Msg, e.Err)
	}
	return fmt.Sprintf("ranktree: invalid option %s: %s", e.Option, e.Msg)
}

// Unwrap returns ErrInvalidOption and the cause.
func (e *OptionError) Unwrap() []error { return []error{ErrInvalidOption, e.Err} }

// readEnv reads every variable of the env contract once through lookup
// and parses it (envcontract.Read). A malformed value is an *EnvError
// naming its variable.
func readEnv(lookup func(string) (string, bool)) (envcontract.Contract, error) {
	e, err := envcontract.Read(lookup)
	return e, envErr(err)
}

// envErr reports an *envcontract.VarError as the public *EnvError.
func envErr(err error) error {
	var ve *envcontract.VarError
	if errors.As(err, &ve) {
		return &EnvError{Var: ve.Var, Value: ve.Value, Msg: ve.Msg}
	}
	return err
}

// merge fills every setting of c that no option set from the parsed
// environment e. A required variable that is missing (and not replaced by
// an option) is an *EnvError naming it.
func (c *Config) merge(e envcontract.Contract) error {
	c.env = e
	for _, v := range []struct {
		name     string
		env      envcontract.Int
		dst      *int
		byOption bool
		required bool
	}{
		{envcontract.Rank, e.Rank, &c.rank, c.rankSet, true},
		{envcontract.WorldSize, e.WorldSize, &c.worldSize, c.worldSizeSet, true},
		{envcontract.LocalRank, e.LocalRank, &c.localRank, c.localRankSet, true},
		{envcontract.LocalWorldSize, e.LocalWorldSize, &c.localWorldSize, c.localWorldSizeSet, true},
		{envcontract.NodeRank, e.NodeRank, &c.nodeRank, c.nodeRankSet, true},
		{envcontract.RestartCount, e.RestartCount, &c.restartCount, c.restartCountSet, false},
	} {
		switch {
		case v.byOption:
		case v.env.Set:
			*v.dst = v.env.Value
		case v.required:
			return &EnvError{Var: v.name}
		}
	}
	if c.store == nil {
		if !c.natsURLSet {
			if e.NATSURL == "" {
				return &EnvError{Var: envcontract.NATSURL}
			}
			c.natsURL = e.NATSURL
		}
		if !c.jobSet {
			if e.Job == "" {
				return &EnvError{Var: envcontract.Job}
			}
			c.job = e.Job
		}
	} else if !c.jobSet {
		c.job = e.Job
		if c.job == "" {
			c.job = "local"
		}
	}
	if !c.timeoutSet && e.StoreTimeout > 0 {
		c.timeout = e.StoreTimeout
	}
	c.storeWait, c.creds, c.sup = e.StoreWait, e.Creds, e.Supervision
	return nil
}

// validate fills the defaults nothing set (the store timeout:
// store.DefaultTimeout) and checks the merged settings' consistency. A bad
// value is an *EnvError naming its variable when it came from the
// environment, or an *OptionError naming the option that set it.
func (c *Config) validate() error {
	if c.timeout == 0 {
		c.timeout = store.DefaultTimeout
	}
	bad := func(envName, optName string, byOption bool, val int, msg string) error {
		if byOption {
			return &OptionError{Option: fmt.Sprintf("%s(%d)", optName, val), Msg: msg}
		}
		return &EnvError{Var: envName, Value: strconv.Itoa(val), Msg: msg}
	}
	switch {
	case c.worldSize < 1:
		return bad(envcontract.WorldSize, "WithWorldSize", c.worldSizeSet, c.worldSize, "world size must be at least 1")
	case c.rank < 0 || c.rank >= c.worldSize:
		return bad(envcontract.Rank, "WithRank", c.rankSet, c.rank,
			fmt.Sprintf("rank must be in [0, %d) for world size %d", c.worldSize, c.worldSize))
	case c.localWorldSize < 1 || c.localWorldSize > c.worldSize:
		return bad(envcontract.LocalWorldSize, "WithLocalWorldSize", c.localWorldSizeSet, c.localWorldSize,
			fmt.Sprintf("local world size must be in [1, %d] for world size %d", c.worldSize, c.worldSize))
	case c.localRank < 0 || c.localRank >= c.localWorldSize:
		return bad(envcontract.LocalRank, "WithLocalRank", c.localRankSet, c.localRank,
			fmt.Sprintf("local rank must be in [0, %d) for local world size %d", c.localWorldSize, c.localWorldSize))
	case c.nodeRank < 0:
		return bad(envcontract.NodeRank, "WithNodeRank", c.nodeRankSet, c.nodeRank, "node rank must be ≥ 0")
	case c.restartCount < 0:
		return bad(envcontract.RestartCount, "WithRestartCount", c.restartCountSet, c.restartCount, "restart count must be ≥ 0")
	}
	if c.backend == nil {
		switch c.env.Backend {
		case "", "cpu", "nccl":
		default:
			return &EnvError{Var: envcontract.Backend, Value: c.env.Backend, Msg: `want "cpu" or "nccl"`}
		}
	}
	return nil
}
