package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// BarrierError is the store-based barrier's timeout: it names the ranks that
// arrived and those that did not (c10d _store_based_barrier's "Timed out
// initializing process group in store based barrier" report). It unwraps to
// ErrTimeout.
type BarrierError struct {
	Key       string
	Rank      int // the reporting rank
	WorldSize int
	Timeout   time.Duration
	Arrived   []int // ranks whose arrival was recorded
	Missing   []int // ranks that never arrived (likely dead or stuck)
}

// Error implements error: the message names what failed and why.
func (e *BarrierError) Error() string {
	return fmt.Sprintf("store: Timed out after %v in store based barrier on rank %d for key %q (world_size=%d, num_workers_joined=%d): ranks %v arrived, ranks %v missing",
		e.Timeout, e.Rank, e.Key, e.WorldSize, len(e.Arrived), e.Arrived, e.Missing)
}

// Unwrap returns ErrTimeout.
func (e *BarrierError) Unwrap() error { return ErrTimeout }

// Barrier blocks until worldSize ranks have called it with the same key,
// timeout passes (0: the store timeout) or ctx ends. It follows torchelastic's
// store barrier: each rank records its arrival under key+"/arrived/<rank>",
// increments key+"/num_members", the last to arrive sets key+"/last_member",
// and everyone waits for that key. A key serves one barrier: reuse a key only
// under a fresh prefix. On timeout every present rank gets a *BarrierError.
func Barrier(ctx context.Context, s Store, key string, rank, worldSize int, timeout time.Duration) error {
	if worldSize < 1 || rank < 0 || rank >= worldSize {
		return fmt.Errorf("store: barrier %q: rank %d outside world_size %d", key, rank, worldSize)
	}
	if timeout <= 0 {
		timeout = s.Timeout()
	}
	start := time.Now()
	if err := s.Set(ctx, arrivedKey(key, rank), []byte("1")); err != nil {
		return fmt.Errorf("store: barrier %q rank %d: recording arrival: %w", key, rank, err)
	}
	n, err := s.Add(ctx, key+"/num_members", 1)
	if err != nil {
		return fmt.Errorf("store: barrier %q rank %d: counting arrival: %w", key, rank, err)
	}
	if n > int64(worldSize) {
		return fmt.Errorf("store: barrier %q rank %d: %d arrivals for world_size %d (key reused?)", key, rank, n, worldSize)
	}
	if n == int64(worldSize) {
		if err := s.Set(ctx, key+"/last_member", []byte(strconv.Itoa(rank))); err != nil {
			return fmt.Errorf("store: barrier %q rank %d: releasing: %w", key, rank, err)
		}
	}
	left := timeout - time.Since(start)
	if left <= 0 {
		left = time.Millisecond // 0 would mean "the store timeout"
	}
	err = s.Wait(ctx, []string{key + "/last_member"}, left)
	if err == nil || !errors.Is(err, ErrTimeout) {
		return err
	}
	be := &BarrierError{Key: key, Rank: rank, WorldSize: worldSize, Timeout: timeout}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	for r := 0; r < worldSize; r++ {
		ok, cerr := s.Check(cctx, []string{arrivedKey(key, r)})
		if cerr != nil {
			return fmt.Errorf("%w (listing arrivals failed: %v)", be, cerr)
		}
		if ok {
			be.Arrived = append(be.Arrived, r)
		} else {
			be.Missing = append(be.Missing, r)
		}
	}
	return be
}

func arrivedKey(key string, rank int) string { return key + "/arrived/" + strconv.Itoa(rank) }
