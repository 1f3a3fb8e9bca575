package ranktree

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/ranktree/ranktree/internal/envcontract"
)

// Environment variables of the env contract between rankrunner and Init.
// The rank variables are torchrun's (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK; RANKTREE_RESTART_COUNT plays
// TORCHELASTIC_RESTART_COUNT); the rest configure the NATS control plane.
const (
	EnvRank           = envcontract.Rank           // global rank, 0..WORLD_SIZE-1 (required)
	EnvWorldSize      = envcontract.WorldSize      // ranks in the job (required)
	EnvLocalRank      = envcontract.LocalRank      // rank within this node (required)
	EnvLocalWorldSize = envcontract.LocalWorldSize // ranks on this node (required)
	EnvNodeRank       = envcontract.NodeRank       // node rank, 0..nodes-1: torchrun's GROUP_RANK, not a rank in a process group (required)
	EnvNATSURL        = envcontract.NATSURL        // control-plane NATS URL (required unless WithStore)
	EnvJob            = envcontract.Job            // job id: KV bucket and event subjects (required unless WithStore)
	EnvRestartCount   = envcontract.RestartCount   // 0 for the first attempt, +1 per restart (default 0)
	EnvTimeout        = envcontract.Timeout        // collective default timeout (read by the supervisor; default 10m)
	EnvStoreTimeout   = envcontract.StoreTimeout   // store/init-barrier timeout as a Go duration (default 5m)
	// EnvStoreWait, set to 1/true, keeps retrying a store URL that refuses
	// connections for the whole store timeout; unset or 0/false, refused
	// connections end Init after natsstore.DefaultRefusedGrace.
	EnvStoreWait = envcontract.StoreWait

	EnvNATSToken    = envcontract.NATSToken    // NATS auth token
	EnvNATSUser     = envcontract.NATSUser     // NATS user (with EnvNATSPassword)
	EnvNATSPassword = envcontract.NATSPassword // NATS password
	EnvNATSNKey     = envcontract.NATSNKey     // path of an nkey seed file
	EnvNATSCreds    = envcontract.NATSCreds    // path of a JWT .creds file
	EnvNATSTLSCA    = envcontract.NATSTLSCA    // PEM CA bundle for the server certificate
	EnvNATSTLSCert  = envcontract.NATSTLSCert  // client certificate (mutual TLS)
	EnvNATSTLSKey   = envcontract.NATSTLSKey   // client key (mutual TLS)
)

// Errors returned by Init.
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

// envContract is the env contract as read once by readEnv (Init passes
// os.LookupEnv); internal/envcontract documents its fields.
type envContract = envcontract.Contract

// envInt is one integer variable of the contract.
type envInt = envcontract.Int

// readEnv reads every variable of the env contract once through lookup
// and parses it (envcontract.Read). A malformed value is an *EnvError
// naming its variable.
func readEnv(lookup func(string) (string, bool)) (envContract, error) {
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
func (c *config) merge(e envContract) error {
	c.env = e
	for _, v := range []struct {
		name     string
		env      envInt
		dst      *int
		byOption bool
		required bool
	}{
		{EnvRank, e.Rank, &c.rank, c.rankSet, true},
		{EnvWorldSize, e.WorldSize, &c.worldSize, c.worldSizeSet, true},
		{EnvLocalRank, e.LocalRank, &c.localRank, c.localRankSet, true},
		{EnvLocalWorldSize, e.LocalWorldSize, &c.localWorldSize, c.localWorldSizeSet, true},
		{EnvNodeRank, e.NodeRank, &c.nodeRank, c.nodeRankSet, true},
		{EnvRestartCount, e.RestartCount, &c.restartCount, c.restartCountSet, false},
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
				return &EnvError{Var: EnvNATSURL}
			}
			c.natsURL = e.NATSURL
		}
		if !c.jobSet {
			if e.Job == "" {
				return &EnvError{Var: EnvJob}
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

// validate checks the merged settings' consistency. A bad value is an
// *EnvError naming its variable when it came from the environment, or an
// *OptionError naming the option that set it.
func (c *config) validate() error {
	bad := func(envName, optName string, byOption bool, val int, msg string) error {
		if byOption {
			return &OptionError{Option: fmt.Sprintf("%s(%d)", optName, val), Msg: msg}
		}
		return &EnvError{Var: envName, Value: strconv.Itoa(val), Msg: msg}
	}
	switch {
	case c.worldSize < 1:
		return bad(EnvWorldSize, "WithWorldSize", c.worldSizeSet, c.worldSize, "world size must be at least 1")
	case c.rank < 0 || c.rank >= c.worldSize:
		return bad(EnvRank, "WithRank", c.rankSet, c.rank,
			fmt.Sprintf("rank must be in [0, %d) for world size %d", c.worldSize, c.worldSize))
	case c.localWorldSize < 1 || c.localWorldSize > c.worldSize:
		return bad(EnvLocalWorldSize, "WithLocalWorldSize", c.localWorldSizeSet, c.localWorldSize,
			fmt.Sprintf("local world size must be in [1, %d] for world size %d", c.worldSize, c.worldSize))
	case c.localRank < 0 || c.localRank >= c.localWorldSize:
		return bad(EnvLocalRank, "WithLocalRank", c.localRankSet, c.localRank,
			fmt.Sprintf("local rank must be in [0, %d) for local world size %d", c.localWorldSize, c.localWorldSize))
	case c.nodeRank < 0:
		return bad(EnvNodeRank, "WithNodeRank", c.nodeRankSet, c.nodeRank, "node rank must be ≥ 0")
	case c.restartCount < 0:
		return bad(EnvRestartCount, "WithRestartCount", c.restartCountSet, c.restartCount, "restart count must be ≥ 0")
	}
	if c.backend == nil {
		switch c.env.Backend {
		case "", "cpu", "nccl":
		default:
			return &EnvError{Var: EnvBackend, Value: c.env.Backend, Msg: `want "cpu" or "nccl"`}
		}
	}
	return nil
}
