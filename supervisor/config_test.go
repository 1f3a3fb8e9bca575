package supervisor

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/actors"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestConfigFromEnvDefaults(t *testing.T) {
	c, err := ConfigFromEnv(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{ErrorHandling: TearDown, Timeout: 10 * time.Minute, HeartbeatTimeout: 8 * time.Minute,
		TraceBufferSize: 2000, Events: actors.EventsAll, WatchdogInterval: DefaultWatchdogInterval}
	if c != want {
		t.Errorf("defaults = %+v, want %+v", c, want)
	}
}

func TestConfigFromEnvValues(t *testing.T) {
	c, err := ConfigFromEnv(env(map[string]string{
		EnvAsyncErrorHandling:      "CleanupOnly",
		EnvTorchAsyncErrorHandling: "3", // ignored: the RANKTREE_ variable wins
		EnvBlockingWait:            "1",
		EnvTimeout:                 "2s",
		EnvHeartbeatTimeout:        "90",
		EnvTraceBufferSize:         "16",
		EnvTraceDir:                "/tmp/tr",
		EnvEvents:                  "errors",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{ErrorHandling: CleanupOnly, BlockingWait: true, Timeout: 2 * time.Second,
		HeartbeatTimeout: 90 * time.Second, TraceBufferSize: 16, TraceDir: "/tmp/tr",
		Events: actors.EventsErrors, WatchdogInterval: DefaultWatchdogInterval}
	if c != want {
		t.Errorf("got %+v, want %+v", c, want)
	}
	c, err = ConfigFromEnv(env(map[string]string{EnvTorchAsyncErrorHandling: "0", EnvTraceBufferSize: "0", EnvEvents: "off"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.ErrorHandling != NoHandling || c.TraceBufferSize != TraceDisabled || c.Events != actors.EventsOff {
		t.Errorf("torch alias / trace off / events off: %+v", c)
	}
}

func TestParseErrorHandling(t *testing.T) {
	for in, want := range map[string]ErrorHandling{
		"0": NoHandling, "1": TearDown, "2": CleanupOnly, "3": SkipCleanup,
		"teardown": TearDown, "TEAR_DOWN": TearDown, "CleanUpOnly": CleanupOnly, "cleanup_only": CleanupOnly,
		"skip_cleanup": SkipCleanup, "NoHandling": NoHandling,
	} {
		got, err := ParseErrorHandling(in)
		if err != nil || got != want {
			t.Errorf("ParseErrorHandling(%q) = %v, %v; want %v", in, got, err, want)
		}
		if got.TorchValue() < 0 || got.TorchValue() > 3 {
			t.Errorf("%v.TorchValue() = %d", got, got.TorchValue())
		}
	}
	for _, m := range []ErrorHandling{NoHandling, TearDown, CleanupOnly, SkipCleanup} {
		back, err := ParseErrorHandling(m.String())
		if err != nil || back != m {
			t.Errorf("round trip of %v: %v, %v", m, back, err)
		}
	}
}

func TestConfigFromEnvRejectsInvalid(t *testing.T) {
	cases := []struct{ name, value string }{
		{EnvAsyncErrorHandling, "abc"},
		{EnvAsyncErrorHandling, "-1"},
		{EnvAsyncErrorHandling, "4"},
		{EnvTorchAsyncErrorHandling, "7"},
		{EnvBlockingWait, "abc"},
		{EnvBlockingWait, "-1"},
		{EnvTimeout, "abc"},
		{EnvTimeout, "-1"},
		{EnvTimeout, "0"},
		{EnvTimeout, "-5s"},
		{EnvTimeout, "1e30"},
		{EnvTimeout, "NaN"},
		{EnvTimeout, "9999h"},
		{EnvHeartbeatTimeout, "abc"},
		{EnvHeartbeatTimeout, "-1"},
		{EnvTraceBufferSize, "abc"},
		{EnvTraceBufferSize, "-1"},
		{EnvTraceBufferSize, "99999999"},
		{EnvEvents, "abc"},
		{EnvEvents, "-1"},
	}
	for _, c := range cases {
		_, err := ConfigFromEnv(env(map[string]string{c.name: c.value}))
		if err == nil {
			t.Errorf("%s=%q accepted", c.name, c.value)
			continue
		}
		var ce *ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, ErrInvalidConfig) || ce.Var != c.name {
			t.Errorf("%s=%q: error %v does not name the variable as a *ConfigError", c.name, c.value, err)
		}
		if !strings.Contains(err.Error(), c.name) || !strings.Contains(err.Error(), c.value) {
			t.Errorf("%s=%q: message %q lacks the variable or value", c.name, c.value, err)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, bad := range []Config{
		{Timeout: -time.Second},
		{HeartbeatTimeout: MaxDuration + 1},
		{TraceBufferSize: -2},
		{TraceBufferSize: MaxTraceBufferSize + 1},
		{ErrorHandling: NoHandling + 1},
		{Events: actors.EventsOff + 1},
		{WatchdogInterval: -1},
	} {
		if _, err := bad.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalidConfig", bad, err)
		}
	}
	c, err := Config{Timeout: time.Second, TraceBufferSize: TraceDisabled}.Validate()
	if err != nil || c.Timeout != time.Second || c.TraceBufferSize != TraceDisabled || c.ErrorHandling != TearDown {
		t.Errorf("Validate kept/filled wrongly: %+v, %v", c, err)
	}
}
