// Package launcher is rankrunner's launcher: it starts a job's ranks on one
// node with the env contract, supervises them and restarts the whole job
// within a job-wide budget (torchrun's LocalElasticAgent, with the NATS
// store in place of the c10d rendezvous).
//
// Run is the entry point. Its duties, in order:
//
//  1. Validate the Config (errors are *FlagError naming the flag).
//  2. Resolve PROGRAM: a Go package is built once with go build; an
//     executable runs as is.
//  3. Serve an embedded NATS server (JetStream) when no --nats URL is given
//     (node 0, or the task of rank 0 under Slurm), and connect the job's
//     store (natsstore), retrying until the store timeout.
//  4. Fix the job-wide restart budget: the first runner's --max-restarts is
//     stored under "max_restarts"; the attempt counter is "restarts".
//  5. Run attempts. Attempt n keeps its state under "restart/<n>/": each
//     runner watches the attempt's "abort/runner-" and "done/" keys (a push,
//     replayed from the start), starts
//     its ranks (own process group, Pdeathsig SIGKILL, stdout/stderr
//     line-prefixed "[rank N]") and drives a Policy (policy.go, a pure state
//     machine) with rank exits, abort keys, signals and ticks; see below.
//  6. After a failed attempt n, while n < budget, move "restarts" from n to
//     n+1 with CompareAndSet (exactly once per attempt, whichever runner
//     wins) and run attempt n+1 with RANKTREE_RESTART_COUNT=n+1.
//
// The Policy's rules: a rank exiting non-zero makes the runner write
// "restart/<n>/abort/runner-<id>" ({"runner","rank","reason","exit_code",
// "error"}) and "restart/<n>/dead/<rank>" (ranktree.DeadRank, which
// ranktree.Init watches so that ranks still in Init fail at once), wait
// the failure grace period (--failure-grace; ranks that exit meanwhile are
// not signalled), then SIGTERM every local rank still running and SIGKILL
// them after the stop grace period; another runner's abort key stops the
// local ranks the same way; SIGINT, SIGTERM,
// SIGHUP or SIGQUIT is forwarded to the ranks with a final abort (never
// restarted); when every local rank exited 0 the runner writes
// "restart/<n>/done/<id>" and waits until every runner's done key exists
// (the exit barrier) or an abort arrives.
//
// A failed attempt ends with a root-cause summary on stderr (summary.go):
// one line per failed rank, the first to fail first, with its exit code or
// signal and the error it reported (its RANKTREE_ERROR_FILE, else its
// stderr tail; rankerror.go).
//
// The exit code is 0 on success, the failing rank's exit code (128+signal
// for a signal death), or 128+signal when the runner was signalled.
//
// With several runners, each writes its job-level heartbeat key
// "alive/<id>" every --runner-heartbeat (5s), and each attempt watches the
// others' keys: a runner silent for --runner-timeout (30s) is lost, and the
// watcher aborts the attempt (restartable, exit code 1) and does not wait
// for the lost runner's confirmation at the end (keepalive.go). So a host
// that vanishes without its runner writing an abort key, or a runner that
// hangs, stops the job within the timeout instead of the collectives'
// timeout, and a runner at the exit barrier does not wait for ever.
package launcher
