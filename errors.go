package ranktree

import (
	"github.com/ranktree/ranktree/internal/bootstrap"
	"github.com/ranktree/ranktree/internal/metrics"
)

// Errors returned by Init.
var (
	// ErrEnv is returned (as *EnvError) when a required variable of the env
	// contract is missing or malformed.
	ErrEnv = bootstrap.ErrEnv
	// ErrInvalidOption is returned (as *OptionError) for a bad option value.
	ErrInvalidOption = bootstrap.ErrInvalidOption
	// ErrRankDead is returned by Init (as *InitError, with the dead ranks in
	// Dead) when the launcher reported that another rank of the attempt died
	// before Init finished. It is recoverable by relaunching the job
	// (rankrunner --max-restarts does).
	ErrRankDead = bootstrap.ErrRankDead
)

// EnvError reports a missing or malformed env-contract variable: Var (its
// name), Value (the malformed value, "" when missing) and Msg (what is
// wrong, "" when missing). A missing one reads like c10d's env://
// rendezvous: "environment variable RANK expected, but not set". It
// unwraps to ErrEnv.
type EnvError = bootstrap.EnvError

// OptionError reports a bad option value: Option names it ("WithRank(-1)"),
// Msg says what is wrong, Err is the underlying cause if any. It unwraps to
// ErrInvalidOption and to Err.
type OptionError = bootstrap.OptionError

// InitError is Init failing while it waited for the other ranks of the
// attempt (Stage: "init barrier", or "creating the default process
// group"; Rank: this rank). It names the ranks concerned: Dead, those the
// launcher reported dead (sorted by rank); Missing, those that had not
// reached the init barrier when it timed out (from *store.BarrierError).
// It unwraps to Err and, when Dead is not empty, to ErrRankDead. Its text
// reads "ranktree: rank 0: init barrier: rank 1 (signal: killed
// (SIGKILL)) died: <cause>".
type InitError = bootstrap.InitError

// DeadRank is the launcher's record of a rank process that ended with a
// failure: Rank, ExitCode (128+signal for a signal death), Status as
// os/exec words it ("exit code 7", "signal: killed (SIGKILL)") and Error,
// the error it reported if the launcher knows one. Its JSON is the value
// under DeadRankKey; String gives "rank 1 (signal: killed (SIGKILL))".
type DeadRank = bootstrap.DeadRank

// DeadRankPrefix is the store prefix, under the attempt's prefix
// "restart/<RANKTREE_RESTART_COUNT>/", where the launcher records ranks
// whose process exited non-zero or was killed: key DeadRankKey(rank),
// value the JSON of a DeadRank. rankrunner writes it; a custom launcher
// may too. Init watches it while it waits for the other ranks.
const DeadRankPrefix = bootstrap.DeadRankPrefix

// DeadRankKey is the key of rank's DeadRank under the attempt's prefix.
func DeadRankKey(rank int) string { return bootstrap.DeadRankKey(rank) }

// MetricsBindError is returned by Init when EnvMetricsAddr cannot be
// listened on (in use, malformed, not local); it names the address, and
// Init has connected nothing yet. Use errors.As.
type MetricsBindError = metrics.BindError
