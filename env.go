package ranktree

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Environment variables of the env contract between rankrunner and Init.
// The rank variables are torchrun's (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK; RANKTREE_RESTART_COUNT plays
// TORCHELASTIC_RESTART_COUNT); the rest configure the NATS control plane.
const (
	EnvRank           = "RANK"                   // global rank, 0..WORLD_SIZE-1 (required)
	EnvWorldSize      = "WORLD_SIZE"             // ranks in the job (required)
	EnvLocalRank      = "LOCAL_RANK"             // rank within this node (required)
	EnvLocalWorldSize = "LOCAL_WORLD_SIZE"       // ranks on this node (required)
	EnvGroupRank      = "GROUP_RANK"             // node rank, torchrun's group rank (required)
	EnvNATSURL        = "RANKTREE_NATS_URL"      // control-plane NATS URL (required unless WithStore)
	EnvJob            = "RANKTREE_JOB"           // job id: KV bucket and event subjects (required unless WithStore)
	EnvRestartCount   = "RANKTREE_RESTART_COUNT" // 0 for the first attempt, +1 per restart (default 0)
	EnvTimeout        = "RANKTREE_TIMEOUT"       // collective default timeout (read by the supervisor; default 10m)
	EnvStoreTimeout   = "RANKTREE_STORE_TIMEOUT" // store/init-barrier timeout as a Go duration (default 5m)
	// EnvStoreWait, set to 1/true, keeps retrying a store URL that refuses
	// connections for the whole store timeout; unset or 0/false, refused
	// connections end Init after natsstore.DefaultRefusedGrace.
	EnvStoreWait = "RANKTREE_STORE_WAIT"

	EnvNATSToken    = "RANKTREE_NATS_TOKEN"    // NATS auth token
	EnvNATSUser     = "RANKTREE_NATS_USER"     // NATS user (with EnvNATSPassword)
	EnvNATSPassword = "RANKTREE_NATS_PASSWORD" // NATS password
	EnvNATSNKey     = "RANKTREE_NATS_NKEY"     // path of an nkey seed file
	EnvNATSCreds    = "RANKTREE_NATS_CREDS"    // path of a JWT .creds file
	EnvNATSTLSCA    = "RANKTREE_NATS_TLS_CA"   // PEM CA bundle for the server certificate
	EnvNATSTLSCert  = "RANKTREE_NATS_TLS_CERT" // client certificate (mutual TLS)
	EnvNATSTLSKey   = "RANKTREE_NATS_TLS_KEY"  // client key (mutual TLS)
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

// fromEnv fills every field of c that no option set, from lookup
// (os.LookupEnv in Init).
func (c *config) fromEnv(lookup func(string) (string, bool)) error {
	ints := []struct {
		name     string
		dst      *int
		set      *bool
		required bool
	}{
		{EnvRank, &c.rank, &c.rankSet, true},
		{EnvWorldSize, &c.worldSize, &c.worldSizeSet, true},
		{EnvLocalRank, &c.localRank, &c.localRankSet, true},
		{EnvLocalWorldSize, &c.localWorldSize, &c.localWorldSizeSet, true},
		{EnvGroupRank, &c.groupRank, &c.groupRankSet, true},
		{EnvRestartCount, &c.restartCount, &c.restartCountSet, false},
	}
	for _, v := range ints {
		if *v.set {
			continue
		}
		s, ok := lookup(v.name)
		if !ok || s == "" {
			if v.required {
				return &EnvError{Var: v.name}
			}
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return &EnvError{Var: v.name, Value: s, Msg: "not an integer"}
		}
		*v.dst, *v.set = n, true
	}
	if c.store == nil {
		if !c.natsURLSet {
			s, ok := lookup(EnvNATSURL)
			if !ok || s == "" {
				return &EnvError{Var: EnvNATSURL}
			}
			c.natsURL, c.natsURLSet = s, true
		}
		if !c.jobSet {
			s, ok := lookup(EnvJob)
			if !ok || s == "" {
				return &EnvError{Var: EnvJob}
			}
			c.job, c.jobSet = s, true
		}
	} else if !c.jobSet {
		if s, ok := lookup(EnvJob); ok && s != "" {
			c.job = s
		} else {
			c.job = "local"
		}
		c.jobSet = true
	}
	if !c.timeoutSet {
		if s, ok := lookup(EnvStoreTimeout); ok && s != "" {
			d, err := time.ParseDuration(s)
			if err != nil || d <= 0 {
				return &EnvError{Var: EnvStoreTimeout, Value: s, Msg: "not a positive Go duration (e.g. 5m)"}
			}
			c.timeout, c.timeoutSet = d, true
		}
	}
	if s, ok := lookup(EnvStoreWait); ok && s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return &EnvError{Var: EnvStoreWait, Value: s, Msg: "not a boolean (1, true, 0, false)"}
		}
		c.storeWait = b
	}
	for _, v := range []struct {
		name string
		dst  *string
	}{
		{EnvNATSToken, &c.creds.Token}, {EnvNATSUser, &c.creds.User}, {EnvNATSPassword, &c.creds.Password},
		{EnvNATSNKey, &c.creds.NKeyFile}, {EnvNATSCreds, &c.creds.CredsFile}, {EnvNATSTLSCA, &c.creds.TLSCA},
		{EnvNATSTLSCert, &c.creds.TLSCert}, {EnvNATSTLSKey, &c.creds.TLSKey},
	} {
		if s, ok := lookup(v.name); ok {
			*v.dst = s
		}
	}
	return nil
}

// validate checks the ranks' consistency once env and options are merged.
func (c *config) validate() error {
	bad := func(name string, val int, msg string) error {
		return fmt.Errorf("ranktree: %s=%d: %s: %w", name, val, msg, ErrEnv)
	}
	switch {
	case c.worldSize < 1:
		return bad("world size", c.worldSize, "must be at least 1")
	case c.rank < 0 || c.rank >= c.worldSize:
		return bad("rank", c.rank, fmt.Sprintf("must be in [0, %d) for world size %d", c.worldSize, c.worldSize))
	case c.localWorldSize < 1 || c.localWorldSize > c.worldSize:
		return bad("local world size", c.localWorldSize, fmt.Sprintf("must be in [1, %d]", c.worldSize))
	case c.localRank < 0 || c.localRank >= c.localWorldSize:
		return bad("local rank", c.localRank, fmt.Sprintf("must be in [0, %d)", c.localWorldSize))
	case c.groupRank < 0:
		return bad("group rank", c.groupRank, "must be ≥ 0")
	case c.restartCount < 0:
		return bad("restart count", c.restartCount, "must be ≥ 0")
	}
	return nil
}
