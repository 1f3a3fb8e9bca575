package comm_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

// TestBlockingCollectivesCPU runs every collective and P2P op in its
// blocking form (comm.Blocking) over the CPU engine, 3 ranks in this
// process, several rounds (so that recycled op blocks are reused), and
// checks the results: each returns complete, with its result in place.
func TestBlockingCollectivesCPU(t *testing.T) {
	const n = 3
	pgs := cpuWorld(t, n)
	bl := comm.Blocking()
	onRanks(t, pgs, func(ctx context.Context, pg *comm.ProcessGroup) error {
		r := pg.Rank()
		done := func(what string, w *comm.Work) error {
			if !w.IsCompleted() {
				return fmt.Errorf("%s: blocking form returned an incomplete Work", what)
			}
			if err := w.Err(); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			return nil
		}
		for round := range 20 {
			v := float32(round)
			b := []float32{float32(r) + v}
			if err := done("AllReduce", pg.AllReduce(ctx, comm.HostBuffer(b), comm.Sum, bl)); err != nil {
				return err
			}
			if want := 0 + 1 + 2 + 3*v; b[0] != want {
				return fmt.Errorf("AllReduce round %d: %v, want %v", round, b[0], want)
			}
			b[0] = float32(10*r) + v
			if err := done("Broadcast", pg.Broadcast(ctx, comm.HostBuffer(b), 1, bl)); err != nil {
				return err
			}
			if b[0] != 10+v {
				return fmt.Errorf("Broadcast: %v", b[0])
			}
			b[0] = float32(r)
			if err := done("Reduce", pg.Reduce(ctx, comm.HostBuffer(b), 2, comm.Max, bl)); err != nil {
				return err
			}
			if r == 2 && b[0] != 2 {
				return fmt.Errorf("Reduce: %v", b[0])
			}
			out := make([]float32, n)
			if err := done("AllGatherInto", pg.AllGatherInto(ctx, comm.HostBuffer(out), comm.HostBuffer([]float32{float32(r) + v}), bl)); err != nil {
				return err
			}
			for i, x := range out {
				if x != float32(i)+v {
					return fmt.Errorf("AllGatherInto: %v", out)
				}
			}
			in := []float32{1 + v, 2 + v, 3 + v}
			one := make([]float32, 1)
			if err := done("ReduceScatterTensor", pg.ReduceScatterTensor(ctx, comm.HostBuffer(one), comm.HostBuffer(in), comm.Sum, bl)); err != nil {
				return err
			}
			if one[0] != n*(float32(r+1)+v) {
				return fmt.Errorf("ReduceScatterTensor: %v", one)
			}
			list := []comm.Buffer{comm.HostBuffer(make([]int64, 1)), comm.HostBuffer(make([]int64, 1)), comm.HostBuffer(make([]int64, 1))}
			if err := done("AllGather", pg.AllGather(ctx, list, comm.HostBuffer([]int64{int64(r)}), bl)); err != nil {
				return err
			}
			sendAll := []int32{int32(10*r + 0), int32(10*r + 1), int32(10*r + 2)}
			recvAll := make([]int32, n)
			if err := done("AllToAllSingle", pg.AllToAllSingle(ctx, comm.HostBuffer(recvAll), comm.HostBuffer(sendAll), nil, nil, bl)); err != nil {
				return err
			}
			for i, x := range recvAll {
				if x != int32(10*i+r) {
					return fmt.Errorf("AllToAllSingle: %v", recvAll)
				}
			}
			if err := done("Barrier", pg.Barrier(ctx, bl)); err != nil {
				return err
			}
			// A ring of sends and receives, each blocking in a batch.
			got := make([]float32, 1)
			ws, err := pg.BatchP2P(ctx, []comm.P2POp{
				{Op: comm.OpSend, Buf: comm.HostBuffer([]float32{float32(r) + v}), Peer: (r + 1) % n},
				{Op: comm.OpRecv, Buf: comm.HostBuffer(got), Peer: (r + n - 1) % n},
			}, bl)
			if err != nil {
				return err
			}
			for _, w := range ws {
				if err := done("BatchP2P", w); err != nil {
					return err
				}
			}
			if got[0] != float32((r+n-1)%n)+v {
				return fmt.Errorf("BatchP2P: %v", got)
			}
			c := []float32{1}
			if err := done("Coalesce", pg.Coalesce(ctx, func(co *comm.Coalescer) error {
				return co.AllReduce(comm.HostBuffer(c), comm.Sum)
			}, bl)); err != nil {
				return err
			}
			if c[0] != n {
				return fmt.Errorf("Coalesce: %v", c)
			}
		}
		// Bad input fails before launch, in the blocking form too.
		if w := pg.AllGatherInto(ctx, comm.HostBuffer(make([]float32, 1)), comm.HostBuffer(make([]float32, 1)), bl); !errors.Is(w.Err(), comm.ErrInvalidArgument) {
			return fmt.Errorf("bad input: %v", w.Err())
		}
		return nil
	})
}
