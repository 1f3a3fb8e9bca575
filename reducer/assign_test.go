package reducer

import (
	"errors"
	"reflect"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

func f32(n int) TensorInfo { return TensorInfo{DType: comm.Float32, Count: n, Device: -1} }
func f64(n int) TensorInfo { return TensorInfo{DType: comm.Float64, Count: n, Device: -1} }

// alternating returns float32[50] / float64[25] alternating, ×3 (200 bytes each).
func alternating() []TensorInfo {
	var ts []TensorInfo
	for range 3 {
		ts = append(ts, f32(50), f64(25))
	}
	return ts
}

// TestComputeBucketAssignmentTables checks the four tables of issue 6
// (c10d's ComputeBucketAssignmentTest), sizes in elements, limits in bytes.
func TestComputeBucketAssignmentTables(t *testing.T) {
	tests := []struct {
		name       string
		tensors    []TensorInfo
		limits     []int
		want       [][]int
		wantLimits []int // nil: not checked
	}{
		{"float32 single limit", []TensorInfo{f32(100), f32(200), f32(100), f32(50)}, []int{400},
			[][]int{{0}, {1}, {2}, {3}}, nil},
		{"alternating single limit", alternating(), []int{400},
			[][]int{{0, 2}, {1, 3}, {4}, {5}}, nil},
		{"float32 multiple limits", []TensorInfo{f32(10), f32(10), f32(10), f32(10)}, []int{40, 80},
			[][]int{{0}, {1, 2}, {3}}, []int{40, 80, 80}},
		{"alternating multiple limits", alternating(), []int{200, 400},
			[][]int{{0}, {1}, {2, 4}, {3, 5}}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, limits, err := ComputeBucketAssignmentBySize(tc.tensors, tc.limits, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("buckets = %v, want %v", got, tc.want)
			}
			if tc.wantLimits != nil && !reflect.DeepEqual(limits, tc.wantLimits) {
				t.Errorf("per-bucket limits = %v, want %v", limits, tc.wantLimits)
			}
		})
	}
}

// TestComputeBucketAssignmentOrder checks assignment in a given order (the
// reverse order New uses, and a rebuild order): buckets are ordered by
// when they become ready.
func TestComputeBucketAssignmentOrder(t *testing.T) {
	four := []TensorInfo{f32(10), f32(10), f32(10), f32(10)}
	got, limits, err := ComputeBucketAssignmentBySize(four, []int{40, 80}, []int{3, 2, 1, 0})
	if err != nil {
		t.Fatal(err)
	}
	if want := [][]int{{3}, {2, 1}, {0}}; !reflect.DeepEqual(got, want) {
		t.Errorf("reverse order: buckets = %v, want %v", got, want)
	}
	if want := []int{40, 80, 80}; !reflect.DeepEqual(limits, want) {
		t.Errorf("reverse order: limits = %v, want %v", limits, want)
	}
	// Mixed dtypes in a given order: the float64 bucket closes first, so it
	// launches first; the open float32 tail goes after.
	ts := []TensorInfo{f32(50), f64(25), f64(25), f32(10)}
	got, _, err = ComputeBucketAssignmentBySize(ts, []int{400}, []int{0, 1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	if want := [][]int{{1, 2}, {0, 3}}; !reflect.DeepEqual(got, want) {
		t.Errorf("mixed order: buckets = %v, want %v", got, want)
	}
}

func TestComputeBucketAssignmentErrors(t *testing.T) {
	four := []TensorInfo{f32(10), f32(10), f32(10), f32(10)}
	cases := map[string]struct {
		tensors []TensorInfo
		limits  []int
		order   []int
	}{
		"no limits":      {four, nil, nil},
		"zero limit":     {four, []int{0}, nil},
		"short order":    {four, []int{40}, []int{0, 1}},
		"repeated index": {four, []int{40}, []int{0, 1, 1, 2}},
		"out of range":   {four, []int{40}, []int{0, 1, 2, 4}},
		"invalid dtype":  {[]TensorInfo{{DType: 0, Count: 1}}, []int{40}, nil},
	}
	for name, tc := range cases {
		if _, _, err := ComputeBucketAssignmentBySize(tc.tensors, tc.limits, tc.order); !errors.Is(err, comm.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", name, err)
		}
	}
}

// TestComputeBucketAssignmentEmpty: no parameters, no buckets.
func TestComputeBucketAssignmentEmpty(t *testing.T) {
	got, limits, err := ComputeBucketAssignmentBySize(nil, []int{40}, nil)
	if err != nil || len(got) != 0 || len(limits) != 0 {
		t.Fatalf("got %v %v %v, want no buckets", got, limits, err)
	}
}
