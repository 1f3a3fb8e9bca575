package ranktree

import (
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/internal/bootstrap"
	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/supervisor"
)

// Option overrides one setting of the env contract (or adds one the
// environment cannot carry, like WithStore). Options win over variables.
// A bad value makes Init return an *OptionError naming the option.
type Option func(*bootstrap.Config) error

// WithRank sets the global rank (overrides RANK); 0 ≤ rank < world size.
func WithRank(rank int) Option { return Option(bootstrap.WithRank(rank)) }

// WithWorldSize sets the number of ranks (overrides WORLD_SIZE); ≥ 1.
func WithWorldSize(n int) Option { return Option(bootstrap.WithWorldSize(n)) }

// WithLocalRank sets the rank within the node (overrides LOCAL_RANK).
func WithLocalRank(rank int) Option { return Option(bootstrap.WithLocalRank(rank)) }

// WithLocalWorldSize sets the ranks on this node (overrides LOCAL_WORLD_SIZE); ≥ 1.
func WithLocalWorldSize(n int) Option { return Option(bootstrap.WithLocalWorldSize(n)) }

// WithNodeRank sets the node rank, the index of this rank's node among the
// job's nodes, 0 ≤ node rank < number of nodes (overrides GROUP_RANK,
// torchrun's name for it). It is not a rank within a process group: see
// comm.ProcessGroup.Rank for that.
func WithNodeRank(rank int) Option { return Option(bootstrap.WithNodeRank(rank)) }

// WithRestartCount sets the restart attempt (overrides RANKTREE_RESTART_COUNT).
// Store keys of attempt n live under "restart/<n>/".
func WithRestartCount(n int) Option { return Option(bootstrap.WithRestartCount(n)) }

// WithNATSURL sets the control-plane NATS URL (overrides RANKTREE_NATS_URL).
func WithNATSURL(url string) Option { return Option(bootstrap.WithNATSURL(url)) }

// WithJob sets the job id (overrides RANKTREE_JOB): it selects the KV bucket
// and the event subjects ranktree.<job>.events.>.
func WithJob(job string) Option { return Option(bootstrap.WithJob(job)) }

// WithStore makes Init use s as the job store instead of connecting to NATS
// (RANKTREE_NATS_URL is then not needed, and the job defaults to "local"):
// single-process jobs and tests pass a store.NewMemStore(). The caller keeps
// ownership: Runtime.Close does not close s.
func WithStore(s store.Store) Option { return Option(bootstrap.WithStore(s)) }

// WithLogger sets the base logger; the runtime adds job and rank fields.
// Default: JSON lines on stderr at info level.
func WithLogger(l zerolog.Logger) Option { return Option(bootstrap.WithLogger(l)) }

// WithTimeout sets the store timeout and the init barrier's timeout
// (overrides RANKTREE_STORE_TIMEOUT; default 5 min, c10d's store default).
func WithTimeout(d time.Duration) Option { return Option(bootstrap.WithTimeout(d)) }

// WithBackend makes Init create every process group's engine with f instead
// of the built-in CPU engine (cpu.Factory). Tests use it to run ranks in one
// process over the in-memory transport.
func WithBackend(f comm.BackendFactory) Option { return Option(bootstrap.WithBackend(f)) }

// WithDevice sets the accelerator every process group of the rank runs on:
// the CUDA ordinal the engine binds (c10d: init_process_group's device_id).
// Without it, RANKTREE_BACKEND=nccl picks LOCAL_RANK modulo the GPU count
// NVML sees, and every other engine runs on the host (device -1). Use it
// with WithBackend(nccl.Factory(opts)) to give the NCCL engine options of
// your own. A negative ordinal is an *OptionError.
func WithDevice(ordinal int) Option { return Option(bootstrap.WithDevice(ordinal)) }

// WithActorPanic sets what a panic in one of the rank's actors leads to
// (overrides RANKTREE_ACTOR_PANIC=escalate|restart):
//
//   - supervisor.PanicEscalate (the default): the flight recorder is
//     dumped and the process exits with supervisor.ExitEscalate (4), so
//     that rankrunner restarts the job;
//   - supervisor.PanicRestart: the actor is restarted, and a communicator
//     actor's panic makes every member re-create its group under the next
//     epoch, without restarting processes (see "Process groups and
//     restarts" in the package doc for what the program must do).
//
// PanicRestart needs RANKTREE_ASYNC_ERROR_HANDLING=CleanupOnly or unset
// (it then selects CleanupOnly); otherwise Init fails with an *OptionError.
func WithActorPanic(p supervisor.PanicPolicy) Option { return Option(bootstrap.WithActorPanic(p)) }

// WithExit replaces os.Exit for the rank's teardowns: an escalated actor
// panic (code supervisor.ExitEscalate), a watchdog TearDown
// (supervisor.ExitTearDown) and a stalled watchdog
// (supervisor.ExitHeartbeat). The rank calls f at most once, after its
// dump and an event flush. Tests pass a recorder; a program may pass a
// function that saves its own state and then calls os.Exit. If f returns,
// the process goes on with the failed group aborted.
func WithExit(f func(code int)) Option { return Option(bootstrap.WithExit(f)) }
