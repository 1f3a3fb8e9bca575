package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/ranktree/ranktree"
	"github.com/ranktree/ranktree/cmd/rankrunner/internal/diagnose"
	"github.com/ranktree/ranktree/cmd/rankrunner/internal/natsauth"
	"github.com/ranktree/ranktree/store/natsstore"
)

func newDiagnoseCmd(env Env, creds *natsauth.Credentials) *cobra.Command {
	var (
		job, url  string
		restart   int
		world     int
		quiet     time.Duration
		raw       string
		storeWait time.Duration
	)
	cmd := &cobra.Command{
		Use:   "diagnose --job J [--nats URL]",
		Short: "Fetch and merge the flight-recorder dumps of a job and print the stuck or missing ranks",
		Long: `diagnose reads the flight-recorder dumps ranks wrote to the job's store
(trace/<rank>, at job level and under the attempt's restart/<n>/ prefix),
lists them, names the ranks without a dump (--world-size), and merges them
to find the stuck collective. --raw DIR writes each dump to DIR/rank<N>.json.`,
		Args:          noArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if job == "" {
				return usagef("diagnose: --job is required")
			}
			if !validJob(job) {
				return usagef("diagnose: invalid --job %q", job)
			}
			c := withEnvCreds(*creds, env.Getenv)
			if err := c.Validate(); err != nil {
				return usagef("diagnose: %v", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), storeWait)
			defer cancel()
			st, err := natsstore.Connect(ctx, natsstore.Options{
				URL: url, Job: job, Credentials: natsstore.Credentials(c),
				Timeout: storeWait, Name: "rankrunner-diagnose/" + job,
			})
			if err != nil {
				return fmt.Errorf("diagnose: %w", err)
			}
			defer st.Close()
			if restart, err = currentAttempt(ctx, st, restart); err != nil {
				return err
			}
			prefixes := []string{"", "restart/" + strconv.Itoa(restart) + "/"}
			dumps, err := diagnose.Fetch(cmd.Context(), st, prefixes, quiet)
			if err != nil {
				return err
			}
			fmt.Fprintf(env.Stdout, "job %s, attempt %d\n", job, restart)
			diagnose.ListDumps(env.Stdout, dumps, world)
			if err := writeRawDumps(raw, dumps); err != nil {
				return err
			}
			if len(dumps) == 0 {
				return &exitError{code: 1, err: errors.New("diagnose: no flight-recorder dump found in the store")}
			}
			rep, err := diagnose.Merge(dumps, world)
			if err != nil {
				return &exitError{code: 1, err: err}
			}
			fmt.Fprintln(env.Stdout)
			fmt.Fprint(env.Stdout, rep.String())
			return nil
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	fs := cmd.Flags()
	fs.SetNormalizeFunc(normalizeFlag)
	fs.StringVar(&job, "job", env.Getenv(ranktree.EnvJob), "job id (required; env RANKTREE_JOB)")
	fs.StringVar(&url, "nats", defaultNATS(env), "NATS URL of the job (env RANKTREE_NATS_URL)")
	fs.IntVar(&restart, "restart", -1, "attempt whose dumps to read (default: the job's current attempt)")
	fs.IntVar(&world, "world-size", 0, "expected ranks; ranks without a dump are reported missing")
	fs.StringVar(&raw, "raw", "", "also write each dump to DIR/rank<N>.json")
	durationVar(fs, &quiet, "quiet", 500*time.Millisecond, "stop collecting dumps after no new one arrived for this long")
	durationVar(fs, &storeWait, "store-timeout", 30*time.Second, "bound on reaching the store")
	return cmd
}

// currentAttempt is restart, or the job's current attempt (its restart
// count in the store) when restart is negative.
func currentAttempt(ctx context.Context, st *natsstore.Store, restart int) (int, error) {
	if restart >= 0 {
		return restart, nil
	}
	n, err := st.Add(ctx, "restarts", 0)
	if err != nil {
		return 0, fmt.Errorf("diagnose: read the job's restart count: %w", err)
	}
	return int(n), nil
}

// writeRawDumps writes each dump to dir/rank<N>.json (nothing when dir is
// empty).
func writeRawDumps(dir string, dumps []diagnose.StoredDump) error {
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, d := range dumps {
		if err := os.WriteFile(fmt.Sprintf("%s/rank%d.json", dir, d.Rank), d.Raw, 0o644); err != nil {
			return err
		}
	}
	return nil
}
