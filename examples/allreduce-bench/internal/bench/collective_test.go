package bench

import (
	"math"
	"testing"
)

func TestParseCollective(t *testing.T) {
	for in, want := range map[string]Collective{
		"allreduce": AllReduce, "all_reduce": AllReduce, "AllReduce": AllReduce, "allgather": AllGather,
		"broadcast": Broadcast, "reducescatter": ReduceScatter, "reduce-scatter": ReduceScatter, "alltoall": AllToAll,
	} {
		if got, err := ParseCollective(in); err != nil || got != want {
			t.Errorf("ParseCollective(%q) = %v, %v; want %v", in, got, err, want)
		}
		if want.String() != collectiveNames[want] {
			t.Errorf("%v.String() = %q", want, want.String())
		}
	}
	for _, in := range []string{"", "reduce", "gather", "allreduce2"} {
		if _, err := ParseCollective(in); err == nil {
			t.Errorf("ParseCollective(%q): want an error", in)
		}
	}
}

// TestBusFactor checks nccl-tests' factors for several world sizes.
func TestBusFactor(t *testing.T) {
	cases := []struct {
		c    Collective
		n    int
		want float64
	}{
		{AllReduce, 1, 0}, {AllReduce, 2, 1}, {AllReduce, 4, 1.5}, {AllReduce, 8, 1.75}, {AllReduce, 3, 4.0 / 3},
		{AllGather, 2, 0.5}, {AllGather, 4, 0.75}, {ReduceScatter, 4, 0.75}, {ReduceScatter, 3, 2.0 / 3},
		{AllToAll, 4, 0.75}, {AllToAll, 1, 0},
		{Broadcast, 1, 1}, {Broadcast, 2, 1}, {Broadcast, 8, 1},
		{Collective(0), 4, 0}, {AllReduce, 0, 0},
	}
	for _, c := range cases {
		if got := c.c.BusFactor(c.n); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("%v.BusFactor(%d) = %v, want %v", c.c, c.n, got, c.want)
		}
	}
}

func TestLayout(t *testing.T) {
	cases := []struct {
		c     Collective
		bytes int64
		size  int
		n     int
		want  Geometry
	}{
		{AllReduce, 4096, 4, 3, Geometry{Count: 1024, InCount: 1024}},
		{AllReduce, 2, 4, 2, Geometry{Count: 1, InCount: 1}}, // below one element: one element
		{Broadcast, 10, 2, 4, Geometry{Count: 5, InCount: 5}},
		{AllGather, 4096, 4, 3, Geometry{Count: 1023, InCount: 341, OutCount: 1023}},
		{AllGather, 4, 4, 4, Geometry{Count: 4, InCount: 1, OutCount: 4}}, // at least one per rank
		{ReduceScatter, 4096, 4, 4, Geometry{Count: 1024, InCount: 1024, OutCount: 256}},
		{ReduceScatter, 4096, 8, 3, Geometry{Count: 510, InCount: 510, OutCount: 170}},
		{AllToAll, 1 << 20, 4, 3, Geometry{Count: 262143, InCount: 262143, OutCount: 262143}},
	}
	for _, c := range cases {
		if got := c.c.Layout(c.bytes, c.size, c.n); got != c.want {
			t.Errorf("%v.Layout(%d, %d, %d) = %+v, want %+v", c.c, c.bytes, c.size, c.n, got, c.want)
		}
	}
}
