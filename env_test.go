package ranktree

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/supervisor"
)

// envFrom parses the env contract from kv alone (no process environment).
func envFrom(t *testing.T, kv map[string]string) envContract {
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
		EnvRank: "3", EnvWorldSize: "8", EnvLocalRank: "1", EnvLocalWorldSize: "4", EnvNodeRank: "1",
		EnvRestartCount: "2", EnvNATSURL: "nats://h:4222", EnvJob: "j", EnvStoreTimeout: "90s",
		EnvStoreWait: "true", EnvNATSToken: "tok", EnvBackend: "cpu", EnvTransport: "tcp",
		EnvHostID: "hA", EnvListenHost: "0.0.0.0", EnvFault: "hang@rank=1,seq=5",
		supervisor.EnvTimeout: "30s", EnvMetricsAddr: "127.0.0.1:0", "RANKTREE_METRICS_ADDR_FILE": "/tmp/x",
	})
	if e.Rank != (envInt{Value: 3, Set: true}) || e.WorldSize.Value != 8 || e.LocalRank.Value != 1 || e.LocalWorldSize.Value != 4 ||
		e.NodeRank != (envInt{Value: 1, Set: true}) || e.RestartCount.Value != 2 {
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
		{EnvRank, "x"}, {EnvWorldSize, "1.5"}, {EnvLocalRank, "one"}, {EnvLocalWorldSize, "?"},
		{EnvNodeRank, "n0"}, {EnvRestartCount, "again"}, {EnvStoreTimeout, "-1s"}, {EnvStoreWait, "maybe"},
		{EnvFault, "explode@rank=1"}, {supervisor.EnvTimeout, "soon"}, {supervisor.EnvActorPanic, "sometimes"},
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
	good := map[string]string{EnvRank: "1", EnvWorldSize: "4", EnvLocalRank: "1", EnvLocalWorldSize: "2",
		EnvNodeRank: "0", EnvNATSURL: "nats://h", EnvJob: "j"}
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
		{"world size 0", with(EnvWorldSize, "0"), nil, EnvWorldSize},
		{"rank ≥ world size", with(EnvRank, "4"), nil, EnvRank},
		{"rank < 0", with(EnvRank, "-1"), nil, EnvRank},
		{"local world size > world size", with(EnvLocalWorldSize, "5"), nil, EnvLocalWorldSize},
		{"local rank ≥ local world size", with(EnvLocalRank, "2"), nil, EnvLocalRank},
		{"node rank < 0", with(EnvNodeRank, "-1"), nil, EnvNodeRank},
		{"restart count < 0", with(EnvRestartCount, "-2"), nil, EnvRestartCount},
		{"backend", with(EnvBackend, "gloo"), nil, EnvBackend},
		{"missing GROUP_RANK", with(EnvNodeRank, ""), nil, EnvNodeRank},
		{"missing job", with(EnvJob, ""), nil, EnvJob},
		{"rank from option", good, []Option{WithRank(7)}, "WithRank(7)"},
		{"world size from option", good, []Option{WithWorldSize(1)}, EnvRank}, // RANK=1 no longer fits
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &config{timeout: store.DefaultTimeout}
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
	c := &config{}
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
