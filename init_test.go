package ranktree

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/store/natsstore"
)

var allVars = []string{EnvRank, EnvWorldSize, EnvLocalRank, EnvLocalWorldSize, EnvNodeRank, EnvNATSURL, EnvJob, EnvRestartCount, EnvTimeout, EnvStoreTimeout,
	EnvNATSToken, EnvNATSUser, EnvNATSPassword, EnvNATSNKey, EnvNATSCreds, EnvNATSTLSCA, EnvNATSTLSCert, EnvNATSTLSKey}

// setEnv clears the whole contract, then sets kv.
func setEnv(t *testing.T, kv map[string]string) {
	for _, v := range allVars {
		t.Setenv(v, "")
	}
	for k, v := range kv {
		t.Setenv(k, v)
	}
}

func goodEnv() map[string]string {
	return map[string]string{EnvRank: "0", EnvWorldSize: "1", EnvLocalRank: "0", EnvLocalWorldSize: "1", EnvNodeRank: "0",
		EnvNATSURL: "nats://127.0.0.1:1", EnvJob: "j"}
}

func quiet() Option { return WithLogger(zerolog.Nop()) }

func TestInitMissingVariable(t *testing.T) {
	for _, v := range []string{EnvRank, EnvWorldSize, EnvLocalRank, EnvLocalWorldSize, EnvNodeRank, EnvNATSURL, EnvJob} {
		t.Run(v, func(t *testing.T) {
			env := goodEnv()
			delete(env, v)
			setEnv(t, env)
			_, err := Init(context.Background(), quiet())
			var ee *EnvError
			if !errors.As(err, &ee) || !errors.Is(err, ErrEnv) || ee.Var != v {
				t.Fatalf("Init without %s: %v, want *EnvError for it", v, err)
			}
			if !strings.Contains(err.Error(), v+" expected") {
				t.Fatalf("message %q lacks c10d's %q", err, v+" expected")
			}
		})
	}
}

func TestInitOptionOverridesMissingVariable(t *testing.T) {
	env := goodEnv()
	delete(env, EnvRank)
	delete(env, EnvNATSURL)
	delete(env, EnvJob)
	setEnv(t, env)
	rt, err := Init(context.Background(), quiet(), WithRank(0), WithStore(store.NewMemStore()))
	if err != nil {
		t.Fatalf("Init with WithRank for a missing RANK: %v", err)
	}
	defer rt.Close(context.Background())
	if rt.Rank() != 0 || rt.Job() != "local" || rt.NATS() != nil {
		t.Fatalf("rank/job/nats = %d/%q/%v", rt.Rank(), rt.Job(), rt.NATS())
	}
	// An option also wins over a present variable.
	setEnv(t, map[string]string{EnvRank: "7", EnvWorldSize: "1", EnvLocalRank: "0", EnvLocalWorldSize: "1", EnvNodeRank: "0"})
	rt2, err := Init(context.Background(), quiet(), WithRank(0), WithStore(store.NewMemStore()))
	if err != nil || rt2.Rank() != 0 {
		t.Fatalf("WithRank(0) over RANK=7: %v", err)
	}
	rt2.Close(context.Background())
}

func TestInitBadValues(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		opts []Option
		want string
	}{
		{"WithRank", nil, []Option{WithRank(-1)}, "WithRank(-1)"},
		{"WithWorldSize", nil, []Option{WithWorldSize(0)}, "WithWorldSize(0)"},
		{"WithTimeout", nil, []Option{WithTimeout(-time.Second)}, "WithTimeout"},
		{"WithStore", nil, []Option{WithStore(nil)}, "WithStore"},
		{"WithJob", nil, []Option{WithJob("")}, "WithJob"},
		{"RANK not int", map[string]string{EnvRank: "abc"}, nil, "not an integer"},
		{"RANK too big", map[string]string{EnvRank: "1"}, nil, "RANK=\"1\""},
		{"STORE_TIMEOUT", map[string]string{EnvStoreTimeout: "soon"}, nil, EnvStoreTimeout}, {"TIMEOUT", map[string]string{EnvTimeout: "soon"}, nil, EnvTimeout},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := goodEnv()
			for k, v := range c.env {
				env[k] = v
			}
			setEnv(t, env)
			_, err := Init(context.Background(), append([]Option{quiet()}, c.opts...)...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want mention of %q", err, c.want)
			}
			if c.opts != nil && !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("option error %v does not wrap ErrInvalidOption", err)
			}
			if c.opts == nil && !errors.Is(err, ErrEnv) {
				t.Fatalf("env error %v does not wrap ErrEnv", err)
			}
		})
	}
}

// initWorld runs Init for n ranks concurrently with extra options per rank.
func initWorld(t *testing.T, n int, opts func(rank int) []Option) ([]*Runtime, []error) {
	rts, errs := make([]*Runtime, n), make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := append([]Option{quiet(), WithRank(r), WithWorldSize(n), WithLocalRank(r), WithLocalWorldSize(n), WithNodeRank(0)}, opts(r)...)
			rts[r], errs[r] = Init(context.Background(), o...)
		}()
	}
	wg.Wait()
	return rts, errs
}

func TestInitMemStoreWorld(t *testing.T) {
	setEnv(t, nil)
	ms := store.NewMemStore()
	rts, errs := initWorld(t, 3, func(int) []Option { return []Option{WithStore(ms), WithRestartCount(2), WithJob("demo")} })
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	ctx := context.Background()
	if err := rts[1].Store().Set(ctx, "abort/pg0.0", []byte(`{"rank":1,"reason":"test"}`)); err != nil {
		t.Fatal(err)
	}
	if v, err := ms.Get(ctx, "restart/2/abort/pg0.0"); err != nil || !strings.Contains(string(v), `"rank":1`) {
		t.Fatalf("per-restart prefix: %q, %v", v, err)
	}
	if rts[2].JobStore() != store.Store(ms) || rts[2].RestartCount() != 2 || rts[2].Job() != "demo" || rts[2].LocalWorldSize() != 3 {
		t.Fatal("accessors disagree with the options")
	}
	for _, rt := range rts {
		if err := rt.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if err := rt.Close(ctx); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if err := rt.Store().Set(ctx, "x", nil); !errors.Is(err, store.ErrClosed) {
			t.Fatalf("store view open after Close: %v", err)
		}
	}
	if err := ms.Set(ctx, "still", nil); err != nil {
		t.Fatalf("Close closed a store passed with WithStore: %v", err)
	}
}

func TestInitBarrierNamesMissingRank(t *testing.T) {
	setEnv(t, nil)
	ms := store.NewMemStore()
	start := time.Now()
	_, err := Init(context.Background(), quiet(), WithStore(ms), WithRank(0), WithWorldSize(2), WithLocalRank(0), WithLocalWorldSize(1), WithNodeRank(0), WithTimeout(time.Second))
	var be *store.BarrierError
	if !errors.As(err, &be) || len(be.Missing) != 1 || be.Missing[0] != 1 {
		t.Fatalf("Init with rank 1 absent: %v", err)
	}
	if el := time.Since(start); el < time.Second || el > 10*time.Second {
		t.Fatalf("barrier took %v with a 1 s timeout", el)
	}
}

func TestInitNATS(t *testing.T) {
	url, stop, err := natsstore.StartEmbedded(natsstore.EmbeddedOptions{Token: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	setEnv(t, map[string]string{EnvNATSURL: url, EnvJob: "nats-init", EnvRestartCount: "1", EnvNATSToken: "tok", EnvStoreTimeout: "30s"})
	rts, errs := initWorld(t, 2, func(int) []Option { return nil })
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	ctx := context.Background()
	if rts[0].NATS() == nil || !rts[0].NATS().IsConnected() || rts[0].Timeout() != 30*time.Second {
		t.Fatal("NATS connection or timeout not from the environment")
	}
	if err := rts[0].Store().Set(ctx, "hello", []byte("from 0")); err != nil {
		t.Fatal(err)
	}
	v, err := rts[1].JobStore().Get(ctx, "restart/1/hello")
	if err != nil || string(v) != "from 0" {
		t.Fatalf("rank 1 reads %q, %v", v, err)
	}
	nc := rts[0].NATS()
	for _, rt := range rts {
		if err := rt.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !nc.IsClosed() {
		t.Fatal("Close left the NATS connection open")
	}
	// Wrong token: Init fails at once with an error saying the credentials
	// were rejected; it is not ErrUnavailable, since retrying cannot help.
	t.Setenv(EnvNATSToken, "bad")
	_, err = Init(ctx, quiet(), WithRank(0), WithWorldSize(1), WithLocalRank(0), WithLocalWorldSize(1), WithNodeRank(0))
	if err == nil || errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "rejected") {
		t.Fatalf("Init with a bad token: %v", err)
	}
}
