package cli

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/cmd/rankrunner/internal/natsauth"
)

func natsauthCreds(user string) natsauth.Credentials { return natsauth.Credentials{User: user} }

func TestParseNProc(t *testing.T) {
	two := func() (int, error) { return 2, nil }
	none := func() (int, error) { return 0, errors.New("no NVML") }
	cases := []struct {
		v    string
		gpus func() (int, error)
		want int
		err  bool
	}{
		{"", two, 2, false}, {"auto", none, 1, false}, {"auto", two, 2, false},
		{"gpu", two, 2, false}, {"gpu", none, 0, true}, {"cpu", none, 8, false},
		{"3", none, 3, false}, {"0", none, 0, true}, {"x", none, 0, true}, {"-2", none, 0, true},
	}
	for _, c := range cases {
		n, err := parseNProc(c.v, c.gpus, 8)
		if (err != nil) != c.err || n != c.want {
			t.Errorf("parseNProc(%q) = %d, %v; want %d (err %v)", c.v, n, err, c.want, c.err)
		}
	}
}

func TestSecondsFlag(t *testing.T) {
	var d time.Duration
	f := secondsFlag{&d}
	for in, want := range map[string]time.Duration{"5": 5 * time.Second, "0.1": 100 * time.Millisecond, "250ms": 250 * time.Millisecond, "10m": 10 * time.Minute} {
		if err := f.Set(in); err != nil || d != want {
			t.Errorf("Set(%q) = %v, %v; want %v", in, d, err, want)
		}
	}
	for _, bad := range []string{"soon", "-1", "-3s"} {
		if err := f.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
}

// TestMainUsageErrors runs Main in-process: usage errors exit 2 and name the flag.
func TestMainUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--nproc-per-node", "many", "prog"}, "--nproc-per-node"},
		{[]string{"--nproc_per_node", "many", "prog"}, "--nproc-per-node"}, // torchrun's underscore spelling
		{[]string{"--no-such-flag", "prog"}, "--no-such-flag"},
		{[]string{"--redirects", "0:x", "--log-dir", "/tmp", "prog"}, "--redirects"},
		{[]string{"--log-level", "loud", "prog"}, "--log-level"},
		{[]string{}, "PROGRAM"},
		{[]string{"diagnose"}, "--job"},
		{[]string{"events", "--job", "j", "extra"}, "extra"},
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		code := Main(context.Background(), Env{Args: c.args, Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }})
		if code != 2 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: code %d, stderr %q; want 2 naming %s", c.args, code, errb.String(), c.want)
		}
	}
}

// TestMainSlurmEnvBadValue: a malformed scheduler variable is a usage error naming it.
func TestMainSlurmEnvBadValue(t *testing.T) {
	env := map[string]string{"SLURM_PROCID": "zero", "SLURM_NTASKS": "2"}
	var out, errb bytes.Buffer
	code := Main(context.Background(), Env{Args: []string{"prog"}, Stdout: &out, Stderr: &errb, Getenv: func(k string) string { return env[k] }})
	if code != 2 || !strings.Contains(errb.String(), "SLURM_PROCID") {
		t.Fatalf("code %d, stderr %q", code, errb.String())
	}
}

// TestCredentialsFromEnvNotInHelp: RANKTREE_NATS_* fill unset credential
// flags, an explicit flag wins, and --help never prints the secret.
func TestCredentialsFromEnvNotInHelp(t *testing.T) {
	env := map[string]string{"RANKTREE_NATS_TOKEN": "SECRET-TOKEN", "RANKTREE_NATS_USER": "envuser"}
	getenv := func(k string) string { return env[k] }
	var out, errb bytes.Buffer
	if code := Main(context.Background(), Env{Args: []string{"--help"}, Stdout: &out, Stderr: &errb, Getenv: getenv}); code != 0 {
		t.Fatalf("--help exit %d", code)
	}
	if strings.Contains(out.String()+errb.String(), "SECRET") {
		t.Fatal("--help printed the token taken from the environment")
	}
	c := withEnvCreds(natsauthCreds("flaguser"), getenv)
	if c.Token != "SECRET-TOKEN" || c.User != "flaguser" {
		t.Fatalf("merged credentials %+v", c)
	}
}
