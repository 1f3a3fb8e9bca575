package comm_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

// FuzzSplitsValidation feeds arbitrary split lists and buffer lengths to
// the V-variants and AllToAllSingle: validation must never panic, must
// reject with ErrInvalidArgument, or hand the engine counts that exactly
// tile the buffers.
func FuzzSplitsValidation(f *testing.F) {
	f.Add([]byte{1, 2, 3}, []byte{3, 2, 1}, uint16(6), uint16(6))
	f.Add([]byte{0, 0, 0}, []byte{}, uint16(0), uint16(3))
	f.Add([]byte{255, 1, 0}, []byte{1, 1, 1, 1}, uint16(256), uint16(4))
	f.Fuzz(func(t *testing.T, a, b []byte, inLen, outLen uint16) {
		ctx := context.Background()
		l := &recordingLauncher{}
		pg, err := comm.NewProcessGroup(comm.GroupConfig{Name: "fuzz", Rank: 1, Size: 3, Launcher: l, Engine: "cpu"})
		if err != nil {
			t.Fatal(err)
		}
		splits := func(p []byte) []int {
			if len(p) == 0 {
				return nil
			}
			s := make([]int, len(p))
			for i, v := range p {
				s[i] = int(int8(v)) // negative values included
			}
			return s
		}
		in, out := comm.NewHostBuffer(comm.Int8, int(inLen)%600), comm.NewHostBuffer(comm.Int8, int(outLen)%600)
		ws := []*comm.Work{
			pg.AllToAllSingle(ctx, out, in, splits(a), splits(b)),
			pg.AllGatherV(ctx, out, in, splits(a)),
			pg.ReduceScatterV(ctx, out, in, splits(b), comm.Sum),
		}
		for _, w := range ws {
			if err := w.Err(); err != nil && !errors.Is(err, comm.ErrInvalidArgument) {
				t.Fatalf("unexpected error %v", err)
			}
		}
		for _, op := range l.ops {
			sum := func(c []int) int {
				s := 0
				for _, v := range c {
					if v < 0 {
						t.Fatalf("negative count in %v", c)
					}
					s += v
				}
				return s
			}
			switch op.Type {
			case comm.OpAllToAll:
				if sum(op.SendCounts) != op.In[0].Len() || sum(op.RecvCounts) != op.Out[0].Len() {
					t.Fatalf("alltoall counts %v/%v do not tile %d/%d", op.SendCounts, op.RecvCounts, op.In[0].Len(), op.Out[0].Len())
				}
			case comm.OpAllGatherV:
				if sum(op.RecvCounts) != op.Out[0].Len() || op.RecvCounts[1] != op.In[0].Len() {
					t.Fatalf("allgatherv counts %v for in %d out %d", op.RecvCounts, op.In[0].Len(), op.Out[0].Len())
				}
			case comm.OpReduceScatterV:
				if sum(op.RecvCounts) != op.In[0].Len() || op.RecvCounts[1] != op.Out[0].Len() {
					t.Fatalf("reducescatterv counts %v for in %d out %d", op.RecvCounts, op.In[0].Len(), op.Out[0].Len())
				}
			}
		}
	})
}

// recordingLauncher records ops and completes them, without an actor.
type recordingLauncher struct{ ops []*comm.Op }

func (l *recordingLauncher) Submit(_ context.Context, op *comm.Op, p *comm.Promise) {
	l.ops = append(l.ops, op)
	p.Complete(nil)
}
func (l *recordingLauncher) Abort(error)                 {}
func (l *recordingLauncher) Close(context.Context) error { return nil }
