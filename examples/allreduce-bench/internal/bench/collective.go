package bench

import (
	"fmt"
	"strings"
)

// Collective is the operation measured.
type Collective uint8

// The collectives allreduce-bench measures (nccl-tests' *_perf programs).
const (
	AllReduce     Collective = iota + 1 // all_reduce_perf: AllReduce in place
	AllGather                           // all_gather_perf: AllGatherInto
	Broadcast                           // broadcast_perf: Broadcast in place from Config.Root
	ReduceScatter                       // reduce_scatter_perf: ReduceScatterTensor
	AllToAll                            // alltoall_perf: AllToAllSingle with equal splits
)

var collectiveNames = [...]string{"invalid", "allreduce", "allgather", "broadcast", "reducescatter", "alltoall"}

// String is the flag spelling ("allreduce", ...).
func (c Collective) String() string {
	if c < AllReduce || c > AllToAll {
		return fmt.Sprintf("collective(%d)", uint8(c))
	}
	return collectiveNames[c]
}

// ParseCollective maps a flag value to a Collective. Underscores and
// hyphens are ignored and case does not matter ("all_reduce", "AllReduce").
func ParseCollective(s string) (Collective, error) {
	k := strings.ToLower(strings.NewReplacer("_", "", "-", "").Replace(strings.TrimSpace(s)))
	for c := AllReduce; c <= AllToAll; c++ {
		if collectiveNames[c] == k {
			return c, nil
		}
	}
	return 0, fmt.Errorf("bench: unknown collective %q: want allreduce, allgather, broadcast, reducescatter or alltoall", s)
}

// Reduces reports whether the collective applies a reduction (and so uses
// Config.Op).
func (c Collective) Reduces() bool { return c == AllReduce || c == ReduceScatter }

// BusFactor is busbw/algbw for n ranks, from nccl-tests' PERFORMANCE.md:
// 2(n-1)/n for allreduce, (n-1)/n for allgather, reducescatter and
// alltoall, 1 for broadcast. It is 0 for n < 1 or an invalid Collective.
func (c Collective) BusFactor(n int) float64 {
	if n < 1 {
		return 0
	}
	f := float64(n-1) / float64(n)
	switch c {
	case AllReduce:
		return 2 * f
	case AllGather, ReduceScatter, AllToAll:
		return f
	case Broadcast:
		return 1
	}
	return 0
}

// Geometry is the buffer layout of one measurement, in elements.
type Geometry struct {
	Count    int // elements reported (the whole buffer; see the package doc)
	InCount  int // elements of this rank's input buffer
	OutCount int // elements of this rank's output buffer (0: in place)
}

// Layout gives the buffers for a message of `bytes` bytes of elements of
// elemSize bytes on n ranks. The count is bytes/elemSize (at least 1);
// for allgather, reducescatter and alltoall it is rounded down to a
// multiple of n, and up to n if that leaves nothing.
func (c Collective) Layout(bytes int64, elemSize, n int) Geometry {
	count := max(int(bytes/int64(elemSize)), 1)
	switch c {
	case AllGather:
		count = max(count/n*n, n)
		return Geometry{Count: count, InCount: count / n, OutCount: count}
	case ReduceScatter:
		count = max(count/n*n, n)
		return Geometry{Count: count, InCount: count, OutCount: count / n}
	case AllToAll:
		count = max(count/n*n, n)
		return Geometry{Count: count, InCount: count, OutCount: count}
	}
	return Geometry{Count: count, InCount: count}
}
