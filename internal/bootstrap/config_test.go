package bootstrap

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/internal/envcontract"
	"github.com/ranktree/ranktree/internal/metrics"
	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/supervisor"
)

// envFrom parses the env contract from kv alone (no process environment).
func envFrom(t *testing.T, kv map[string]string) envcontract.Contract {
	t.Helper()
	e, err := readEnv(func(k string) (string, bool) { v, ok := kv[k]; return v, ok })
	if err != nil {
		t.Fatalf("readEnv(%v): %v", kv, err)
	}
	return e
}

// TestReadEnvParsesEveryVariable: one read fills every field of the
// contract that the runtime passes down.
func TestReadEnvParsesEveryVariable(t *testing.T) {
	e := envFrom(t, map[string]string{
		envcontract.Rank: "3", envcontract.WorldSize: "8", envcontract.LocalRank: "1", envcontract.LocalWorldSize: "4", envcontract.NodeRank: "1",
		envcontract.RestartCount: "2", envcontract.NATSURL: "nats://h:4222", envcontract.Job: "j", envcontract.StoreTimeout: "90s",
		envcontract.StoreWait: "true", envcontract.NATSToken: "tok", envcontract.Backend: "cpu", envcontract.Transport: "tcp",
		envcontract.HostID: "hA", envcontract.ListenHost: "0.0.0.0", envcontract.Fault: "hang@rank=1,seq=5",
		supervisor.EnvTimeout: "30s", metrics.EnvAddr: "127.0.0.1:0", "RANKTREE_METRICS_ADDR_FILE": "/tmp/x",
	})
	if e.Rank != (envcontract.Int{Value: 3, Set: true}) || e.WorldSize.Value != 8 || e.LocalRank.Value != 1 || e.LocalWorldSize.Value != 4 ||
		e.NodeRank != (envcontract.Int{Value: 1, Set: true}) || e.RestartCount.Value != 2 {
		t.Errorf("identity = %+v", e)
	}
	if e.NATSURL != "nats://h:4222" || e.Job != "j" || e.StoreTimeout != 90*time.Second || !e.StoreWait || e.Creds.Token != "tok" {
		t.Errorf("store settings = %q %q %v %v %+v", e.NATSURL, e.Job, e.StoreTimeout, e.StoreWait, e.Creds)
	}
	if e.Backend != "cpu" || e.CPU.Transport != "tcp" || e.CPU.HostID != "hA" || e.CPU.ListenHost != "0.0.0.0" {
		t.Errorf("engine settings = %q %+v", e.Backend, e.CPU)
	}
	if len(e.Faults) != 1 || e.Faults[0].Kind != "hang" || e.Faults[0].Rank != 1 || e.Faults[0].Seq != 5 {
		t.Errorf("faults = %+v", e.Faults)
	}
	if e.Supervision.Timeout != 30*time.Second {
		t.Errorf("supervision timeout = %v", e.Supervision.Timeout)
	}
	if e.MetricsAddr != "127.0.0.1:0" || e.MetricsAddrFile != "/tmp/x" {
		t.Errorf("metrics = %q %q", e.MetricsAddr, e.MetricsAddrFile)
	}
	if unset := envFrom(t, nil); unset.Rank.Set || unset.NodeRank.Set || unset.Faults != nil {
		t.Errorf("empty environment parsed as %+v", unset)
	}
}

// TestReadEnvNamesMalformedVariable: a value that does not parse is an
// *EnvError naming its variable and value.
func TestReadEnvNamesMalformedVariable(t *testing.T) {
	for _, tc := range []struct{ v, val string }{
		{envcontract.Rank, "x"}, {envcontract.WorldSize, "1.5"}, {envcontract.LocalRank, "one"}, {envcontract.LocalWorldSize, "?"},
		{envcontract.NodeRank, "n0"}, {envcontract.RestartCount, "again"}, {envcontract.StoreTimeout, "-1s"}, {envcontract.StoreWait, "maybe"},
		{envcontract.Fault, "explode@rank=1"}, {supervisor.EnvTimeout, "soon"}, {supervisor.EnvActorPanic, "sometimes"},
	} {
		_, err := readEnv(func(k string) (string, bool) {
			if k == tc.v {
				return tc.val, true
			}
			return "", false
		})
		var ee *EnvError
		if !errors.As(err, &ee) || ee.Var != tc.v || ee.Value != tc.val || !errors.Is(err, ErrEnv) ||
			!strings.Contains(err.Error(), tc.v) {
			t.Errorf("%s=%q: %v, want an *EnvError naming it", tc.v, tc.val, err)
		}
	}
}

// TestConfigValidateNamesBadSetting: validate names the variable that
// holds an inconsistent value, or the option when an option set it.
func TestConfigValidateNamesBadSetting(t *testing.T) {
	good := map[string]string{envcontract.Rank: "1", envcontract.WorldSize: "4", envcontract.LocalRank: "1", envcontract.LocalWorldSize: "2",
		envcontract.NodeRank: "0", envcontract.NATSURL: "nats://h", envcontract.Job: "j"}
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for a, b := range good {
			m[a] = b
		}
		m[k] = v
		return m
	}
	cases := []struct {
		name string
		env  map[string]string
		opts []Option
		want string // the variable (EnvError) or the option (OptionError)
	}{
		{"world size 0", with(envcontract.WorldSize, "0"), nil, envcontract.WorldSize},
		{"rank ≥ world size", with(envcontract.Rank, "4"), nil, envcontract.Rank},
		{"rank < 0", with(envcontract.Rank, "-1"), nil, envcontract.Rank},
		{"local world size > world size", with(envcontract.LocalWorldSize, "5"), nil, envcontract.LocalWorldSize},
		{"local rank ≥ local world size", with(envcontract.LocalRank, "2"), nil, envcontract.LocalRank},
		{"node rank < 0", with(envcontract.NodeRank, "-1"), nil, envcontract.NodeRank},
		{"restart count < 0", with(envcontract.RestartCount, "-2"), nil, envcontract.RestartCount},
		{"backend", with(envcontract.Backend, "gloo"), nil, envcontract.Backend},
		{"missing GROUP_RANK", with(envcontract.NodeRank, ""), nil, envcontract.NodeRank},
		{"missing job", with(envcontract.Job, ""), nil, envcontract.Job},
		{"rank from option", good, []Option{WithRank(7)}, "WithRank(7)"},
		{"world size from option", good, []Option{WithWorldSize(1)}, envcontract.Rank}, // RANK=1 no longer fits
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &Config{timeout: store.DefaultTimeout}
			for _, o := range tc.opts {
				if err := o(c); err != nil {
					t.Fatal(err)
				}
			}
			err := c.merge(envFrom(t, tc.env))
			if err == nil {
				err = c.validate()
			}
			var ee *EnvError
			var oe *OptionError
			switch {
			case err == nil:
				t.Fatalf("no error, want one naming %s", tc.want)
			case errors.As(err, &ee):
				if ee.Var != tc.want || !errors.Is(err, ErrEnv) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("%v: names %s, want %s", err, ee.Var, tc.want)
				}
			case errors.As(err, &oe):
				if tc.opts == nil || !strings.Contains(oe.Option, tc.want) || !errors.Is(err, ErrInvalidOption) {
					t.Fatalf("%v: names %s, want %s", err, oe.Option, tc.want)
				}
			default:
				t.Fatalf("%v: untyped error", err)
			}
		})
	}
	// The good environment passes, and options win over variables.
	c := &Config{}
	if err := WithNodeRank(3)(c); err != nil {
		t.Fatal(err)
	}
	if err := c.merge(envFrom(t, good)); err != nil {
		t.Fatal(err)
	}
	if err := c.validate(); err != nil || c.rank != 1 || c.worldSize != 4 || c.nodeRank != 3 || c.job != "j" {
		t.Fatalf("good env: %v, %+v", err, c)
	}
}

// TestConfigureTimeoutDefault: validate fills the store timeout with
// store.DefaultTimeout when neither RANKTREE_STORE_TIMEOUT nor WithTimeout
// set it; the variable wins over the default and the option over both.
func TestConfigureTimeoutDefault(t *testing.T) {
	env := map[string]string{envcontract.Rank: "0", envcontract.WorldSize: "1", envcontract.LocalRank: "0",
		envcontract.LocalWorldSize: "1", envcontract.NodeRank: "0", envcontract.NATSURL: "nats://h", envcontract.Job: "j"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	for _, tc := range []struct {
		name string
		env  string
		opts []Option
		want time.Duration
	}{
		{"default", "", nil, store.DefaultTimeout},
		{"variable", "90s", nil, 90 * time.Second},
		{"option", "90s", []Option{WithTimeout(time.Second)}, time.Second},
	} {
		env[envcontract.StoreTimeout] = tc.env
		c, err := configure(lookup, tc.opts)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if c.timeout != tc.want {
			t.Errorf("%s: timeout %v, want %v", tc.name, c.timeout, tc.want)
		}
	}
}
