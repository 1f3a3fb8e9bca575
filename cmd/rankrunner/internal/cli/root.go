// Package cli is rankrunner's command line (cobra): the launcher command
// and the `events` and `diagnose` subcommands. Flags follow torchrun's
// spelling (underscores are accepted as dashes).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/ranktree/ranktree/cmd/rankrunner/internal/launcher"
)

// Env is what Main needs from the process, injectable for tests.
type Env struct {
	Args           []string // command-line arguments without the program name
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	// LimitProcs makes the runner set its own GOMAXPROCS to one local
	// rank's share (launcher.LimitRunnerProcs) before it starts the
	// job. The command sets it; tests, which run Main in their own
	// process, leave it false.
	LimitProcs bool
}

// Main runs rankrunner and returns its exit code: the job's (the failing
// rank's exit code), 2 for usage errors, 1 for other errors.
func Main(ctx context.Context, env Env) int {
	if env.Getenv == nil {
		env.Getenv = os.Getenv
	}
	root := newRoot(env)
	root.SetArgs(env.Args)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(env.Stderr, "rankrunner: %v\n", ee.err)
		}
		return ee.code
	}
	var ue *usageError
	var fe *launcher.FlagError
	if errors.As(err, &ue) || errors.As(err, &fe) {
		fmt.Fprintf(env.Stderr, "rankrunner: %v\nRun 'rankrunner --help' for usage.\n", err)
		return 2
	}
	fmt.Fprintf(env.Stderr, "rankrunner: %v\n", err)
	return 1
}

// syncWriter serialises writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	if s, ok := w.(*syncWriter); ok {
		w = s.w
	}
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

// newLogger is the runner's zerolog logger: human-readable lines on stderr,
// coloured on a terminal.
func newLogger(w io.Writer, level string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		return zerolog.Nop(), usagef("invalid --log-level: %q", level)
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano // millisecond timestamps in runner logs
	cw := zerolog.ConsoleWriter{Out: w, NoColor: !isTerminal(w), TimeFormat: "15:04:05.000"}
	return zerolog.New(cw).Level(lvl).With().Timestamp().Str("component", "rankrunner").Logger(), nil
}

type launchFlags struct {
	cfg        launcher.Config
	standalone bool
	nproc      string
	logLevel   string
	tee        string
	redirect   string
}

func newRoot(env Env) *cobra.Command {
	var f launchFlags
	root := &cobra.Command{
		Use:   "rankrunner [flags] PROGRAM [ARGS...]",
		Short: "Launch and supervise a ranktree job (torchrun for Go)",
		Long: `rankrunner starts --nproc-per-node ranks of PROGRAM on this node, sets the env
contract (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
RANKTREE_NATS_URL, RANKTREE_JOB, RANKTREE_RESTART_COUNT, credentials) and
supervises them: when a rank fails the other ranks get --failure-grace to
report their own errors, then every rank of the job is stopped, a summary
lists the failed ranks (root cause first), and the job restarts while the
job-wide --max-restarts budget lasts.

PROGRAM is a Go package (built once with go build) or an executable; the
arguments after it are passed unchanged. Slurm (SLURM_PROCID, SLURM_NTASKS,
SLURM_LOCALID, SLURM_NODEID) and Kubernetes indexed Jobs
(JOB_COMPLETION_INDEX) fill --node-rank/--nnodes when not given.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("missing PROGRAM: give a Go package or an executable to run")
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runLaunch(cmd, env, &f, args)
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	fs := root.Flags()
	fs.SetInterspersed(false) // everything after PROGRAM belongs to PROGRAM
	fs.SetNormalizeFunc(normalizeFlag)
	fs.StringVar(&f.nproc, "nproc-per-node", "auto", "ranks on this node: N, gpu, cpu or auto (GPUs from NVML, else 1)")
	fs.BoolVar(&f.standalone, "standalone", false, "single-node job with its own embedded NATS server (torchrun's --standalone; the default for one node)")
	fs.IntVar(&f.cfg.NNodes, "nnodes", 1, "number of nodes (runners) in the job")
	fs.IntVar(&f.cfg.NodeRank, "node-rank", 0, "this node's rank, 0..nnodes-1 (GROUP_RANK)")
	fs.StringVar(&f.cfg.NATSURL, "nats", "", "NATS URL of the job's control plane (default: an embedded server on node 0)")
	fs.StringVar(&f.cfg.NATSListen, "nats-listen", "", "host:port where node 0 serves the embedded NATS server (default 127.0.0.1:random for one node, 0.0.0.0:4222 for several); with --nats too, node 0 serves here and every rank uses --nats")
	fs.StringVar(&f.cfg.StoreDir, "nats-store-dir", "", "JetStream directory of the embedded server (default: a temporary directory)")
	fs.StringVar(&f.cfg.JobID, "job-id", "", "job id: KV bucket and event subjects (default: random; required with --nnodes > 1)")
	fs.IntVar(&f.cfg.MaxRestarts, "max-restarts", 0, "job-wide restart budget, kept in the store")
	durationVar(fs, &f.cfg.MonitorInterval, "monitor-interval", 100*time.Millisecond, "supervision tick (seconds or a Go duration)")
	durationVar(fs, &f.cfg.FailureGrace, "failure-grace", 3*time.Second, "after a rank fails, how long the other ranks may run on to report their errors and exit before SIGTERM (0: at once)")
	durationVar(fs, &f.cfg.StopGrace, "stop-grace", 3*time.Second, "time between SIGTERM and SIGKILL when stopping ranks")
	durationVar(fs, &f.cfg.RunnerHeartbeat, "runner-heartbeat", 5*time.Second, "with several nodes: how often each runner writes its heartbeat to the store")
	durationVar(fs, &f.cfg.RunnerTimeout, "runner-timeout", 30*time.Second, "with several nodes: abort the attempt when another runner's heartbeat is silent this long")
	durationVar(fs, &f.cfg.Timeout, "timeout", 0, "collective default timeout given to ranks as RANKTREE_TIMEOUT (e.g. 10m)")
	durationVar(fs, &f.cfg.StoreTimeout, "store-timeout", 60*time.Second, "bound on reaching the store")
	fs.StringVar(&f.cfg.CPUBind, "cpu-bind", launcher.CPUBindCore, "bind local ranks to CPUs: core (each rank its own block of the runner's CPUs; nothing when ranks outnumber CPUs) or none")
	fs.StringVar(&f.cfg.MetricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics: the runner's and, relayed, its ranks' (e.g. :9400; env RANKTREE_RUNNER_METRICS_ADDR)")
	fs.BoolVar(&f.cfg.StoreWait, "store-wait", false, "keep retrying a store URL that refuses connections for the whole --store-timeout (default: give up after a few seconds of refused connections; env RANKTREE_STORE_WAIT)")
	fs.StringVar(&f.cfg.LogDir, "log-dir", "", "write per-rank logs to DIR/<job>/attempt_<n>/<rank>/{stdout,stderr}.log")
	fs.StringVarP(&f.tee, "tee", "t", "", "copy streams to log files too: 0 none, 1 stdout, 2 stderr, 3 both, or local_rank:N,...")
	fs.StringVarP(&f.redirect, "redirects", "r", "", "send streams to log files only: 0 none, 1 stdout, 2 stderr, 3 both, or local_rank:N,...")
	fs.StringVar(&f.logLevel, "log-level", "info", "runner log level: debug, info, warn, error")
	addCredFlags(root.PersistentFlags(), &f.cfg.Creds)
	root.CompletionOptions.DisableDefaultCmd = true // "completion" must stay a runnable PROGRAM name
	root.PersistentFlags().SetNormalizeFunc(normalizeFlag)
	root.AddCommand(newEventsCmd(env, &f.cfg.Creds), newDiagnoseCmd(env, &f.cfg.Creds))
	return root
}

func runLaunch(cmd *cobra.Command, env Env, f *launchFlags, args []string) error {
	fs := cmd.Flags()
	cfg := f.cfg
	cfg.Creds = withEnvCreds(cfg.Creds, env.Getenv)
	if cfg.MetricsAddr == "" {
		cfg.MetricsAddr = env.Getenv("RANKTREE_RUNNER_METRICS_ADDR")
	}
	if !fs.Changed("store-wait") {
		if v := env.Getenv(launcher.EnvStoreWait); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return usagef("%s=%q is not a boolean (1, true, 0, false)", launcher.EnvStoreWait, v)
			}
			cfg.StoreWait = b
		}
	}
	// Runner logs and ranks' stderr lines share stderr: one lock keeps
	// every line whole.
	stderr := &syncWriter{w: env.Stderr}
	log, err := newLogger(stderr, f.logLevel)
	if err != nil {
		return err
	}
	if f.standalone && (cfg.NNodes != 1 || cfg.NATSURL != "") {
		return usagef("--standalone runs one node with an embedded NATS server: drop --nnodes %d / --nats", cfg.NNodes)
	}
	var cl launcher.Cluster // --standalone ignores scheduler variables
	if !f.standalone {
		if cl, err = launcher.DetectCluster(env.Getenv); err != nil {
			return usagef("%v", err)
		}
	}
	if cl.Kind != "" {
		if !fs.Changed("node-rank") && cl.NodeRank >= 0 {
			cfg.NodeRank = cl.NodeRank
		}
		if !fs.Changed("nnodes") && cl.NNodes > 0 {
			cfg.NNodes = cl.NNodes
		}
		if cl.Task != nil && !fs.Changed("nproc-per-node") && !fs.Changed("node-rank") {
			cfg.Task = cl.Task
		}
		if !fs.Changed("job-id") && cl.JobID != "" {
			cfg.JobID = cl.JobID
		}
		log.Info().Str("scheduler", cl.Kind).Int("node_rank", cfg.NodeRank).Int("nnodes", cfg.NNodes).Bool("task_per_rank", cfg.Task != nil).Msg("scheduler environment detected")
	}
	if cfg.Task == nil {
		n, err := parseNProc(f.nproc, launcher.GPUCount, runtime.NumCPU())
		if err != nil {
			return usagef("invalid argument %s for \"--nproc-per-node\" flag: %v", f.nproc, err)
		}
		cfg.NProcPerNode = n
	}
	if cfg.Tee, err = launcher.ParseStdSpec(f.tee); err != nil {
		return usagef("invalid argument for \"--tee\" flag: %v", err)
	}
	if cfg.Redirects, err = launcher.ParseStdSpec(f.redirect); err != nil {
		return usagef("invalid argument for \"--redirects\" flag: %v", err)
	}
	if cfg.FailureGrace == 0 { // --failure-grace 0; the Config's zero value means the default
		cfg.FailureGrace = launcher.NoFailureGrace
	}
	cfg.Program, cfg.Args = args[0], args[1:]
	cfg.Stdout, cfg.Stderr = env.Stdout, stderr
	cfg.Color, cfg.Log = isTerminal(env.Stdout), log
	limitProcs(env, &cfg, log)
	code, err := launcher.Run(cmd.Context(), cfg)
	var fe *launcher.FlagError
	if errors.As(err, &fe) {
		return err
	}
	if err != nil && code == 0 {
		code = 1
	}
	if code != 0 {
		return &exitError{code: code, err: err}
	}
	return nil
}

// limitProcs gives the runner one local rank's share of the CPUs as its
// GOMAXPROCS (launcher.LimitRunnerProcs) and logs it, if env.LimitProcs.
func limitProcs(env Env, cfg *launcher.Config, log zerolog.Logger) {
	if !env.LimitProcs {
		return
	}
	localWorld := cfg.NProcPerNode
	if cfg.Task != nil {
		localWorld = cfg.Task.LocalWorldSize
	}
	log.Debug().Int("gomaxprocs", launcher.LimitRunnerProcs(localWorld, env.Getenv)).Msg("runner's own GOMAXPROCS")
}
