package supervisor

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/ranktree/ranktree/actors"
)

// ErrorHandling is the watchdog's policy after a timeout, an async engine
// error or a remote abort, as c10d's TORCH_NCCL_ASYNC_ERROR_HANDLING. In
// every mode the failing Work gets its typed error and the flight recorder
// is dumped; the modes differ in what follows. The zero value means
// "unset" and Config.validate turns it into TearDown.
type ErrorHandling uint8

// Error-handling modes. Their torch numeric values (accepted by
// ParseErrorHandling) are NoHandling 0, TearDown 1, CleanupOnly 2,
// SkipCleanup 3.
const (
	// TearDown (default): fail the group's Works, abort the communicator,
	// write abort/<comm-id>, dump, then exit the process non-zero so that
	// rankrunner can restart the job.
	TearDown ErrorHandling = iota + 1
	// CleanupOnly: fail the group's Works, abort the communicator, write
	// abort/<comm-id> and dump; the process lives on and callers see the
	// errors (re-create the group to continue).
	CleanupOnly
	// SkipCleanup: fail the group's Works, write abort/<comm-id>, dump and
	// exit non-zero without aborting the communicator (for engines whose
	// abort may itself hang).
	SkipCleanup
	// NoHandling: only fail the timed-out or failed Work and dump; the
	// communicator is neither aborted nor announced to peers.
	NoHandling
)

var ehNames = [...]string{"", "TearDown", "CleanupOnly", "SkipCleanup", "NoHandling"}

// String is the mode's name, e.g. "TearDown".
func (m ErrorHandling) String() string {
	if int(m) < len(ehNames) && m != 0 {
		return ehNames[m]
	}
	if m == 0 {
		return "unset"
	}
	return fmt.Sprintf("ErrorHandling(%d)", uint8(m))
}

// TorchValue is the mode's TORCH_NCCL_ASYNC_ERROR_HANDLING number (-1 if unset).
func (m ErrorHandling) TorchValue() int {
	switch m {
	case NoHandling:
		return 0
	case TearDown:
		return 1
	case CleanupOnly:
		return 2
	case SkipCleanup:
		return 3
	}
	return -1
}

// abortsComm reports whether the mode aborts the local communicator.
func (m ErrorHandling) abortsComm() bool { return m == TearDown || m == CleanupOnly }

// announces reports whether the mode writes abort/<comm-id> for peers.
func (m ErrorHandling) announces() bool { return m != NoHandling }

// exits reports whether the mode ends the process.
func (m ErrorHandling) exits() bool { return m == TearDown || m == SkipCleanup }

// ParseErrorHandling parses a mode from its torch number ("0"-"3") or its
// name, case-insensitive, with or without '_' ("TearDown", "tear_down",
// "CleanUpOnly", "skip_cleanup", "no_handling").
func ParseErrorHandling(s string) (ErrorHandling, error) {
	t := strings.ToLower(strings.ReplaceAll(strings.TrimSpace(s), "_", ""))
	switch t {
	case "0", "nohandling":
		return NoHandling, nil
	case "1", "teardown":
		return TearDown, nil
	case "2", "cleanuponly":
		return CleanupOnly, nil
	case "3", "skipcleanup":
		return SkipCleanup, nil
	}
	return 0, fmt.Errorf("want 0-3 or TearDown, CleanupOnly, SkipCleanup, NoHandling")
}

// Environment variables read by ConfigFromEnv.
const (
	EnvAsyncErrorHandling      = "RANKTREE_ASYNC_ERROR_HANDLING"
	EnvTorchAsyncErrorHandling = "TORCH_NCCL_ASYNC_ERROR_HANDLING" // alias, used when the former is unset
	EnvBlockingWait            = "RANKTREE_BLOCKING_WAIT"
	EnvTimeout                 = "RANKTREE_TIMEOUT"
	EnvHeartbeatTimeout        = "RANKTREE_HEARTBEAT_TIMEOUT"
	EnvTraceBufferSize         = "RANKTREE_TRACE_BUFFER_SIZE"
	EnvTraceDir                = "RANKTREE_TRACE_DIR"
	EnvEvents                  = "RANKTREE_EVENTS"
	EnvActorPanic              = "RANKTREE_ACTOR_PANIC"
)

// Defaults filled in by Config.validate.
const (
	DefaultTimeout          = 10 * time.Minute // c10d's default collective timeout
	DefaultHeartbeatTimeout = 8 * time.Minute  // TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC's default
	DefaultTraceBufferSize  = 2000             // entries per group
	DefaultWatchdogInterval = 100 * time.Millisecond
	// MaxDuration bounds RANKTREE_TIMEOUT and RANKTREE_HEARTBEAT_TIMEOUT.
	MaxDuration = 30 * 24 * time.Hour
	// MaxTraceBufferSize bounds RANKTREE_TRACE_BUFFER_SIZE.
	MaxTraceBufferSize = 1 << 20
	// TraceDisabled as Config.TraceBufferSize turns the flight recorder off
	// (RANKTREE_TRACE_BUFFER_SIZE=0).
	TraceDisabled = -1
)

// ErrInvalidConfig is wrapped by every *ConfigError.
var ErrInvalidConfig = errors.New("supervisor: invalid configuration")

// ConfigError names the variable (or Config field) and value that are
// invalid. It unwraps to ErrInvalidConfig; ranktree.Init reports it as a
// *ranktree.EnvError naming the same variable.
type ConfigError struct {
	Var   string // environment variable or Config field
	Value string
	Msg   string
}

// Error names the variable, its value and what is wrong.
func (e *ConfigError) Error() string {
	return fmt.Sprintf("supervisor: invalid %s=%q: %s", e.Var, e.Value, e.Msg)
}

// Unwrap returns ErrInvalidConfig.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// Config is the rank's supervision policy. The zero value is valid after
// validate: every zero field takes its default.
type Config struct {
	// ErrorHandling is the policy after a timeout, async error or remote
	// abort (RANKTREE_ASYNC_ERROR_HANDLING; default TearDown).
	ErrorHandling ErrorHandling
	// BlockingWait makes Work.Wait enforce the Work's deadline itself
	// (RANKTREE_BLOCKING_WAIT; c10d TORCH_NCCL_BLOCKING_WAIT).
	BlockingWait bool
	// Timeout is the default per-group op deadline (RANKTREE_TIMEOUT;
	// default 10 min).
	Timeout time.Duration
	// HeartbeatTimeout is how long the watchdog may go without progress
	// before the heartbeat monitor dumps and tears the process down
	// (RANKTREE_HEARTBEAT_TIMEOUT; default 8 min).
	HeartbeatTimeout time.Duration
	// TraceBufferSize is the flight recorder's ring size per group
	// (RANKTREE_TRACE_BUFFER_SIZE; default 2000; TraceDisabled turns it off).
	TraceBufferSize int
	// TraceDir is where flight-recorder dumps are written as files
	// (RANKTREE_TRACE_DIR; "" writes them only to the store).
	TraceDir string
	// Events selects the events published (RANKTREE_EVENTS; default all).
	Events actors.EventsLevel
	// WatchdogInterval is the watchdog's tick period: deadlines are checked
	// and engine async errors polled this often (default 100 ms).
	WatchdogInterval time.Duration
	// ActorPanic is what a panic in one of the rank's actors leads to
	// (RANKTREE_ACTOR_PANIC=escalate|restart; zero, unset, escalates).
	// PanicRestart needs ErrorHandling CleanupOnly (the process must
	// survive the group's abort) and selects it when ErrorHandling is unset.
	ActorPanic PanicPolicy
}

// validate fills defaults and rejects out-of-range fields with a
// *ConfigError naming the field.
func (c *Config) validate() error {
	switch c.ActorPanic {
	case 0, PanicEscalate: // 0 (unset) behaves as PanicEscalate
	case PanicRestart:
		if c.ErrorHandling == 0 {
			c.ErrorHandling = CleanupOnly
		}
		if c.ErrorHandling != CleanupOnly {
			return &ConfigError{Var: EnvActorPanic, Value: c.ActorPanic.String(),
				Msg: fmt.Sprintf("restart needs %s=CleanupOnly or unset (it is %v: TearDown and SkipCleanup end the process on the abort, NoHandling never tells the peers)",
					EnvAsyncErrorHandling, c.ErrorHandling)}
		}
	default:
		return &ConfigError{Var: "Config.ActorPanic", Value: c.ActorPanic.String(), Msg: "unknown policy"}
	}
	if c.ErrorHandling == 0 {
		c.ErrorHandling = TearDown
	}
	if c.ErrorHandling > NoHandling {
		return &ConfigError{Var: "Config.ErrorHandling", Value: c.ErrorHandling.String(), Msg: "unknown mode"}
	}
	dur := func(name string, d *time.Duration, def time.Duration) error {
		switch {
		case *d == 0:
			*d = def
		case *d < 0 || *d > MaxDuration:
			return &ConfigError{Var: name, Value: d.String(), Msg: fmt.Sprintf("must be in (0, %v]", MaxDuration)}
		}
		return nil
	}
	if err := dur("Config.Timeout", &c.Timeout, DefaultTimeout); err != nil {
		return err
	}
	if err := dur("Config.HeartbeatTimeout", &c.HeartbeatTimeout, DefaultHeartbeatTimeout); err != nil {
		return err
	}
	if err := dur("Config.WatchdogInterval", &c.WatchdogInterval, DefaultWatchdogInterval); err != nil {
		return err
	}
	switch {
	case c.TraceBufferSize == 0:
		c.TraceBufferSize = DefaultTraceBufferSize
	case c.TraceBufferSize < TraceDisabled || c.TraceBufferSize > MaxTraceBufferSize:
		return &ConfigError{Var: "Config.TraceBufferSize", Value: strconv.Itoa(c.TraceBufferSize),
			Msg: fmt.Sprintf("must be TraceDisabled or in [1, %d]", MaxTraceBufferSize)}
	}
	if c.Events > actors.EventsOff {
		return &ConfigError{Var: "Config.Events", Value: c.Events.String(), Msg: "unknown level"}
	}
	return nil
}

// Validate returns a copy of c with defaults filled in, or a *ConfigError.
func (c Config) Validate() (Config, error) {
	err := c.validate()
	return c, err
}

// ConfigFromEnv reads the RANKTREE_* variables (see the Env* constants)
// through getenv (os.Getenv in production) and returns a validated Config.
// Unset or empty variables take their defaults. Invalid values ("abc", "-1",
// out of range) give a *ConfigError naming the variable.
//
// Formats: durations as Go durations ("90s", "10m") or a bare number of
// seconds ("600"); booleans as strconv.ParseBool ("1", "true", "0", "false");
// RANKTREE_TRACE_BUFFER_SIZE as an integer in [0, MaxTraceBufferSize] where
// 0 disables the flight recorder; RANKTREE_ACTOR_PANIC as escalate or
// restart (restart with RANKTREE_ASYNC_ERROR_HANDLING set to anything but
// CleanupOnly is rejected, naming RANKTREE_ACTOR_PANIC).
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var c Config
	if name, v := firstSet(getenv, EnvAsyncErrorHandling, EnvTorchAsyncErrorHandling); v != "" {
		m, err := ParseErrorHandling(v)
		if err != nil {
			return Config{}, &ConfigError{Var: name, Value: v, Msg: err.Error()}
		}
		c.ErrorHandling = m
	}
	if v := strings.TrimSpace(getenv(EnvBlockingWait)); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return Config{}, &ConfigError{Var: EnvBlockingWait, Value: v, Msg: "want a boolean (1, 0, true, false)"}
		}
		c.BlockingWait = b
	}
	var err error
	if c.Timeout, err = envDuration(getenv, EnvTimeout); err != nil {
		return Config{}, err
	}
	if c.HeartbeatTimeout, err = envDuration(getenv, EnvHeartbeatTimeout); err != nil {
		return Config{}, err
	}
	if v := strings.TrimSpace(getenv(EnvTraceBufferSize)); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > MaxTraceBufferSize {
			return Config{}, &ConfigError{Var: EnvTraceBufferSize, Value: v,
				Msg: fmt.Sprintf("want an integer in [0, %d] (0 disables the flight recorder)", MaxTraceBufferSize)}
		}
		c.TraceBufferSize = n
		if n == 0 {
			c.TraceBufferSize = TraceDisabled
		}
	}
	c.TraceDir = strings.TrimSpace(getenv(EnvTraceDir))
	if v := getenv(EnvEvents); v != "" {
		l, err := actors.ParseEventsLevel(v)
		if err != nil {
			return Config{}, &ConfigError{Var: EnvEvents, Value: v, Msg: "want all, errors or off"}
		}
		c.Events = l
	}
	if v := strings.TrimSpace(getenv(EnvActorPanic)); v != "" {
		p, err := ParsePanicPolicy(v)
		if err != nil {
			return Config{}, &ConfigError{Var: EnvActorPanic, Value: v, Msg: err.Error()}
		}
		c.ActorPanic = p
	}
	if err := c.validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func firstSet(getenv func(string) string, names ...string) (string, string) {
	for _, n := range names {
		if v := strings.TrimSpace(getenv(n)); v != "" {
			return n, v
		}
	}
	return names[0], ""
}

// envDuration parses a positive duration ("90s", "10m", or seconds "600");
// unset gives 0 (the default).
func envDuration(getenv func(string) string, name string) (time.Duration, error) {
	v := strings.TrimSpace(getenv(name))
	if v == "" {
		return 0, nil
	}
	bad := &ConfigError{Var: name, Value: v, Msg: fmt.Sprintf("want a duration in (0, %v] such as 90s, 10m or a number of seconds", MaxDuration)}
	var d time.Duration
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if math.IsNaN(f) || f <= 0 || f > MaxDuration.Seconds() {
			return 0, bad
		}
		d = time.Duration(f * float64(time.Second))
	} else {
		d, err = time.ParseDuration(v)
		if err != nil {
			return 0, bad
		}
	}
	if d <= 0 || d > MaxDuration {
		return 0, bad
	}
	return d, nil
}
