package reducer

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// testCore builds a core over 4 float32[10] parameters in buckets
// [[3],[2,1],[0]] (reverse order, limits {40, 80}).
func testCore(t *testing.T, findUnused, static bool) *core {
	t.Helper()
	infos := []TensorInfo{f32(10), f32(10), f32(10), f32(10)}
	buckets, limits, err := ComputeBucketAssignmentBySize(infos, []int{40, 80}, []int{3, 2, 1, 0})
	if err != nil {
		t.Fatal(err)
	}
	lay, err := newLayout(infos, buckets, limits)
	if err != nil {
		t.Fatal(err)
	}
	return newCore(1, []string{"a", "b", "c", "d"}, lay, findUnused, static)
}

func mustBegin(t *testing.T, c *core, unused ...int) (marked, launch []int) {
	t.Helper()
	set, err := c.checkBegin(unused)
	if err != nil {
		t.Fatal(err)
	}
	marked, launch = c.begin(set)
	return marked, launch
}

// TestCoreInOrderLaunch: a bucket that is ready before an earlier one
// waits, then both launch in index order.
func TestCoreInOrderLaunch(t *testing.T) {
	c := testCore(t, false, false)
	mustBegin(t, c)
	steps := []struct {
		param int
		want  []int
	}{
		{0, nil},            // bucket 2 complete, waits for 0 and 1
		{1, nil},            // bucket 1 half
		{2, nil},            // bucket 1 complete, waits for bucket 0
		{3, []int{0, 1, 2}}, // bucket 0 completes: all three launch in order
	}
	for _, s := range steps {
		got, err := c.mark(s.param)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, s.want) {
			t.Fatalf("mark(%d) launched %v, want %v", s.param, got, s.want)
		}
	}
	unused, launch, needMap, err := c.end()
	if err != nil || unused != nil || launch != nil || needMap {
		t.Fatalf("end = %v %v %v %v", unused, launch, needMap, err)
	}
	order := c.finalize()
	if want := []int{0, 1, 2, 3}; !reflect.DeepEqual(order, want) {
		t.Errorf("rebuild order = %v, want %v", order, want)
	}
	if c.wantsRebuild() {
		t.Error("rebuild still wanted after it was handed out")
	}
}

func TestCoreMarkTwiceAndUnfinished(t *testing.T) {
	c := testCore(t, false, false)
	mustBegin(t, c)
	if _, err := c.mark(2); err != nil {
		t.Fatal(err)
	}
	_, err := c.mark(2)
	var e *Error
	if !errors.Is(err, ErrMarkedTwice) || !errors.As(err, &e) || e.Param != 2 || e.Name != "c" || e.Rank != 1 {
		t.Fatalf("second mark: %v", err)
	}
	if !strings.Contains(err.Error(), "Expected to mark a variable ready only once") || !strings.Contains(err.Error(), "parameter 2 (c)") {
		t.Errorf("message %q", err)
	}
	// EndBackward with parameters missing and no unused detection.
	_, _, _, err = c.end()
	if !errors.Is(err, ErrMissingGradients) || !strings.Contains(err.Error(), "0 (a), 1 (b), 3 (d)") {
		t.Fatalf("end: %v", err)
	}
	// The next iteration cannot start.
	_, err = c.checkBegin(nil)
	if !errors.Is(err, ErrUnfinishedReduction) {
		t.Fatalf("begin: %v", err)
	}
	for _, want := range []string{"Expected to have finished reduction in the prior iteration", "Parameter indices which did not receive grad for rank 1: 0 (a), 1 (b), 3 (d)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
	if _, err := c.mark(0); !errors.Is(err, ErrUnfinishedReduction) {
		t.Errorf("mark after failed end: %v", err)
	}
}

// TestCoreFindUnused: unused parameters declared up front and found at
// end both launch their buckets; the map is reduced; no rebuild.
func TestCoreFindUnused(t *testing.T) {
	c := testCore(t, true, false)
	marked, launch := mustBegin(t, c, 3)
	if !reflect.DeepEqual(marked, []int{3}) || !reflect.DeepEqual(launch, []int{0}) {
		t.Fatalf("begin marked %v launched %v", marked, launch)
	}
	if _, err := c.mark(3); !errors.Is(err, ErrMarkedTwice) {
		t.Errorf("mark of a declared-unused parameter: %v", err)
	}
	if got, _ := c.mark(1); got != nil {
		t.Fatalf("mark(1) launched %v", got)
	}
	unused, launch, needMap, err := c.end()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(unused, []int{0, 2}) || !reflect.DeepEqual(launch, []int{1, 2}) || !needMap {
		t.Fatalf("end: unused %v launch %v needMap %v", unused, launch, needMap)
	}
	if order := c.finalize(); order != nil {
		t.Errorf("find-unused mode rebuilt: %v", order)
	}
}

// TestCoreStaticGraph: the first iteration records unused parameters;
// later ones pre-mark them and reject any change.
func TestCoreStaticGraph(t *testing.T) {
	c := testCore(t, false, true)
	mustBegin(t, c)
	for _, p := range []int{3, 2, 1} {
		if _, err := c.mark(p); err != nil {
			t.Fatal(err)
		}
	}
	unused, _, needMap, err := c.end()
	if err != nil || !reflect.DeepEqual(unused, []int{0}) || !needMap {
		t.Fatalf("first end: %v %v %v", unused, needMap, err)
	}
	if order := c.finalize(); !reflect.DeepEqual(order, []int{3, 2, 1, 0}) {
		t.Fatalf("static rebuild order %v", order)
	}
	// Second iteration: 0 is pre-marked; the map is not reduced again.
	marked, _ := mustBegin(t, c)
	if !reflect.DeepEqual(marked, []int{0}) {
		t.Fatalf("pre-marked %v", marked)
	}
	if _, err := c.mark(0); !errors.Is(err, ErrStaticGraphChanged) || !strings.Contains(err.Error(), "unused in first iteration, but then got used") {
		t.Fatalf("using an unused parameter: %v", err)
	}
	for _, p := range []int{3, 2} {
		if _, err := c.mark(p); err != nil {
			t.Fatal(err)
		}
	}
	_, _, _, err = c.end()
	if !errors.Is(err, ErrStaticGraphChanged) || !strings.Contains(err.Error(), "used in first iteration, but then got unused") {
		t.Fatalf("dropping a used parameter: %v", err)
	}
	// A declared unused set that differs is refused at begin.
	c2 := testCore(t, false, true)
	mustBegin(t, c2, 0)
	for _, p := range []int{3, 2, 1} {
		c2.mark(p)
	}
	if _, _, needMap, err := c2.end(); err != nil || !needMap {
		t.Fatal(err)
	}
	c2.finalize()
	if _, err := c2.checkBegin([]int{1}); !errors.Is(err, ErrStaticGraphChanged) {
		t.Fatalf("changed declared set: %v", err)
	}
}

func TestCoreBadArguments(t *testing.T) {
	c := testCore(t, false, false)
	if _, err := c.checkBegin([]int{1}); err == nil {
		t.Error("unused set accepted without FindUnusedParameters")
	}
	cu := testCore(t, true, false)
	for _, bad := range [][]int{{4}, {-1}, {1, 1}} {
		if _, err := cu.checkBegin(bad); err == nil {
			t.Errorf("unused %v accepted", bad)
		}
	}
	mustBegin(t, c)
	if _, err := c.mark(7); err == nil {
		t.Error("mark(7) accepted")
	}
}
