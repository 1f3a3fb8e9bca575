package reducer

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// TestUnusedParameters: with FindUnusedParameters, parameter 1 is unused
// on rank 0 only (declared, or never marked) and parameter 2 on every
// rank. Parameter 1's average (0 + rank 1's gradient)/2 reaches rank 0's
// gradient buffer; parameter 2's gradients are left untouched; Stats
// names 2 as unused.
func TestUnusedParameters(t *testing.T) {
	for _, mode := range []string{"declared", "never marked", "view"} {
		t.Run(mode, func(t *testing.T) {
			view := mode == "view"
			eachWorld(t, 2, func(t *testing.T, groups []Group, _ *memWorld) {
				runRanks(t, groups, func(rank int, g Group) error {
					m := newModel(3, 4, 5)
					red, err := New(bg, g, m.params, Config{FindUnusedParameters: true, GradientAsBucketView: view})
					if err != nil {
						return err
					}
					// Iteration 1: everything used.
					if err := stepGrads(red, m, view, []int{2, 1, 0}, func(p int) float32 { return float32(rank + 1) }); err != nil {
						return err
					}
					if err := checkAll("it1 p2", result(red, m, view, 2), 1.5); err != nil {
						return err
					}
					fill(result(red, m, view, 2), 42) // must survive iteration 2
					if mode == "declared" {
						unused := []int{2}
						if rank == 0 {
							unused = []int{1, 2}
						}
						if err := red.PrepareForBackward(unused...); err != nil {
							return err
						}
					}
					order := []int{1, 0}
					if rank == 0 {
						order = []int{0}
					}
					if err := stepGrads(red, m, view, order, func(p int) float32 { return float32(10*(rank+1) + p) }); err != nil {
						return err
					}
					if err := checkAll("it2 p0", result(red, m, view, 0), 15); err != nil {
						return err
					}
					if err := checkAll("it2 p1", result(red, m, view, 1), 21.0/2); err != nil {
						return err
					}
					if err := checkAll("it2 p2 (unused everywhere)", result(red, m, view, 2), 42); err != nil {
						return err
					}
					if s := red.Stats(); !reflect.DeepEqual(s.UnusedParams, []int{2}) || s.Rebuilt {
						return fmt.Errorf("stats: unused %v rebuilt %v", s.UnusedParams, s.Rebuilt)
					}
					return nil
				})
			})
		})
	}
}

// TestStaticGraph: parameter 0 is never used; the first iteration finds
// that, later iterations reduce without it and leave it untouched, and
// using it later fails with ErrStaticGraphChanged.
func TestStaticGraph(t *testing.T) {
	eachWorld(t, 2, func(t *testing.T, groups []Group, w *memWorld) {
		runRanks(t, groups, func(rank int, g Group) error {
			m := newModel(2, 3, 4)
			red, err := New(bg, g, m.params, Config{StaticGraph: true})
			if err != nil {
				return err
			}
			fill(m.grads[0], 42)
			var perIter []int
			for it := range 3 {
				before := 0
				if w != nil {
					before = len(w.launches(rank))
				}
				if err := stepGrads(red, m, false, []int{2, 1}, func(p int) float32 { return float32(rank + p) }); err != nil {
					return err
				}
				if w != nil {
					perIter = append(perIter, len(w.launches(rank))-before)
				}
				for p, want := range map[int]float64{0: 42, 1: 1.5, 2: 2.5} {
					if err := checkAll(fmt.Sprintf("it%d p%d", it, p), m.grads[p], want); err != nil {
						return err
					}
				}
			}
			// Iteration 1: one bucket + map + rebuild broadcast; later: one bucket.
			if w != nil && !reflect.DeepEqual(perIter, []int{3, 1, 1}) {
				return fmt.Errorf("collectives per iteration %v, want [3 1 1]", perIter)
			}
			if s := red.Stats(); s.RebuiltOrderString() != "2,1,0" || !reflect.DeepEqual(s.UnusedParams, []int{0}) {
				return fmt.Errorf("stats: rebuilt %q unused %v", s.RebuiltOrderString(), s.UnusedParams)
			}
			err = red.GradReady(0, comm.HostBuffer(m.grads[0]))
			if !errors.Is(err, ErrStaticGraphChanged) {
				return fmt.Errorf("using parameter 0: %v, want ErrStaticGraphChanged", err)
			}
			return nil
		})
	})
}

// TestCommHooks: a custom hook sees buckets in index order each
// iteration; the built-in hooks average like the default path.
func TestCommHooks(t *testing.T) {
	t.Run("custom", func(t *testing.T) {
		eachWorld(t, 2, func(t *testing.T, groups []Group, _ *memWorld) {
			runRanks(t, groups, func(rank int, g Group) error {
				m := newModel(10, 10, 10)
				red, err := New(bg, g, m.params, Config{FirstBucketBytes: 40, BucketCapBytes: 40})
				if err != nil {
					return err
				}
				var seen []int
				var divs []int
				hook := FuncHook{HookName: "recording", Fn: func(ctx context.Context, g Group, b *GradBucket) HookWork {
					seen = append(seen, b.Index)
					divs = append(divs, b.DivFactor)
					if got := b.Buffer.Len(); got != 10 || len(b.Params) != 1 || b.IsLast != (b.Index == 2) {
						return comm.FailedWork(comm.OpAllReduce, fmt.Errorf("bucket %d: %d elements, params %v, last %v", b.Index, got, b.Params, b.IsLast))
					}
					return AllReduceHook().Run(ctx, g, b)
				}}
				if err := red.RegisterCommHook(hook); err != nil {
					return err
				}
				for it := range 2 {
					if err := stepGrads(red, m, false, []int{0, 1, 2}, func(p int) float32 { return float32(4 * (rank + 1)) }); err != nil {
						return err
					}
					for p := range 3 {
						if err := checkAll(fmt.Sprintf("it%d p%d", it, p), m.grads[p], 6); err != nil {
							return err
						}
					}
				}
				if want := []int{0, 1, 2, 0, 1, 2}; !reflect.DeepEqual(seen, want) || !slices.Equal(divs, []int{2, 2, 2, 2, 2, 2}) {
					return fmt.Errorf("hook saw buckets %v divs %v, want %v", seen, divs, want)
				}
				if s := red.Stats(); s.CommHook != "recording" {
					return fmt.Errorf("stats hook %q", s.CommHook)
				}
				return nil
			})
		})
	})
	for _, hook := range []func() CommHook{AllReduceHook, FP16CompressHook, BF16CompressHook} {
		t.Run(hook().Name(), func(t *testing.T) {
			eachWorld(t, 4, func(t *testing.T, groups []Group, _ *memWorld) {
				runRanks(t, groups, func(rank int, g Group) error {
					m := newModel(3, 100)
					red, err := New(bg, g, m.params, Config{})
					if err != nil {
						return err
					}
					if err := red.RegisterCommHook(hook()); err != nil {
						return err
					}
					if err := stepGrads(red, m, false, []int{1, 0}, func(p int) float32 { return float32(rank + 1) }); err != nil {
						return err
					}
					for p := range 2 {
						if err := checkAll(fmt.Sprintf("p%d", p), m.grads[p], 2.5); err != nil {
							return err
						}
					}
					return nil
				})
			})
		})
	}
}

// TestJoinUnevenInputs: rank r has r iterations of data (rank 0 none).
// Joined ranks shadow the rest, including the rebuild broadcast (rank 0
// is its root while joined). Averages divide by the world size, or by the
// active ranks with DivideByActiveRanks; afterwards every rank holds the
// last joiner's parameters.
func TestJoinUnevenInputs(t *testing.T) {
	const n = 3
	for _, byActive := range []bool{false, true} {
		for _, hooked := range []bool{false, true} {
			t.Run(fmt.Sprintf("byActive=%v/hook=%v", byActive, hooked), func(t *testing.T) {
				eachWorld(t, n, func(t *testing.T, groups []Group, _ *memWorld) {
					runRanks(t, groups, func(rank int, g Group) error {
						m := newModel(10, 10)
						fill(m.data[0], float32(rank)) // New makes it rank 0's
						// The hooked variant also searches unused parameters, so the
						// joined ranks shadow the local-used map too (and nobody rebuilds).
						red, err := New(bg, g, m.params, Config{UnevenInputs: true, DivideByActiveRanks: byActive, FindUnusedParameters: hooked, FirstBucketBytes: 40, BucketCapBytes: 40})
						if err != nil {
							return err
						}
						if hooked {
							if err := red.RegisterCommHook(AllReduceHook()); err != nil {
								return err
							}
						}
						for it := range rank {
							if err := stepGrads(red, m, false, []int{1, 0}, func(p int) float32 { return float32(rank + 1) }); err != nil {
								return err
							}
							// Active at iteration it: ranks it+1 .. n-1.
							sum, active := 0.0, 0.0
							for r := it + 1; r < n; r++ {
								sum += float64(r + 1)
								active++
							}
							want := sum / n
							if byActive {
								want = sum / active
							}
							if err := checkAll(fmt.Sprintf("it%d grad", it), m.grads[0], want); err != nil {
								return err
							}
							for i := range m.data[0] { // an SGD step that differs per rank
								m.data[0][i] -= m.grads[0][i] + float32(rank)
							}
						}
						if err := red.Join(bg); err != nil {
							return err
						}
						// The last joiner is rank 2: 2 steps from 0 with grads g0, g1.
						g0, g1 := 5.0/3, 1.0
						if byActive {
							g0, g1 = 2.5, 3
						}
						if err := checkAll("final w", m.data[0], 0-(g0+2)-(g1+2)); err != nil {
							return err
						}
						if err := red.GradReady(0, comm.HostBuffer(m.grads[0])); !errors.Is(err, ErrBadState) {
							return fmt.Errorf("GradReady after Join: %v", err)
						}
						if s := red.Stats(); s.Rebuilt == hooked {
							return fmt.Errorf("rank %d: rebuilt %v with FindUnusedParameters %v", rank, s.Rebuilt, hooked)
						}
						return nil
					})
				})
			})
		}
	}
}

// delayGroup wraps a Group and injects execution time into every
// AllReduce, like a slower engine stream: op k completes delay after both
// its real completion and op k−1's delayed completion. It records launch
// times.
type delayGroup struct {
	Group
	mu       sync.Mutex
	delay    time.Duration
	last     chan struct{}
	launched []time.Time
}

func (d *delayGroup) setDelay(v time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.delay = v
}

func (d *delayGroup) launches() []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.launched)
}

func (d *delayGroup) AllReduce(ctx context.Context, buf comm.Buffer, op comm.ReduceOp, opts ...comm.OpOption) *comm.Work {
	inner := d.Group.AllReduce(ctx, buf, op, opts...)
	d.mu.Lock()
	d.launched = append(d.launched, time.Now())
	prev, done, delay := d.last, make(chan struct{}), d.delay
	d.last = done
	d.mu.Unlock()
	p := comm.NewPromise(comm.OpAllReduce)
	go func() {
		err := inner.Wait(context.Background())
		if prev != nil {
			<-prev
		}
		time.Sleep(delay)
		p.Complete(err)
		close(done)
	}()
	return p.Work()
}

// TestOverlapHidesComm: with 200 ms of compute between gradients and an
// injected 150 ms per allreduce, each bucket's allreduce runs during the
// next gradient's compute, so EndBackward waits only for the last one
// (~150 ms, bound 375 ms), not all four (~600 ms). Bounds are generous for
// a loaded machine.
func TestOverlapHidesComm(t *testing.T) {
	const (
		compute = 200 * time.Millisecond
		comm1   = 150 * time.Millisecond
	)
	eachWorld(t, 2, func(t *testing.T, groups []Group, _ *memWorld) {
		dgs := make([]*delayGroup, len(groups))
		for r, g := range groups {
			dgs[r] = &delayGroup{Group: g}
			groups[r] = dgs[r]
		}
		waits := make([]time.Duration, 2)
		readyAt := make([][]time.Time, 2)
		runRanks(t, groups, func(rank int, g Group) error {
			m := newModel(100, 100, 100, 100)
			red, err := New(bg, g, m.params, Config{FirstBucketBytes: 400, BucketCapBytes: 400})
			if err != nil {
				return err
			}
			// A first iteration without delay does the one-time rebuild.
			if err := stepGrads(red, m, false, []int{3, 2, 1, 0}, func(int) float32 { return 1 }); err != nil {
				return err
			}
			dgs[rank].setDelay(comm1)
			for _, p := range []int{3, 2, 1, 0} {
				time.Sleep(compute)
				fill(m.grads[p], float32(rank))
				readyAt[rank] = append(readyAt[rank], time.Now())
				if err := red.GradReady(p, comm.HostBuffer(m.grads[p])); err != nil {
					return err
				}
			}
			start := time.Now()
			if err := red.EndBackward(bg); err != nil {
				return err
			}
			waits[rank] = time.Since(start)
			if s := red.Stats(); s.AvgOverlapTime <= 0 {
				return fmt.Errorf("stats show no overlap: %+v", s)
			}
			return checkAll("grad", m.grads[0], 0.5)
		})
		for r, d := range waits {
			if d > 5*comm1/2 {
				t.Errorf("rank %d: EndBackward waited %v; with overlap it waits for the last bucket only (~%v, all four take ~%v)", r, d, comm1, 4*comm1)
			}
		}
		// Bucket k's allreduce was issued before gradient k+1 was ready:
		// it ran during backward.
		for r := range 2 {
			logs := dgs[r].launches()
			buckets := logs[len(logs)-4:]
			for k := 0; k < 3; k++ {
				if !buckets[k].Before(readyAt[r][k+1]) {
					t.Errorf("rank %d: bucket %d launched at %v, after gradient %d was ready at %v", r, k, buckets[k], k+1, readyAt[r][k+1])
				}
			}
		}
	})
}

// TestCommFailure: a failed bucket allreduce surfaces from EndBackward as
// a *BucketError unwrapping to the engine error, and the reducer refuses
// further work.
func TestCommFailure(t *testing.T) {
	groups, w := newTestGroups(t, 2)
	w2 := w
	runRanks(t, groups, func(rank int, g Group) error {
		m := newModel(4, 4)
		red, err := New(bg, g, m.params, Config{FirstBucketBytes: 16, BucketCapBytes: 16})
		if err != nil {
			return err
		}
		if err := red.PrepareForBackward(); err != nil {
			return err
		}
		if rank == 0 {
			w2.failNext(2) // the second bucket
		}
		if err := red.GradReady(1, comm.HostBuffer(m.grads[1])); err != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond)
		if err := red.GradReady(0, comm.HostBuffer(m.grads[0])); err != nil {
			return err
		}
		err = red.EndBackward(bg)
		var be *BucketError
		if !errors.As(err, &be) || be.Bucket != 1 || be.Rank != rank || !errors.Is(err, comm.ErrEngine) {
			return fmt.Errorf("EndBackward: %v, want a *BucketError for bucket 1 wrapping ErrEngine", err)
		}
		if err := red.GradReady(0, comm.HostBuffer(m.grads[0])); !errors.Is(err, ErrBadState) {
			return fmt.Errorf("GradReady after failure: %v", err)
		}
		return nil
	})
}

// TestNewBroadcastsRank0State: parameters and registered buffers start
// different per rank and equal rank 0's after New, across several
// coalesced broadcast chunks and dtypes.
func TestNewBroadcastsRank0State(t *testing.T) {
	eachWorld(t, 3, func(t *testing.T, groups []Group, _ *memWorld) {
		runRanks(t, groups, func(rank int, g Group) error {
			m := newModel(3, 5, 7, 2)
			d64 := make([]float64, 4)
			buf := make([]float32, 6)
			for p := range m.data {
				fill(m.data[p], float32(rank*10+p))
			}
			for i := range d64 {
				d64[i] = float64(rank + i)
			}
			fill(buf, float32(rank+7))
			params := append(m.params, Param{Name: "w64", Data: comm.HostBuffer(d64), Shape: []int{2, 2}})
			red, err := New(bg, g, params, Config{BroadcastBuffers: []comm.Buffer{comm.HostBuffer(buf)}, BroadcastChunkBytes: 32})
			if err != nil {
				return err
			}
			if err := checkAll("buffer after New", buf, 7); err != nil {
				return err
			}
			fill(buf, float32(rank+100)) // e.g. batch-norm statistics drift per rank
			if err := red.SyncBuffers(bg); err != nil {
				return err
			}
			for p := range m.data {
				if err := checkAll(fmt.Sprintf("p%d", p), m.data[p], float64(p)); err != nil {
					return err
				}
			}
			if !reflect.DeepEqual(d64, []float64{0, 1, 2, 3}) {
				return fmt.Errorf("float64 param %v", d64)
			}
			return checkAll("buffer after SyncBuffers", buf, 100)
		})
	})
}

// TestStaleViewsAfterRebuild: a caller that fetched its GradBuffer views
// once, before the rebuild moved the buckets, keeps working: its stale
// views are treated as plain gradient buffers (copied in, results copied
// back), and fresh views hold the same results.
func TestStaleViewsAfterRebuild(t *testing.T) {
	eachWorld(t, 2, func(t *testing.T, groups []Group, _ *memWorld) {
		runRanks(t, groups, func(rank int, g Group) error {
			m := newModel(5, 6, 7)
			red, err := New(bg, g, m.params, Config{GradientAsBucketView: true, FirstBucketBytes: 20, BucketCapBytes: 20})
			if err != nil {
				return err
			}
			stale := make([][]float32, 3)
			for p := range stale {
				stale[p] = mustSlice[float32](red.GradBuffer(p))
			}
			for it := range 3 {
				for _, p := range []int{0, 1, 2} { // forward order: the rebuild reorders the buckets
					fill(stale[p], float32(rank*10+p+it))
					if err := red.GradReady(p, comm.HostBuffer(stale[p])); err != nil {
						return err
					}
				}
				if err := red.EndBackward(bg); err != nil {
					return err
				}
				for p := range stale {
					want := float64(5 + p + it)
					if err := checkAll(fmt.Sprintf("it%d stale view p%d", it, p), stale[p], want); err != nil {
						return err
					}
					if err := checkAll(fmt.Sprintf("it%d fresh view p%d", it, p), mustSlice[float32](red.GradBuffer(p)), want); err != nil {
						return err
					}
				}
			}
			if s := red.Stats(); s.RebuiltOrderString() != "0,1,2" {
				return fmt.Errorf("rebuilt order %q", s.RebuiltOrderString())
			}
			return nil
		})
	})
}
