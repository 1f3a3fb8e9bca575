package ranktree

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/internal/metrics"
	"github.com/ranktree/ranktree/store/natsstore"
	"github.com/ranktree/ranktree/supervisor"
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
	EnvNodeRank       = "GROUP_RANK"             // node rank, 0..nodes-1: torchrun's GROUP_RANK, not a rank in a process group (required)
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

// envContract is the env contract as one rank reads it: every variable the
// runtime consults, read once by readEnv (Init passes os.LookupEnv) into
// typed fields and passed down from there to the store dial
// (NATSURL, Job, StoreTimeout, StoreWait, Creds), the engine choice
// (Backend, CPU), fault injection (Faults), the supervision tree
// (Supervision) and the metrics server (MetricsAddr, MetricsAddrFile).
// Nothing below Init reads the process environment for these variables.
// (RANKTREE_ERROR_FILE is the exception: recordError reads it on its own
// so that an Init that fails while parsing can still report it.)
//
// A value that does not parse is an *EnvError from readEnv naming the
// variable; what may be missing, and whether the ranks are consistent, is
// decided by config.validate once options are merged in.
type envContract struct {
	// Identity: torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
	// GROUP_RANK (the node rank) and RANKTREE_RESTART_COUNT (torchrun's
	// TORCHELASTIC_RESTART_COUNT). Set is false when unset or empty.
	Rank, WorldSize, LocalRank, LocalWorldSize, NodeRank, RestartCount envInt

	NATSURL      string                // RANKTREE_NATS_URL; "" when unset
	Job          string                // RANKTREE_JOB; "" when unset
	StoreTimeout time.Duration         // RANKTREE_STORE_TIMEOUT; 0 when unset
	StoreWait    bool                  // RANKTREE_STORE_WAIT
	Creds        natsstore.Credentials // RANKTREE_NATS_TOKEN ... RANKTREE_NATS_TLS_KEY

	// Backend is RANKTREE_BACKEND as given ("", "cpu" or "nccl"; checked
	// by validate, and only when no WithBackend option replaces it).
	Backend string
	CPU     cpuEnv       // the CPU engine's transport and listener placement
	Faults  []comm.Fault // RANKTREE_FAULT, parsed (nil when unset)

	// Supervision is the supervisor's configuration from RANKTREE_TIMEOUT,
	// RANKTREE_ASYNC_ERROR_HANDLING (or TORCH_NCCL_ASYNC_ERROR_HANDLING),
	// RANKTREE_BLOCKING_WAIT, RANKTREE_HEARTBEAT_TIMEOUT,
	// RANKTREE_TRACE_BUFFER_SIZE, RANKTREE_TRACE_DIR, RANKTREE_EVENTS and
	// RANKTREE_ACTOR_PANIC, validated by supervisor.ConfigFromEnv.
	Supervision supervisor.Config
	// supervisionVars holds the supervisor's variables as read, so that an
	// option replacing one of them (WithActorPanic) re-derives the
	// configuration without reading the environment again.
	supervisionVars map[string]string

	MetricsAddr     string // RANKTREE_METRICS_ADDR; "" serves no metrics
	MetricsAddrFile string // RANKTREE_METRICS_ADDR_FILE; "" writes none
}

// envInt is one integer variable of the contract.
type envInt struct {
	Value int
	Set   bool // the variable was present and non-empty
}

// cpuEnv is the CPU engine's part of the contract (see cpuenv.go).
type cpuEnv struct {
	Transport     string // RANKTREE_TRANSPORT: "", "auto", "shm" or "tcp"
	HostID        string // RANKTREE_HOST_ID
	SocketIfname  string // RANKTREE_SOCKET_IFNAME
	ListenHost    string // RANKTREE_LISTEN_HOST
	AdvertiseHost string // RANKTREE_ADVERTISE_HOST
	// FlatThreshold is RANKTREE_FLAT_THRESHOLD: the largest message in
	// bytes of the one-step shared-memory algorithms (0: the engine's
	// default, -1: off).
	FlatThreshold int
}

// readEnv reads every variable of the env contract once through lookup
// and parses it. A malformed value is an *EnvError naming its variable.
func readEnv(lookup func(string) (string, bool)) (envContract, error) {
	get := func(k string) string {
		v, _ := lookup(k)
		return v
	}
	var e envContract
	for _, v := range []struct {
		name string
		dst  *envInt
	}{
		{EnvRank, &e.Rank}, {EnvWorldSize, &e.WorldSize}, {EnvLocalRank, &e.LocalRank},
		{EnvLocalWorldSize, &e.LocalWorldSize}, {EnvNodeRank, &e.NodeRank}, {EnvRestartCount, &e.RestartCount},
	} {
		s := get(v.name)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return e, &EnvError{Var: v.name, Value: s, Msg: "not an integer"}
		}
		*v.dst = envInt{Value: n, Set: true}
	}
	e.NATSURL, e.Job = get(EnvNATSURL), get(EnvJob)
	if s := get(EnvStoreTimeout); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return e, &EnvError{Var: EnvStoreTimeout, Value: s, Msg: "not a positive Go duration (e.g. 5m)"}
		}
		e.StoreTimeout = d
	}
	if s := get(EnvStoreWait); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return e, &EnvError{Var: EnvStoreWait, Value: s, Msg: "not a boolean (1, true, 0, false)"}
		}
		e.StoreWait = b
	}
	e.Creds = natsstore.Credentials{
		Token: get(EnvNATSToken), User: get(EnvNATSUser), Password: get(EnvNATSPassword),
		NKeyFile: get(EnvNATSNKey), CredsFile: get(EnvNATSCreds), TLSCA: get(EnvNATSTLSCA),
		TLSCert: get(EnvNATSTLSCert), TLSKey: get(EnvNATSTLSKey),
	}
	e.Backend = get(EnvBackend)
	cpuE, err := readCPUEnv(get)
	if err != nil {
		return e, err
	}
	e.CPU = cpuE
	if s := get(EnvFault); s != "" {
		faults, err := comm.ParseFaults(s)
		if err != nil {
			return e, &EnvError{Var: EnvFault, Value: s, Msg: err.Error()}
		}
		e.Faults = faults
	}
	// The supervision variables are checked here, before anything
	// connects, so bad values fail fast; the ones read are kept.
	e.supervisionVars = map[string]string{}
	sup, err := supervisor.ConfigFromEnv(func(k string) string {
		v := get(k)
		e.supervisionVars[k] = v
		return v
	})
	if err != nil {
		var ce *supervisor.ConfigError
		if errors.As(err, &ce) {
			return e, &EnvError{Var: ce.Var, Value: ce.Value, Msg: ce.Msg}
		}
		return e, err
	}
	e.Supervision = sup
	e.MetricsAddr, e.MetricsAddrFile = get(metrics.EnvAddr), get(metrics.EnvAddrFile)
	return e, nil
}

// readCPUEnv parses the CPU engine's variables (see cpuenv.go).
func readCPUEnv(get func(string) string) (cpuEnv, error) {
	c := cpuEnv{
		Transport: get(EnvTransport), HostID: get(EnvHostID), SocketIfname: get(EnvSocketIfname),
		ListenHost: get(EnvListenHost), AdvertiseHost: get(EnvAdvertiseHost),
	}
	if s := get(EnvFlatThreshold); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < -1 || n > 16<<20 {
			return c, &EnvError{Var: EnvFlatThreshold, Value: s, Msg: "want a size in bytes up to 16777216, or -1 for off"}
		}
		c.FlatThreshold = n
	}
	return c, nil
}

// supervisionWith re-derives the supervisor's configuration from the
// variables as read, with variable k replaced by v (an option's value).
func (e *envContract) supervisionWith(k, v string) (supervisor.Config, error) {
	return supervisor.ConfigFromEnv(func(name string) string {
		if name == k {
			return v
		}
		return e.supervisionVars[name]
	})
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
