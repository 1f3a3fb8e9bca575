package cli

import (
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/ranktree/ranktree"
	"github.com/ranktree/ranktree/cmd/rankrunner/internal/eventview"
	"github.com/ranktree/ranktree/cmd/rankrunner/internal/natsauth"
)

func newEventsCmd(env Env, creds *natsauth.Credentials) *cobra.Command {
	var o eventview.Options
	cmd := &cobra.Command{
		Use:   "events [--job J] [--nats URL]",
		Short: "Live view of a running job's events (ranks × last seq/op/state, stragglers highlighted)",
		Long: `events subscribes to ranktree.<job>.events.> (every job's events without
--job, the group column then reading <job>/<group>) and shows, per rank and process
group, the last collective seq, op and state. Ranks behind their group's
highest seq are marked STRAGGLER; with --world-size, ranks that sent nothing
are marked MISSING. On a terminal the table is redrawn live; otherwise (or
with --lines) every event is printed as one line, and the final table is
printed at the end.`,
		Args:          noArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Job != "" && !validJob(o.Job) {
				return usagef("events: invalid --job %q", o.Job)
			}
			c := withEnvCreds(*creds, env.Getenv)
			if err := c.Validate(); err != nil {
				return usagef("events: %v", err)
			}
			o.Creds = c
			o.Out = env.Stdout
			o.Live = isTerminal(env.Stdout) && !o.Lines
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return eventview.Watch(ctx, o)
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	fs := cmd.Flags()
	fs.SetNormalizeFunc(normalizeFlag)
	fs.StringVar(&o.Job, "job", env.Getenv(ranktree.EnvJob), "job id (env RANKTREE_JOB; default: every job on the server)")
	fs.StringVar(&o.URL, "nats", defaultNATS(env), "NATS URL of the job (env RANKTREE_NATS_URL)")
	fs.IntVar(&o.WorldSize, "world-size", 0, "expected ranks; ranks that sent nothing are shown as missing")
	durationVar(fs, &o.Duration, "duration", 0, "stop after this long (default: until Ctrl-C)")
	durationVar(fs, &o.Refresh, "refresh", time.Second, "table redraw period on a terminal")
	fs.BoolVar(&o.Lines, "lines", false, "print one line per event instead of a live table")
	return cmd
}
