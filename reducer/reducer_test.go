package reducer

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/x448/float16"

	"github.com/ranktree/ranktree/comm"
)

var bg = context.Background()

// model is a list of float32 parameters with their gradient buffers.
type model struct {
	params []Param
	data   [][]float32
	grads  [][]float32
}

func newModel(sizes ...int) *model {
	m := &model{}
	for i, n := range sizes {
		d, g := make([]float32, n), make([]float32, n)
		m.data = append(m.data, d)
		m.grads = append(m.grads, g)
		m.params = append(m.params, Param{Name: fmt.Sprintf("p%d", i), Data: comm.HostBuffer(d)})
	}
	return m
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-5*math.Max(1, math.Abs(b)) }

func checkAll(what string, got []float32, want float64) error {
	for i, v := range got {
		if !near(float64(v), want) {
			return fmt.Errorf("%s[%d] = %v, want %v", what, i, v, want)
		}
	}
	return nil
}

func fill(s []float32, v float32) {
	for i := range s {
		s[i] = v
	}
}

// stepGrads runs one synced iteration: grad(p) is written either into the
// model's own buffer or into the bucket view, then marked in order.
func stepGrads(red *Reducer, m *model, view bool, order []int, grad func(p int) float32) error {
	for _, p := range order {
		var g comm.Buffer
		if view {
			g = red.GradBuffer(p)
			fill(mustSlice[float32](g), grad(p))
		} else {
			fill(m.grads[p], grad(p))
			g = comm.HostBuffer(m.grads[p])
		}
		if err := red.GradReady(p, g); err != nil {
			return err
		}
	}
	return red.EndBackward(bg)
}

// result returns parameter p's averaged gradient after EndBackward.
func result(red *Reducer, m *model, view bool, p int) []float32 {
	if view {
		return mustSlice[float32](red.GradBuffer(p))
	}
	return m.grads[p]
}

// TestAveragingLinearModel: a 1-in/1-out linear model y = w·x + b with
// input x = rank has dL/dw = rank and dL/db = 1; the averaged gradients
// are (n−1)/2 and 1, for world sizes 1–4, with and without bucket views.
func TestAveragingLinearModel(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		for _, view := range []bool{false, true} {
			t.Run(fmt.Sprintf("n=%d/view=%v", n, view), func(t *testing.T) {
				eachWorld(t, n, func(t *testing.T, groups []Group, _ *memWorld) {
					runRanks(t, groups, func(rank int, g Group) error {
						m := newModel(1, 1)
						red, err := New(bg, g, m.params, Config{GradientAsBucketView: view})
						if err != nil {
							return err
						}
						for step := range 3 {
							if err := stepGrads(red, m, view, []int{1, 0}, func(p int) float32 {
								return []float32{float32(rank), 1}[p]
							}); err != nil {
								return err
							}
							if err := checkAll(fmt.Sprintf("step %d dw", step), result(red, m, view, 0), float64(n-1)/2); err != nil {
								return err
							}
							if err := checkAll(fmt.Sprintf("step %d db", step), result(red, m, view, 1), 1); err != nil {
								return err
							}
						}
						return nil
					})
				})
			})
		}
	}
}

// TestParamUsedTwice: a parameter used twice in forward, each use scaled
// by rank+1, has local gradient 2(r+1) (the caller sums both uses, as
// autograd does) and averaged gradient n+1.
func TestParamUsedTwice(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) { testParamUsedTwice(t, n) })
	}
}

func testParamUsedTwice(t *testing.T, n int) {
	eachWorld(t, n, func(t *testing.T, groups []Group, _ *memWorld) {
		runRanks(t, groups, func(rank int, g Group) error {
			m := newModel(4)
			red, err := New(bg, g, m.params, Config{})
			if err != nil {
				return err
			}
			use := float32(rank + 1)
			if err := stepGrads(red, m, false, []int{0}, func(int) float32 { return use + use }); err != nil {
				return err
			}
			return checkAll("grad", m.grads[0], float64(n+1))
		})
	})
}

// TestFP16Guard: gradients of 2^15 on 2 ranks overflow float16 if summed
// first (2^16 > 65504); pre-division keeps them finite, on the built-in
// path for float16 parameters and in the fp16/bf16 compression hooks.
func TestFP16Guard(t *testing.T) {
	t.Run("float16 params", func(t *testing.T) {
		eachWorld(t, 2, func(t *testing.T, groups []Group, _ *memWorld) {
			runRanks(t, groups, func(rank int, g Group) error {
				w := make([]comm.Float16Value, 3)
				red, err := New(bg, g, []Param{{Name: "w", Data: comm.HostBuffer(w)}}, Config{})
				if err != nil {
					return err
				}
				grad := make([]comm.Float16Value, 3)
				for i := range grad {
					grad[i] = float16.Fromfloat32(32768)
				}
				if err := red.GradReady(0, comm.HostBuffer(grad)); err != nil {
					return err
				}
				if err := red.EndBackward(bg); err != nil {
					return err
				}
				for i, v := range grad {
					if f := v.Float32(); math.IsInf(float64(f), 0) || f != 32768 {
						return fmt.Errorf("grad[%d] = %v, want 32768", i, f)
					}
				}
				return nil
			})
		})
	})
	for _, hook := range []func() CommHook{FP16CompressHook, BF16CompressHook} {
		t.Run(hook().Name(), func(t *testing.T) {
			eachWorld(t, 2, func(t *testing.T, groups []Group, _ *memWorld) {
				runRanks(t, groups, func(rank int, g Group) error {
					m := newModel(5)
					red, err := New(bg, g, m.params, Config{})
					if err != nil {
						return err
					}
					if err := red.RegisterCommHook(hook()); err != nil {
						return err
					}
					if err := stepGrads(red, m, false, []int{0}, func(int) float32 { return 32768 }); err != nil {
						return err
					}
					return checkAll("grad", m.grads[0], 32768)
				})
			})
		})
	}
}

// TestRebuildOrder: gradients ready in reverse order 2,1,0 rebuild the
// buckets in that order ("2,1,0"); when ranks observe different orders,
// rank 0's wins on every rank and later launches follow it.
func TestRebuildOrder(t *testing.T) {
	cfg := Config{FirstBucketBytes: 40, BucketCapBytes: 40} // one parameter per bucket
	t.Run("reverse", func(t *testing.T) {
		eachWorld(t, 2, func(t *testing.T, groups []Group, _ *memWorld) {
			runRanks(t, groups, func(rank int, g Group) error {
				m := newModel(10, 20, 30)
				red, err := New(bg, g, m.params, cfg)
				if err != nil {
					return err
				}
				if err := stepGrads(red, m, false, []int{2, 1, 0}, func(p int) float32 { return 1 }); err != nil {
					return err
				}
				s := red.Stats()
				if !s.Rebuilt || s.RebuiltOrderString() != "2,1,0" {
					return fmt.Errorf("rebuilt %v order %q, want \"2,1,0\"", s.Rebuilt, s.RebuiltOrderString())
				}
				if want := [][]int{{2}, {1}, {0}}; !reflect.DeepEqual(s.BucketParams, want) {
					return fmt.Errorf("buckets %v, want %v", s.BucketParams, want)
				}
				if want := []int{120, 80, 40}; !reflect.DeepEqual(s.BucketSizes, want) {
					return fmt.Errorf("bucket sizes %v, want %v", s.BucketSizes, want)
				}
				return nil
			})
		})
	})
	t.Run("rank 0 wins", func(t *testing.T) {
		eachWorld(t, 3, func(t *testing.T, groups []Group, w *memWorld) {
			runRanks(t, groups, func(rank int, g Group) error {
				m := newModel(10, 20, 30)
				red, err := New(bg, g, m.params, cfg)
				if err != nil {
					return err
				}
				orders := [][]int{{0, 1, 2}, {2, 0, 1}, {1, 2, 0}}
				for it := range 3 {
					if err := stepGrads(red, m, false, orders[rank], func(p int) float32 { return float32(rank + p) }); err != nil {
						return err
					}
					for p := range 3 {
						if err := checkAll(fmt.Sprintf("iteration %d p%d", it, p), m.grads[p], float64(p)+1); err != nil {
							return err
						}
					}
				}
				s := red.Stats()
				if s.RebuiltOrderString() != "0,1,2" || !reflect.DeepEqual(s.BucketParams, [][]int{{0}, {1}, {2}}) {
					return fmt.Errorf("rebuilt order %q buckets %v, want rank 0's 0,1,2", s.RebuiltOrderString(), s.BucketParams)
				}
				if !reflect.DeepEqual(s.GradReadyOrder, orders[rank]) {
					return fmt.Errorf("ready order %v, want %v", s.GradReadyOrder, orders[rank])
				}
				return nil
			})
			if w == nil {
				return
			}
			// After the rebuild (iterations 2 and 3) every rank launched the
			// 10-, 20-, then 30-element bucket.
			for r := range 3 {
				var tail []string
				for _, l := range w.launches(r) {
					tail = append(tail, l.Desc)
				}
				tail = tail[len(tail)-6:]
				want := []string{"AllReduce float32×10 sum", "AllReduce float32×20 sum", "AllReduce float32×30 sum"}
				if !slices.Equal(tail[:3], want) || !slices.Equal(tail[3:], want) {
					t.Errorf("rank %d launches after rebuild: %v", r, tail)
				}
			}
		})
	})
}

// TestLaunchOrderIdenticalAcrossRanks: every rank marks gradients in a
// different order (shuffled per rank and iteration, from several
// goroutines at once), yet all ranks issue identical collectives in
// bucket order, and the averages are right.
func TestLaunchOrderIdenticalAcrossRanks(t *testing.T) {
	const n = 3
	sizes := []int{7, 13, 3, 29, 11, 5, 17, 2}
	eachWorld(t, n, func(t *testing.T, groups []Group, w *memWorld) {
		var layouts [n][][]int
		runRanks(t, groups, func(rank int, g Group) error {
			m := newModel(sizes...)
			red, err := New(bg, g, m.params, Config{FirstBucketBytes: 60, BucketCapBytes: 100})
			if err != nil {
				return err
			}
			rng := rand.New(rand.NewPCG(uint64(rank), 99))
			for it := range 4 {
				if it == 1 {
					layouts[rank] = red.Stats().BucketParams
				}
				order := rng.Perm(len(sizes))
				var wg sync.WaitGroup
				errs := make([]error, 2)
				for half := range 2 { // two goroutines mark concurrently
					wg.Add(1)
					go func() {
						defer wg.Done()
						for k := half; k < len(order); k += 2 {
							p := order[k]
							fill(m.grads[p], float32(rank*100+p))
							if err := red.GradReady(p, comm.HostBuffer(m.grads[p])); err != nil {
								errs[half] = err
								return
							}
							time.Sleep(time.Duration((p+rank+it)%2) * time.Millisecond)
						}
					}()
				}
				wg.Wait()
				for _, err := range errs {
					if err != nil {
						return err
					}
				}
				if err := red.EndBackward(bg); err != nil {
					return err
				}
				for p := range sizes {
					if err := checkAll(fmt.Sprintf("iteration %d p%d", it, p), m.grads[p], 100+float64(p)); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if w == nil {
			return // the CPU engine's fingerprint check caught any order difference as ErrMismatch
		}
		ref := w.launches(0)
		for r := 1; r < n; r++ {
			got := w.launches(r)
			if len(got) != len(ref) {
				t.Fatalf("rank %d issued %d collectives, rank 0 %d", r, len(got), len(ref))
			}
			for i := range ref {
				if got[i].Desc != ref[i].Desc {
					t.Fatalf("collective %d: rank %d issued %q, rank 0 %q", i, r, got[i].Desc, ref[i].Desc)
				}
			}
		}
		// The bucket allreduces of the last iteration follow the layout order.
		lay := layouts[0]
		var want []string
		for _, b := range lay {
			n := 0
			for _, p := range b {
				n += sizes[p]
			}
			want = append(want, fmt.Sprintf("AllReduce float32×%d sum", n))
		}
		var got []string
		for _, l := range ref[len(ref)-len(lay):] {
			got = append(got, l.Desc)
		}
		if !slices.Equal(got, want) {
			t.Errorf("last iteration launches %v, want bucket order %v", got, want)
		}
	})
}

// TestNoSyncThenSync: three accumulation steps under NoSync and one synced
// step give the same gradient as the reference (the sum over ranks and
// micro-steps divided by the world size), and NoSync issues no collective.
func TestNoSyncThenSync(t *testing.T) {
	const n, micro = 3, 4
	grad := func(rank, step, p int) float32 { return float32((rank+1)*(step+2) + p) }
	for _, view := range []bool{false, true} {
		t.Run(fmt.Sprintf("view=%v", view), func(t *testing.T) {
			eachWorld(t, n, func(t *testing.T, groups []Group, w *memWorld) {
				runRanks(t, groups, func(rank int, g Group) error {
					m := newModel(6, 3)
					red, err := New(bg, g, m.params, Config{GradientAsBucketView: view, FirstBucketBytes: 8})
					if err != nil {
						return err
					}
					acc := func(p int) []float32 {
						if view {
							return mustSlice[float32](red.GradBuffer(p))
						}
						return m.grads[p]
					}
					before := 0
					if w != nil {
						before = len(w.launches(rank))
					}
					for _, p := range []int{0, 1} {
						fill(acc(p), 0)
					}
					for step := range micro {
						last := step == micro-1
						backward := func() error {
							for _, p := range []int{1, 0} {
								s := acc(p)
								for i := range s {
									s[i] += grad(rank, step, p)
								}
								b := comm.HostBuffer(s)
								if err := red.GradReady(p, b); err != nil {
									return err
								}
							}
							return red.EndBackward(bg)
						}
						if last {
							err = backward()
						} else {
							err = red.NoSync(backward)
							if w != nil && len(w.launches(rank)) != before {
								return fmt.Errorf("NoSync step %d issued %d collectives", step, len(w.launches(rank))-before)
							}
						}
						if err != nil {
							return err
						}
					}
					for p := range 2 {
						want := 0.0
						for r := range n {
							for s := range micro {
								want += float64(grad(r, s, p))
							}
						}
						if err := checkAll(fmt.Sprintf("p%d", p), acc(p), want/n); err != nil {
							return err
						}
					}
					if s := red.Stats(); s.NoSyncCalls != 2*(micro-1) || s.Iterations != 1 {
						return fmt.Errorf("stats: %d no-sync calls, %d iterations", s.NoSyncCalls, s.Iterations)
					}
					return nil
				})
			})
		})
	}
}

// TestEmptyParameters: a parameter with no elements and a model with no
// parameters go through an iteration (zero-length buckets and all).
func TestEmptyParameters(t *testing.T) {
	eachWorld(t, 2, func(t *testing.T, groups []Group, _ *memWorld) {
		runRanks(t, groups, func(rank int, g Group) error {
			m := newModel(0, 3)
			red, err := New(bg, g, m.params, Config{})
			if err != nil {
				return err
			}
			for range 2 {
				if err := stepGrads(red, m, false, []int{1, 0}, func(int) float32 { return float32(2 * rank) }); err != nil {
					return err
				}
				if err := checkAll("p1", m.grads[1], 1); err != nil {
					return err
				}
			}
			none, err := New(bg, g, nil, Config{})
			if err != nil {
				return err
			}
			for range 2 {
				if err := none.EndBackward(bg); err != nil {
					return err
				}
			}
			return nil
		})
	})
}
