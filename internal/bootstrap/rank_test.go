package bootstrap

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/store"
)

// TestCloseBounded: Close returns by its ctx's deadline, with an error,
// when a teardown step hangs.
func TestCloseBounded(t *testing.T) {
	rt, err := Start(context.Background(), func(string) (string, bool) { return "", false }, WithLogger(zerolog.Nop()),
		WithStore(store.NewMemStore()), WithRank(0), WithWorldSize(1), WithLocalRank(0), WithLocalWorldSize(1), WithNodeRank(0))
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	defer close(release)
	rt.onClose(func(context.Context) error { <-release; return nil })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := rt.Close(ctx); err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("Close with a hung teardown: %v after %v", err, time.Since(start))
	}
}
