package reducer

import (
	"context"
	"reflect"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

// TestInitialLayoutMatchesDDP (issue 19, item 1): New lays buckets out as
// DDP's constructor does — c10d's compute_bucket_assignment_by_size in
// parameter order with [first_bucket_bytes, bucket_cap], then the bucket
// list reversed — not by assigning over the reversed parameter list. The
// first case is the issue's: three 60-byte float32 parameters with limits
// [100, 1000] give [[2], [0 1]] (assignment over the reversed list gave
// [[2 1], [0]]). The others are c10d's ComputeBucketAssignmentTest tables
// (reversed) through New.
func TestInitialLayoutMatchesDDP(t *testing.T) {
	for _, tc := range []struct {
		name        string
		counts      []int // float32 elements per parameter
		first, cap_ int   // bytes
		want        [][]int
		wantSizes   []int // bytes per bucket, in launch order
	}{
		{"issue example", []int{15, 15, 15}, 100, 1000, [][]int{{2}, {0, 1}}, []int{60, 120}},
		{"single limit", []int{100, 200, 100, 50}, 400, 400, [][]int{{3}, {2}, {1}, {0}}, []int{200, 400, 800, 400}},
		{"multiple limits", []int{10, 10, 10, 10}, 40, 80, [][]int{{3}, {1, 2}, {0}}, []int{40, 80, 40}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gs := newMemWorld(1).groups()
			var params []Param
			for _, c := range tc.counts {
				params = append(params, Param{Data: comm.HostBuffer(make([]float32, c))})
			}
			r, err := New(context.Background(), gs[0], params, Config{FirstBucketBytes: tc.first, BucketCapBytes: tc.cap_})
			if err != nil {
				t.Fatal(err)
			}
			st := r.Stats()
			if !reflect.DeepEqual(st.BucketParams, tc.want) || !reflect.DeepEqual(st.BucketSizes, tc.wantSizes) {
				t.Errorf("buckets %v (bytes %v), want %v (bytes %v)", st.BucketParams, st.BucketSizes, tc.want, tc.wantSizes)
			}
		})
	}
}
