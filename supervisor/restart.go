package supervisor

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/ranktree/ranktree/store"
)

// RestartKey is the store barrier key for re-creating group's communicator
// under epoch: "restart/<group>/<epoch>".
func RestartKey(group string, epoch uint32) string {
	return "restart/" + group + "/" + strconv.FormatUint(uint64(epoch), 10)
}

// RestartEpoch coordinates a communicator restart without restarting
// processes: every member of group (size members; rank is its group rank)
// calls it after its communicator of epoch from was aborted, and it returns
// from+1 once all members have arrived (store.Barrier on
// RestartKey(group, from+1)). The caller then builds the new communicator
// with that epoch, whose store keys, abort key and fingerprints are all
// distinct from the old one's. If a member does not arrive within timeout
// (0: the store's), the error wraps the *store.BarrierError naming the
// missing ranks; the caller should then escalate (TearDown).
func RestartEpoch(ctx context.Context, st store.Store, group string, from uint32, rank, size int, timeout time.Duration) (uint32, error) {
	next := from + 1
	if err := store.Barrier(ctx, st, RestartKey(group, next), rank, size, timeout); err != nil {
		return from, fmt.Errorf("supervisor: restarting group %q at epoch %d (rank %d of %d): %w", group, next, rank, size, err)
	}
	return next, nil
}
