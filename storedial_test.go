package ranktree

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/store/natsstore"
)

// TestInitStoreRefusedFailsFast: a rank whose RANKTREE_NATS_URL refuses
// connections logs the first failure at once and Init fails within
// seconds with a *natsstore.DialError naming the URL; RANKTREE_STORE_WAIT
// must be a boolean.
func TestInitStoreRefusedFailsFast(t *testing.T) {
	env := goodEnv() // nats://127.0.0.1:1
	env[EnvStoreTimeout] = "1m"
	setEnv(t, env)
	var logs bytes.Buffer
	start := time.Now()
	_, err := Init(context.Background(), WithLogger(zerolog.New(&logs)))
	var de *natsstore.DialError
	if !errors.As(err, &de) || !de.Refused || de.URL != "nats://127.0.0.1:1" {
		t.Fatalf("Init: %v, want a refused *natsstore.DialError for nats://127.0.0.1:1", err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("Init failed after %v, want a few seconds", took)
	}
	if !strings.Contains(logs.String(), "retrying for up to") || !strings.Contains(logs.String(), `"rank":0`) {
		t.Errorf("first failure not logged with the rank: %s", logs.String())
	}
	t.Setenv(EnvStoreWait, "maybe")
	_, err = Init(context.Background(), quiet())
	var ee *EnvError
	if !errors.As(err, &ee) || ee.Var != EnvStoreWait {
		t.Errorf("RANKTREE_STORE_WAIT=maybe: %v, want an EnvError naming it", err)
	}
}
