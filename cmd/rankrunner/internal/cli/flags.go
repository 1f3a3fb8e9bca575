package cli

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/ranktree/ranktree"
	"github.com/ranktree/ranktree/cmd/rankrunner/internal/natsauth"
)

// secondsFlag is a duration flag that also takes a plain number of seconds,
// as torchrun's --monitor-interval ("5" or "0.1") does.
type secondsFlag struct{ d *time.Duration }

func (f secondsFlag) String() string {
	if f.d == nil {
		return "0s"
	}
	return f.d.String()
}

func (f secondsFlag) Set(s string) error {
	if v, err := strconv.ParseFloat(s, 64); err == nil {
		if v < 0 {
			return fmt.Errorf("%q is negative", s)
		}
		*f.d = time.Duration(v * float64(time.Second))
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is neither seconds nor a Go duration such as 500ms or 10m", s)
	}
	if d < 0 {
		return fmt.Errorf("%q is negative", s)
	}
	*f.d = d
	return nil
}

func (f secondsFlag) Type() string { return "duration" }

func durationVar(fs *pflag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	fs.Var(secondsFlag{p}, name, usage)
}

// normalizeFlag accepts torchrun's underscore spellings (--nproc_per_node).
func normalizeFlag(_ *pflag.FlagSet, name string) pflag.NormalizedName {
	return pflag.NormalizedName(strings.ReplaceAll(name, "_", "-"))
}

// addCredFlags registers the NATS credential flags. Their values are not
// defaulted from the environment here (help output would print secrets);
// withEnvCreds fills the unset ones later.
func addCredFlags(fs *pflag.FlagSet, c *natsauth.Credentials) {
	fs.StringVar(&c.Token, "nats-token", "", "NATS token (env RANKTREE_NATS_TOKEN)")
	fs.StringVar(&c.User, "nats-user", "", "NATS user (env RANKTREE_NATS_USER)")
	fs.StringVar(&c.Password, "nats-password", "", "NATS password (env RANKTREE_NATS_PASSWORD)")
	fs.StringVar(&c.NKeyFile, "nats-nkey", "", "NKey seed file (env RANKTREE_NATS_NKEY)")
	fs.StringVar(&c.CredsFile, "nats-creds", "", "NATS .creds file (env RANKTREE_NATS_CREDS)")
	fs.StringVar(&c.TLSCA, "nats-tls-ca", "", "PEM CA bundle for the NATS server (env RANKTREE_NATS_TLS_CA)")
	fs.StringVar(&c.TLSCert, "nats-tls-cert", "", "client certificate (env RANKTREE_NATS_TLS_CERT)")
	fs.StringVar(&c.TLSKey, "nats-tls-key", "", "client key (env RANKTREE_NATS_TLS_KEY)")
}

// withEnvCreds returns c with every empty field taken from the
// RANKTREE_NATS_* variables read through getenv.
func withEnvCreds(c natsauth.Credentials, getenv func(string) string) natsauth.Credentials {
	e := natsauth.FromEnv(getenv)
	for _, f := range []struct {
		dst *string
		src string
	}{
		{&c.Token, e.Token}, {&c.User, e.User}, {&c.Password, e.Password}, {&c.NKeyFile, e.NKeyFile},
		{&c.CredsFile, e.CredsFile}, {&c.TLSCA, e.TLSCA}, {&c.TLSCert, e.TLSCert}, {&c.TLSKey, e.TLSKey},
	} {
		if *f.dst == "" {
			*f.dst = f.src
		}
	}
	return c
}

// parseNProc resolves --nproc-per-node as torchrun does: an integer, "gpu"
// (the NVML GPU count; an error without GPUs), "cpu" (the CPU count) or
// "auto"/"" (GPUs when NVML finds any, else 1).
func parseNProc(v string, gpus func() (int, error), cpus int) (int, error) {
	switch v {
	case "", "auto":
		if n, err := gpus(); err == nil && n > 0 {
			return n, nil
		}
		return 1, nil
	case "gpu":
		n, err := gpus()
		if err != nil {
			return 0, fmt.Errorf("\"gpu\": %v", err)
		}
		if n == 0 {
			return 0, fmt.Errorf("\"gpu\": NVML reports no GPU")
		}
		return n, nil
	case "cpu":
		return cpus, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a positive integer, gpu, cpu or auto", v)
	}
	return n, nil
}

// defaultNATS is the --nats default of the observing subcommands: the
// job's RANKTREE_NATS_URL when run inside a rank's environment, else a
// local server on NATS's standard port.
func defaultNATS(env Env) string {
	if u := env.Getenv(ranktree.EnvNATSURL); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

var jobRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// validJob reports whether job is a legal job id (a NATS subject token).
func validJob(job string) bool { return jobRe.MatchString(job) }
