package bootstrap

import (
	"errors"
	"strings"
	"testing"

	"github.com/ranktree/ranktree/store"
)

// TestInitErrorNames: the message names dead and missing ranks; without
// dead ranks it does not claim ErrRankDead.
func TestInitErrorNames(t *testing.T) {
	be := &store.BarrierError{Key: "init", Rank: 0, WorldSize: 3, Arrived: []int{0}, Missing: []int{1, 2}}
	err := initError(0, "init barrier", nil, be)
	var ie *InitError
	if !errors.As(err, &ie) || errors.Is(err, ErrRankDead) || !errors.Is(err, store.ErrTimeout) || len(ie.Missing) != 2 {
		t.Fatalf("timeout: %v", err)
	}
	if !strings.Contains(err.Error(), "ranks [1 2] never arrived") {
		t.Fatalf("message %q", err)
	}
}
