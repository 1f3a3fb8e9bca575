package launcher

import (
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/cmd/rankrunner/internal/natsauth"
)

// Std selects standard streams, as torchrun's Std: 0 none, 1 stdout,
// 2 stderr, 3 both.
type Std uint8

// Stream selections.
const (
	StdNone Std = 0
	StdOut  Std = 1
	StdErr  Std = 2
	StdAll  Std = 3
)

// StdSpec is a --tee or --redirects value: one Std for every local rank
// ("3") or one per local rank ("0:1,1:3"; unlisted ranks get none).
type StdSpec struct {
	All      Std
	PerLocal map[int]Std // nil: All applies to every local rank
}

// For returns the selection for localRank.
func (s StdSpec) For(localRank int) Std {
	if s.PerLocal == nil {
		return s.All
	}
	return s.PerLocal[localRank]
}

// IsZero reports whether no stream of any rank is selected.
func (s StdSpec) IsZero() bool {
	if s.PerLocal == nil {
		return s.All == StdNone
	}
	for _, v := range s.PerLocal {
		if v != StdNone {
			return false
		}
	}
	return true
}

// ParseStdSpec parses torchrun's --tee/--redirects syntax: "N" or
// "local_rank:N,..." with N in 0..3.
func ParseStdSpec(s string) (StdSpec, error) {
	parse := func(v string) (Std, error) {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 || n > 3 {
			return 0, fmt.Errorf("%q is not 0 (none), 1 (stdout), 2 (stderr) or 3 (both)", v)
		}
		return Std(n), nil
	}
	if s == "" {
		return StdSpec{}, nil
	}
	if !strings.Contains(s, ":") {
		v, err := parse(s)
		return StdSpec{All: v}, err
	}
	spec := StdSpec{PerLocal: map[int]Std{}}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(part, ":")
		if !ok {
			return StdSpec{}, fmt.Errorf("%q: want local_rank:N", part)
		}
		lr, err := strconv.Atoi(strings.TrimSpace(k))
		if err != nil || lr < 0 {
			return StdSpec{}, fmt.Errorf("%q: bad local rank", part)
		}
		std, err := parse(v)
		if err != nil {
			return StdSpec{}, err
		}
		spec.PerLocal[lr] = std
	}
	return spec, nil
}

// FlagError is a bad launcher setting; Flag is the command-line spelling
// ("--node-rank") so the CLI can report a usage error naming it.
type FlagError struct {
	Flag string
	Msg  string
}

func (e *FlagError) Error() string { return fmt.Sprintf("invalid %s: %s", e.Flag, e.Msg) }

// Config is one runner's settings (torchrun's LaunchConfig). The zero value
// of each optional field is replaced by its default in validate.
type Config struct {
	// Program is a Go package path (built once with go build) or an
	// executable (a path, or a name looked up in PATH). Args follow it.
	Program string
	Args    []string

	// NProcPerNode is the number of ranks this runner starts (default 1;
	// the CLI resolves "gpu"/"auto" from NVML first).
	NProcPerNode int
	// NNodes is the number of runners of the job (default 1).
	NNodes int
	// NodeRank is this runner's node index, 0..NNodes-1 (GROUP_RANK).
	NodeRank int
	// Task, when set, pins the single rank this runner starts (Slurm one
	// task per rank); NProcPerNode is then ignored.
	Task *TaskSlot

	// NATSURL is the job's NATS server. Empty: node 0 serves an embedded
	// server at NATSListen (a random loopback port for a single node) and
	// the ranks use its URL.
	NATSURL string
	// NATSListen is host:port of node 0's embedded server. Given together
	// with NATSURL, node 0 still serves there (so every node of a Slurm or
	// Kubernetes job can run one identical command line) while all ranks use
	// NATSURL.
	NATSListen string
	// StoreDir is the embedded server's JetStream directory (default: a
	// temporary directory removed at exit).
	StoreDir string
	// Creds are the job's NATS credentials; passed to every rank.
	Creds natsauth.Credentials

	// JobID names the job: the KV bucket and event subjects. Default: random.
	JobID string
	// MaxRestarts is the job-wide restart budget (torchrun --max-restarts);
	// the first runner to reach the store fixes it for the whole job.
	MaxRestarts int
	// MonitorInterval is the supervision tick (torchrun --monitor-interval;
	// default 100ms). Rank exits, aborts and signals are pushed, and the
	// SIGKILL deadline has its own timer; the tick is a backstop.
	MonitorInterval time.Duration
	// FailureGrace is how long the other ranks may run on after a rank
	// fails (or another runner aborts the attempt) before they are sent
	// SIGTERM, so that they can report why the job failed and exit by
	// themselves; ranks that exit within it are not signalled (default 3s;
	// NoFailureGrace signals them at once).
	FailureGrace time.Duration
	// StopGrace is the time between SIGTERM and SIGKILL when stopping ranks
	// (default 3s): ranks are gone within FailureGrace+StopGrace of a
	// failure.
	StopGrace time.Duration
	// RunnerHeartbeat is how often a runner of a multi-runner job writes
	// its heartbeat key (default 5s, as torchrun's rendezvous keep-alive).
	RunnerHeartbeat time.Duration
	// RunnerTimeout is how long another runner's heartbeat may stay
	// silent before this runner aborts the attempt (default 30s; at least
	// twice RunnerHeartbeat). See keepalive.go.
	RunnerTimeout time.Duration
	// Timeout is the ranks' collective default timeout (RANKTREE_TIMEOUT);
	// 0 leaves it unset.
	Timeout time.Duration
	// StoreTimeout bounds connecting to the store (default 60s).
	StoreTimeout time.Duration
	// StoreWait keeps retrying a store URL that refuses connections for
	// the whole StoreTimeout (a server that starts later). Off, refused
	// connections end the runner after natsstore.DefaultRefusedGrace. The
	// ranks get it as RANKTREE_STORE_WAIT=1.
	StoreWait bool
	// MetricsAddr, when set, is where the runner serves Prometheus metrics
	// (host:port): its own (ranks alive, restarts, attempt outcomes) and,
	// relayed, its ranks' (each rank serves on a free loopback port). An
	// address that cannot be bound stops the runner before anything starts.
	MetricsAddr string

	// LogDir, when set, receives per-rank log files
	// LogDir/<job>/attempt_<n>/<rank>/{stdout,stderr}.log for the streams
	// Tee and Redirects select (both streams of every rank when neither is given).
	LogDir string
	// Tee copies the selected streams to log files and the console.
	Tee StdSpec
	// Redirects sends the selected streams to log files only.
	Redirects StdSpec

	// Stdout and Stderr receive the prefixed rank output (default os.Stdout/Stderr).
	Stdout, Stderr io.Writer
	// Color colours the "[rank N]" prefixes (set it when Stdout is a terminal).
	Color bool
	// CPUBind is how local ranks are bound to CPUs: CPUBindCore (default)
	// or CPUBindNone (--cpu-bind); see cpubind.go.
	CPUBind string

	// Env is the base environment of ranks (default os.Environ()).
	Env []string
	// Log is the runner's logger.
	Log zerolog.Logger
}

// NoFailureGrace as Config.FailureGrace stops the other ranks as soon as
// one fails (--failure-grace 0).
const NoFailureGrace time.Duration = -1

var jobIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// validate fills defaults and checks the settings; errors are *FlagError.
// It checks, in order, the job's layout, its timers and its output.
func (c *Config) validate() error {
	if err := c.validateLayout(); err != nil {
		return err
	}
	if err := c.validateTimers(); err != nil {
		return err
	}
	return c.validateOutput()
}

// validateLayout checks the program, the nodes and ranks, CPU binding, the
// job id and the NATS server.
func (c *Config) validateLayout() error {
	if c.Program == "" {
		return &FlagError{Flag: "PROGRAM", Msg: "no program to run"}
	}
	if c.NNodes == 0 {
		c.NNodes = 1
	}
	if c.NNodes < 0 {
		return &FlagError{Flag: "--nnodes", Msg: fmt.Sprintf("%d is not a positive node count", c.NNodes)}
	}
	if c.NodeRank < 0 || c.NodeRank >= c.NNodes {
		return &FlagError{Flag: "--node-rank", Msg: fmt.Sprintf("%d is outside 0..%d (--nnodes %d)", c.NodeRank, c.NNodes-1, c.NNodes)}
	}
	if c.Task == nil {
		if c.NProcPerNode == 0 {
			c.NProcPerNode = 1
		}
		if c.NProcPerNode < 0 {
			return &FlagError{Flag: "--nproc-per-node", Msg: fmt.Sprintf("%d is not a positive rank count", c.NProcPerNode)}
		}
	}
	switch c.CPUBind {
	case "":
		c.CPUBind = CPUBindCore
	case CPUBindCore, CPUBindNone:
	default:
		return &FlagError{Flag: "--cpu-bind", Msg: fmt.Sprintf("%q: want %s or %s", c.CPUBind, CPUBindCore, CPUBindNone)}
	}
	if c.JobID == "" {
		if c.NNodes > 1 {
			return &FlagError{Flag: "--job-id", Msg: "a multi-node job needs the same --job-id on every node"}
		}
		c.JobID = randomJobID()
	}
	if !jobIDRe.MatchString(c.JobID) {
		return &FlagError{Flag: "--job-id", Msg: fmt.Sprintf("%q: use 1-64 letters, digits, '-' or '_'", c.JobID)}
	}
	if c.NATSURL == "" && !c.leader() {
		return &FlagError{Flag: "--nats", Msg: fmt.Sprintf("node %d needs the URL of node 0's NATS server", c.NodeRank)}
	}
	if c.NATSURL == "" && c.NATSListen == "" {
		if c.NNodes > 1 {
			c.NATSListen = "0.0.0.0:4222"
		} else {
			c.NATSListen = "127.0.0.1:0"
		}
	}
	return nil
}

// validateTimers checks the restart budget, intervals, grace periods,
// heartbeats and timeouts, filling their defaults.
func (c *Config) validateTimers() error {
	if c.MaxRestarts < 0 {
		return &FlagError{Flag: "--max-restarts", Msg: fmt.Sprintf("%d is negative", c.MaxRestarts)}
	}
	if c.MonitorInterval == 0 {
		c.MonitorInterval = 100 * time.Millisecond
	}
	if c.MonitorInterval < 0 {
		return &FlagError{Flag: "--monitor-interval", Msg: "must be positive"}
	}
	if c.FailureGrace == 0 {
		c.FailureGrace = 3 * time.Second
	}
	if c.StopGrace == 0 {
		c.StopGrace = 3 * time.Second
	}
	if c.StopGrace < 0 {
		return &FlagError{Flag: "--stop-grace", Msg: "must be positive"}
	}
	if c.RunnerHeartbeat == 0 {
		c.RunnerHeartbeat = 5 * time.Second
	}
	if c.RunnerHeartbeat < 0 {
		return &FlagError{Flag: "--runner-heartbeat", Msg: "must be positive"}
	}
	if c.RunnerTimeout == 0 {
		c.RunnerTimeout = max(30*time.Second, 2*c.RunnerHeartbeat)
	}
	if c.RunnerTimeout < 2*c.RunnerHeartbeat {
		return &FlagError{Flag: "--runner-timeout", Msg: fmt.Sprintf("%v is less than twice --runner-heartbeat (%v)", c.RunnerTimeout, c.RunnerHeartbeat)}
	}
	if c.Timeout < 0 {
		return &FlagError{Flag: "--timeout", Msg: "must be positive"}
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = 60 * time.Second
	}
	return nil
}

// validateOutput checks log files and credentials and fills the default
// streams and environment.
func (c *Config) validateOutput() error {
	if c.LogDir == "" && (!c.Tee.IsZero() || !c.Redirects.IsZero()) {
		return &FlagError{Flag: "--log-dir", Msg: "--tee and --redirects write log files and need --log-dir"}
	}
	if c.LogDir != "" && c.Tee.IsZero() && c.Redirects.IsZero() {
		c.Tee = StdSpec{All: StdAll}
	}
	if err := c.Creds.Validate(); err != nil {
		return &FlagError{Flag: strings.Fields(err.Error())[0], Msg: err.Error()}
	}
	if c.Stdout == nil {
		c.Stdout = os.Stdout
	}
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	if c.Env == nil {
		c.Env = os.Environ()
	}
	return nil
}

// slots returns the ranks this runner starts, and the world size.
func (c *Config) slots() (ranks []RankSlot, world, localWorld int) {
	if c.Task != nil {
		return []RankSlot{{Rank: c.Task.Rank, LocalRank: c.Task.LocalRank}}, c.Task.WorldSize, c.Task.LocalWorldSize
	}
	for i := 0; i < c.NProcPerNode; i++ {
		ranks = append(ranks, RankSlot{Rank: c.NodeRank*c.NProcPerNode + i, LocalRank: i})
	}
	return ranks, c.NNodes * c.NProcPerNode, c.NProcPerNode
}

// runnerID names this runner in abort and done keys: "node<k>", or
// "task<rank>" for one task per rank; numRunners is how many runners the job has.
func (c *Config) runnerID() (id string, numRunners int) {
	if c.Task != nil {
		return fmt.Sprintf("task%d", c.Task.Rank), c.Task.WorldSize
	}
	return fmt.Sprintf("node%d", c.NodeRank), c.NNodes
}

// serves reports whether this runner starts the embedded NATS server.
func (c *Config) serves() bool {
	return c.leader() && (c.NATSURL == "" || c.NATSListen != "")
}

// runnerIDs lists every runner id of the job (see runnerID).
func (c *Config) runnerIDs() []string {
	_, n := c.runnerID()
	ids := make([]string, n)
	for i := range ids {
		if c.Task != nil {
			ids[i] = fmt.Sprintf("task%d", i)
		} else {
			ids[i] = fmt.Sprintf("node%d", i)
		}
	}
	return ids
}

// leader reports whether this runner serves the embedded NATS server when
// no --nats is given: node 0, or the task of rank 0.
func (c *Config) leader() bool {
	if c.Task != nil {
		return c.Task.Rank == 0
	}
	return c.NodeRank == 0
}

// RankSlot is one rank a runner starts.
type RankSlot struct {
	Rank      int // global rank (RANK)
	LocalRank int // LOCAL_RANK
}
