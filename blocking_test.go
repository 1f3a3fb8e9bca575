package ranktree

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/supervisor"
)

// TestBlockingOpsFail runs blocking ops (comm.Blocking, whose op blocks
// are recycled) through the ways an op ends badly on the public path,
// each while the previous blocking ops' blocks are still held by the
// watchdog and the flight recorder: a cancelled ctx (the ctx watch aborts
// the communicator under ops in flight), an op timeout (the watchdog fails
// the op), and a rank that closes under a blocking op. Each returns a
// completed Work with the async form's typed error, and the race detector
// (go test -race) checks that no block is reused under a holder.
func TestBlockingOpsFail(t *testing.T) {
	clearSupervisionEnv(t)
	t.Setenv(supervisor.EnvAsyncErrorHandling, "CleanupOnly")
	bg, cancelAll := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancelAll()
	bl := comm.Blocking()
	// warm issues n blocking allreduces on every rank, checking each.
	warm := func(rt *Runtime, ctx context.Context, n int) error {
		b := []float32{0}
		for i := range n {
			b[0] = 1
			if err := rt.World().AllReduce(ctx, comm.HostBuffer(b), comm.Sum, bl).Err(); err != nil {
				return err
			}
			if b[0] != 2 {
				t.Errorf("rank %d op %d: %v, want 2", rt.Rank(), i, b[0])
			}
		}
		return nil
	}
	// alone starts two ranks, warms them with 500 blocking ops under ctx
	// and then runs f on rank 0 alone: its next op waits for rank 1, which
	// has returned.
	alone := func(t *testing.T, ctx context.Context, f func(rt *Runtime)) {
		rts := startRanks(t, 2, WithExit(func(int) {}))
		eachRank(t, rts, func(rt *Runtime) error {
			if err := warm(rt, ctx, 500); err != nil {
				return err
			}
			if rt.Rank() == 0 {
				f(rt)
			}
			return nil
		})
	}

	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(bg)
		alone(t, ctx, func(rt *Runtime) {
			go func() { time.Sleep(50 * time.Millisecond); cancel() }()
			w := rt.World().AllReduce(ctx, comm.HostBuffer([]float32{1}), comm.Sum, bl)
			if !w.IsCompleted() || !errors.Is(w.Err(), context.Canceled) {
				t.Errorf("cancelled blocking op: completed %v, %v", w.IsCompleted(), w.Err())
			}
			// The communicator is aborted: the next op fails at once, with the
			// op's own Work.
			w = rt.World().Barrier(bg, bl)
			if !errors.Is(w.Err(), comm.ErrAborted) || w.Seq() == 0 {
				t.Errorf("op after the cancel: %v (seq %d), want ErrAborted from the op's own Work", w.Err(), w.Seq())
			}
		})
	})

	t.Run("timeout", func(t *testing.T) {
		alone(t, bg, func(rt *Runtime) {
			w := rt.World().AllReduce(bg, comm.HostBuffer([]float32{1}), comm.Sum, bl, comm.WithOpTimeout(200*time.Millisecond))
			var te *comm.TimeoutError
			if !errors.As(w.Err(), &te) || w.Fingerprint().Seq != 501 || te.FP.Seq != 501 {
				t.Errorf("timed-out blocking op: %v (seq %d), want a TimeoutError at seq 501 from the op's own Work", w.Err(), w.Fingerprint().Seq)
			}
		})
	})

	t.Run("close", func(t *testing.T) {
		alone(t, bg, func(rt *Runtime) {
			go func() {
				time.Sleep(50 * time.Millisecond)
				ctx, cancel := context.WithTimeout(bg, 10*time.Second)
				defer cancel()
				rt.Close(ctx)
			}()
			w := rt.World().AllReduce(bg, comm.HostBuffer([]float32{1}), comm.Sum, bl)
			if !w.IsCompleted() || w.Err() == nil {
				t.Errorf("blocking op under Close: completed %v, err %v", w.IsCompleted(), w.Err())
			}
			t.Logf("blocking op under Close: %v", w.Err())
		})
	})
}
