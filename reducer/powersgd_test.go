package reducer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

// newShapedModel is newModel with parameter shapes.
func newShapedModel(shapes ...[]int) *model {
	m := &model{}
	for i, sh := range shapes {
		n := 1
		for _, d := range sh {
			n *= d
		}
		d, g := make([]float32, n), make([]float32, n)
		m.data = append(m.data, d)
		m.grads = append(m.grads, g)
		m.params = append(m.params, Param{Name: fmt.Sprintf("p%d", i), Data: comm.HostBuffer(d), Shape: sh})
	}
	return m
}

// lowRankGrad fills g (n×m row-major) with U·V_rᵀ: U (n×k) is shared by
// every rank and iteration, V depends on rank and iteration, so the sum
// over ranks has rank ≤ k.
func lowRankGrad(g []float32, n, m, k, rank, it int) {
	u := rand.New(rand.NewPCG(99, 1))
	U := make([]float64, n*k)
	for i := range U {
		U[i] = u.NormFloat64()
	}
	v := rand.New(rand.NewPCG(uint64(rank), uint64(it)))
	V := make([]float64, m*k)
	for i := range V {
		V[i] = v.NormFloat64()
	}
	for i := range n {
		for j := range m {
			s := 0.0
			for c := range k {
				s += U[i*k+c] * V[j*k+c]
			}
			g[i*m+j] = float32(s)
		}
	}
}

// denseGrad fills g with values that depend on rank, iteration and index.
func denseGrad(g []float32, salt, rank, it int) {
	for i := range g {
		g[i] = float32(math.Sin(float64(7*rank+13*it+salt) + 0.37*float64(i)))
	}
}

func checkClose(what string, got, want []float32, tol float64) error {
	for i := range got {
		if d := math.Abs(float64(got[i] - want[i])); d > tol*(1+math.Abs(float64(want[i]))) || math.IsNaN(float64(got[i])) {
			return fmt.Errorf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
	return nil
}

// TestPowerSGDExactForLowRank: 3 ranks, a 20×12 weight whose gradients
// share a rank-2 column space (so their average has rank ≤ 2), a bias and
// a 6×6 weight too small to pass the compression-rate test. With rank 2,
// error feedback and warm start, every iteration (2 plain, then
// compressed) yields the exact average of the ranks' gradients to float32
// accuracy, the results are bit-identical on every rank, the compressed
// iterations send fewer elements than the plain ones, and the state
// counts iterations and compression. The batched hook is exact on a
// rank-1 bucket, padded or not.
func TestPowerSGDExactForLowRank(t *testing.T) {
	const n, iters = 3, 5
	eachWorld(t, n, func(t *testing.T, groups []Group, w *memWorld) {
		var mu sync.Mutex
		final := make([][][]float32, n)
		runRanks(t, groups, func(rank int, g Group) error {
			m := newShapedModel([]int{20, 12}, []int{12}, []int{6, 6})
			red, err := New(bg, g, m.params, Config{})
			if err != nil {
				return err
			}
			cfg := DefaultPowerSGDConfig()
			cfg.MatrixApproximationRank, cfg.StartPowerSGDIter, cfg.RandomSeed = 2, 2, 7
			st, err := NewPowerSGDState(cfg)
			if err != nil {
				return err
			}
			if err := red.RegisterCommHook(PowerSGDHook(st)); err != nil {
				return err
			}
			var sent []int
			for it := range iters {
				// Every rank computes every rank's gradients for the expected average.
				want := [][]float32{make([]float32, 240), make([]float32, 12), make([]float32, 36)}
				for r := range n {
					tmp := [][]float32{make([]float32, 240), make([]float32, 12), make([]float32, 36)}
					lowRankGrad(tmp[0], 20, 12, 2, r, it)
					denseGrad(tmp[1], 1, r, it)
					denseGrad(tmp[2], 2, r, it)
					for p := range tmp {
						for i, v := range tmp[p] {
							want[p][i] += v / n
						}
					}
				}
				lowRankGrad(m.grads[0], 20, 12, 2, rank, it)
				denseGrad(m.grads[1], 1, rank, it)
				denseGrad(m.grads[2], 2, rank, it)
				before := 0
				if w != nil {
					before = len(w.launches(rank))
				}
				for _, p := range []int{2, 1, 0} {
					if err := red.GradReady(p, comm.HostBuffer(m.grads[p])); err != nil {
						return err
					}
				}
				if err := red.EndBackward(bg); err != nil {
					return err
				}
				for p := range want {
					if err := checkClose(fmt.Sprintf("iteration %d p%d", it, p), m.grads[p], want[p], 2e-4); err != nil {
						return err
					}
				}
				if w != nil {
					elems := 0
					for _, l := range w.launches(rank)[before:] {
						var c int
						if _, err := fmt.Sscanf(l.Desc[strings.Index(l.Desc, "×")+len("×"):], "%d", &c); err == nil && strings.HasPrefix(l.Desc, "AllReduce float32") {
							elems += c
						}
					}
					sent = append(sent, elems)
				}
			}
			if w != nil {
				// Plain: 240+12+36 = 288 elements. Compressed: P 20·2 + Q 12·2
				// for the weight, 12+36 uncompressed = 112.
				if sent[0] != 288 || sent[1] != 288 || sent[2] != 112 || sent[4] != 112 {
					return fmt.Errorf("float32 elements allreduced per iteration %v, want [288 288 112 112 112]", sent)
				}
			}
			if got := st.Iter(); got != iters {
				return fmt.Errorf("state Iter %d, want %d", got, iters)
			}
			rate, b, a := st.CompressionStats()
			if b != 3*288 || a != 3*112 || math.Abs(rate-288.0/112) > 1e-12 {
				return fmt.Errorf("compression stats %v %d %d, want %v %d %d", rate, b, a, 288.0/112, 3*288, 3*112)
			}
			mu.Lock()
			final[rank] = m.grads
			mu.Unlock()
			return nil
		})
		for r := 1; r < n; r++ {
			for p := range final[0] {
				for i, v := range final[0][p] {
					if final[r][p][i] != v {
						t.Fatalf("rank %d p%d[%d] = %v, rank 0 has %v: results differ across ranks", r, p, i, final[r][p][i], v)
					}
				}
			}
		}
	})
	t.Run("batched", func(t *testing.T) {
		for _, numel := range []int{36, 30} { // a 6×6 matrix, and one padded with 6 zeros
			t.Run(fmt.Sprint(numel), func(t *testing.T) {
				eachWorld(t, n, func(t *testing.T, groups []Group, _ *memWorld) {
					runRanks(t, groups, func(rank int, g Group) error {
						m := newModel(numel)
						red, st, err := powerSGDReducer(g, m.params, BatchedPowerSGDHook)
						if err != nil {
							return err
						}
						full := make([]float32, 36)
						for it := range 4 {
							want := make([]float32, numel)
							for r := range n {
								lowRankGrad(full, 6, 6, 1, r, it)
								for i := range want {
									want[i] += full[i] / n
								}
							}
							lowRankGrad(full, 6, 6, 1, rank, it)
							copy(m.grads[0], full)
							if err := red.GradReady(0, comm.HostBuffer(m.grads[0])); err != nil {
								return err
							}
							if err := red.EndBackward(bg); err != nil {
								return err
							}
							if err := checkClose(fmt.Sprintf("iteration %d", it), m.grads[0], want, 2e-4); err != nil {
								return err
							}
						}
						if rate, _, _ := st.CompressionStats(); rate != float64(2*numel)/24 {
							return fmt.Errorf("batched compression rate %v, want %v (2 iterations of %d elements as 2×6)", rate, float64(2*numel)/24, numel)
						}
						return nil
					})
				})
			})
		}
	})
}

// TestPowerSGDErrorFeedback: one rank, a dense 8×8 gradient G each
// iteration, rank 1. Compression is lossy, and with error feedback the
// residual is carried: the outputs of the compressed iterations plus the
// final stored error sum to the inputs (Σ R_k + e = K·G). Without error
// feedback no error is kept; with warm start Q is kept between
// iterations and the approximation of a fixed G improves (power
// iteration), without it Q is dropped after each iteration. The batched
// hook keeps its error over the zero-padded square (60 elements in an
// 8×8 matrix) with the same telescoping sum over the bucket.
func TestPowerSGDErrorFeedback(t *testing.T) {
	const iters, start = 6, 2
	G := make([]float32, 64)
	denseGrad(G, 5, 0, 0)
	for _, mode := range []struct{ ef, ws, batched bool }{{true, true, false}, {false, true, false}, {true, false, false}, {true, true, true}} {
		t.Run(fmt.Sprintf("ef=%v/ws=%v/batched=%v", mode.ef, mode.ws, mode.batched), func(t *testing.T) {
			groups, _ := newTestGroups(t, 1)
			runRanks(t, groups, func(rank int, g Group) error {
				m := newShapedModel([]int{8, 8})
				if mode.batched {
					m = newShapedModel([]int{60})
				}
				red, err := New(bg, g, m.params, Config{})
				if err != nil {
					return err
				}
				cfg := PowerSGDConfig{MatrixApproximationRank: 1, StartPowerSGDIter: start, MinCompressionRate: 1, UseErrorFeedback: mode.ef, WarmStart: mode.ws, RandomSeed: 3}
				st, err := NewPowerSGDState(cfg)
				if err != nil {
					return err
				}
				hook := PowerSGDHook(st)
				if mode.batched {
					hook = BatchedPowerSGDHook(st)
				}
				if err := red.RegisterCommHook(hook); err != nil {
					return err
				}
				sum := make([]float64, len(m.grads[0]))
				var resid []float64
				for it := range iters {
					copy(m.grads[0], G[:len(m.grads[0])])
					if err := red.GradReady(0, comm.HostBuffer(m.grads[0])); err != nil {
						return err
					}
					if err := red.EndBackward(bg); err != nil {
						return err
					}
					if it < start {
						if err := checkClose(fmt.Sprintf("plain iteration %d", it), m.grads[0], G[:len(m.grads[0])], 0); err != nil {
							return err
						}
						if len(st.buckets) != 0 {
							return fmt.Errorf("iteration %d: PowerSGD state created before StartPowerSGDIter", it)
						}
						continue
					}
					r := 0.0
					for i, v := range m.grads[0] {
						sum[i] += float64(v)
						r += (float64(v) - float64(G[i])) * (float64(v) - float64(G[i]))
					}
					resid = append(resid, math.Sqrt(r))
				}
				if resid[0] < 0.1 {
					return fmt.Errorf("rank-1 compression of a dense 8×8 matrix left residual %v: not compressed", resid[0])
				}
				bs := st.buckets[0]
				if bs == nil {
					return fmt.Errorf("no state for bucket 0")
				}
				if !mode.ef {
					if bs.errBuf != nil {
						return fmt.Errorf("error kept without error feedback")
					}
				} else {
					e := bs.errBuf.([]float32)
					if len(e) != 64 {
						return fmt.Errorf("error of %d elements, want 64 (the 8×8 matrix)", len(e))
					}
					for i := range sum {
						if d := sum[i] + float64(e[i]) - (iters-start)*float64(G[i]); math.Abs(d) > 1e-4 {
							return fmt.Errorf("[%d]: Σ outputs + error = %v, Σ inputs = %v", i, sum[i]+float64(e[i]), (iters-start)*float64(G[i]))
						}
					}
				}
				if mode.ws != (bs.q != nil) {
					return fmt.Errorf("warm start %v but Q kept: %v", mode.ws, bs.q != nil)
				}
				if mode.ws && !mode.ef && !(resid[len(resid)-1] < resid[0]) {
					return fmt.Errorf("warm start did not improve the approximation of a fixed matrix: residuals %v", resid)
				}
				return nil
			})
		})
	}
}

// TestPowerSGDDTypesAndErrors: float64, float16 and bfloat16 buckets are
// compressed exactly (to the dtype's precision) for a rank-1 average;
// bad configurations, a hook without state and a bucket without a
// divisor fail with typed errors on every rank.
func TestPowerSGDDTypesAndErrors(t *testing.T) {
	for _, tc := range []struct {
		dt  comm.DType
		tol float64
	}{{comm.Float64, 1e-9}, {comm.Float16, 2e-3}, {comm.BFloat16, 1e-2}} {
		t.Run(tc.dt.String(), func(t *testing.T) {
			eachWorld(t, 2, func(t *testing.T, groups []Group, _ *memWorld) {
				runRanks(t, groups, func(rank int, g Group) error {
					data, grad := comm.NewHostBuffer(tc.dt, 80), comm.NewHostBuffer(tc.dt, 80)
					red, st, err := powerSGDReducer(g, []Param{{Name: "w", Data: data, Shape: []int{10, 8}}}, PowerSGDHook)
					if err != nil {
						return err
					}
					for it := range 4 {
						// u·v_rᵀ with u shared: the average is rank 1.
						want := make([]float64, 80)
						for i := range 10 {
							for j := range 8 {
								for r := range 2 {
									want[i*8+j] += float64(i+1) * float64((r+1)*(j+it+1)) / 2
								}
								writeElem(grad, i*8+j, float64(i+1)*float64((rank+1)*(j+it+1)))
							}
						}
						if err := red.GradReady(0, grad); err != nil {
							return err
						}
						if err := red.EndBackward(bg); err != nil {
							return err
						}
						for i := range want {
							if got := readElem(grad, i); math.Abs(got-want[i]) > tc.tol*(1+math.Abs(want[i])) {
								return fmt.Errorf("iteration %d [%d] = %v, want %v", it, i, got, want[i])
							}
						}
					}
					if rate, _, _ := st.CompressionStats(); rate != 80.0/18 {
						return fmt.Errorf("compression rate %v, want 80/18", rate)
					}
					return nil
				})
			})
		})
	}
	t.Run("config", func(t *testing.T) {
		base := DefaultPowerSGDConfig()
		base.StartPowerSGDIter = 10
		for name, mut := range map[string]func(*PowerSGDConfig){
			"rank 0":               func(c *PowerSGDConfig) { c.MatrixApproximationRank = 0 },
			"start 1 with EF":      func(c *PowerSGDConfig) { c.StartPowerSGDIter = 1; c.WarmStart = false },
			"start 0 with WS":      func(c *PowerSGDConfig) { c.StartPowerSGDIter = 0; c.UseErrorFeedback = false },
			"negative start":       func(c *PowerSGDConfig) { c.StartPowerSGDIter = -1; c.UseErrorFeedback, c.WarmStart = false, false },
			"NaN rate":             func(c *PowerSGDConfig) { c.MinCompressionRate = math.NaN() },
			"negative epsilon":     func(c *PowerSGDConfig) { c.OrthogonalizationEpsilon = -1e-8 },
			"infinite compression": func(c *PowerSGDConfig) { c.MinCompressionRate = math.Inf(1) },
		} {
			c := base
			mut(&c)
			if _, err := NewPowerSGDState(c); !errors.Is(err, comm.ErrInvalidArgument) {
				t.Errorf("%s: NewPowerSGDState: %v, want ErrInvalidArgument", name, err)
			}
		}
		c := base
		c.StartPowerSGDIter, c.UseErrorFeedback, c.WarmStart = 0, false, false
		if _, err := NewPowerSGDState(c); err != nil {
			t.Errorf("start 0 without EF and warm start: %v", err)
		}
	})
	for _, tc := range []struct {
		name string
		hook func() CommHook
		dt   comm.DType
		want error
	}{
		{"no state", func() CommHook { return PowerSGDHook(nil) }, comm.Float32, comm.ErrInvalidArgument},
		{"DivFactor 0", func() CommHook {
			c := DefaultPowerSGDConfig()
			c.StartPowerSGDIter, c.UseErrorFeedback, c.WarmStart = 0, false, false
			s, _ := NewPowerSGDState(c)
			h := PowerSGDHook(s)
			return FuncHook{HookName: "bad", Fn: func(ctx context.Context, g Group, b *GradBucket) HookWork {
				b.DivFactor = 0
				return h.Run(ctx, g, b)
			}}
		}, comm.Float32, comm.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			groups, _ := newTestGroups(t, 2)
			runRanks(t, groups, func(rank int, g Group) error {
				p := Param{Name: "w", Data: comm.NewHostBuffer(tc.dt, 16), Shape: []int{4, 4}}
				red, err := New(bg, g, []Param{p}, Config{})
				if err != nil {
					return err
				}
				if err := red.RegisterCommHook(tc.hook()); err != nil {
					return err
				}
				if err := red.GradReady(0, comm.Buffer{}); err != nil {
					return err
				}
				var be *BucketError
				if err := red.EndBackward(bg); !errors.As(err, &be) || !errors.Is(err, tc.want) {
					return fmt.Errorf("EndBackward: %v, want a *BucketError wrapping %v", err, tc.want)
				}
				return nil
			})
		})
	}
}

// TestPowerSGDWithDelayAndJoin: the PowerSGD hook under
// Config.DelayAllReduce gives bit-identical results to the overlapped
// path (the same collectives, launched later); under Join with uneven
// inputs (rank r has 2+2r iterations) the joined ranks shadow the hook's
// collectives, every rank's state counts the same 6 iterations, and
// nothing mismatches or hangs.
func TestPowerSGDWithDelayAndJoin(t *testing.T) {
	const n = 3
	newHook := func() (*PowerSGDState, CommHook, error) {
		c := DefaultPowerSGDConfig()
		c.MatrixApproximationRank, c.StartPowerSGDIter = 1, 2
		s, err := NewPowerSGDState(c)
		return s, PowerSGDHook(s), err
	}
	t.Run("delay", func(t *testing.T) {
		eachWorld(t, n, func(t *testing.T, groups []Group, _ *memWorld) {
			runRanks(t, groups, func(rank int, g Group) error {
				var res [2][]float32
				for di, delay := range []bool{false, true} {
					m := newShapedModel([]int{16, 10}, []int{10}, []int{12, 12})
					red, err := New(bg, g, m.params, Config{DelayAllReduce: delay, FirstBucketBytes: 600, BucketCapBytes: 600})
					if err != nil {
						return err
					}
					_, h, err := newHook()
					if err != nil {
						return err
					}
					if err := red.RegisterCommHook(h); err != nil {
						return err
					}
					for it := range 5 {
						for p := range m.grads {
							denseGrad(m.grads[p], p, rank, it)
						}
						if err := stepAsIs(red, m, []int{2, 1, 0}); err != nil {
							return err
						}
					}
					for p := range m.grads {
						res[di] = append(res[di], m.grads[p]...)
					}
				}
				for i := range res[0] {
					if res[0][i] != res[1][i] {
						return fmt.Errorf("[%d]: overlapped %v, delayed %v", i, res[0][i], res[1][i])
					}
				}
				return nil
			})
		})
	})
	t.Run("join", func(t *testing.T) {
		eachWorld(t, n, func(t *testing.T, groups []Group, _ *memWorld) {
			runRanks(t, groups, func(rank int, g Group) error {
				m := newShapedModel([]int{16, 10}, []int{10})
				red, err := New(bg, g, m.params, Config{UnevenInputs: true})
				if err != nil {
					return err
				}
				st, h, err := newHook()
				if err != nil {
					return err
				}
				if err := red.RegisterCommHook(h); err != nil {
					return err
				}
				for it := range 2 + 2*rank {
					for p := range m.grads {
						denseGrad(m.grads[p], p, rank, it)
					}
					if err := stepAsIs(red, m, []int{1, 0}); err != nil {
						return err
					}
					for p := range m.data {
						for i := range m.data[p] {
							m.data[p][i] -= 0.1 * m.grads[p][i]
						}
					}
				}
				if err := red.Join(bg); err != nil {
					return err
				}
				if got := st.Iter(); got != 6 {
					return fmt.Errorf("PowerSGD state counted %d iterations, want 6 (the longest rank's)", got)
				}
				return nil
			})
		})
	})
}

// stepAsIs runs one synced iteration with the gradients already in m.grads.
func stepAsIs(red *Reducer, m *model, order []int) error {
	for _, p := range order {
		if err := red.GradReady(p, comm.HostBuffer(m.grads[p])); err != nil {
			return err
		}
	}
	return red.EndBackward(bg)
}

// powerSGDReducer is a Reducer over params with hook (PowerSGDHook or
// BatchedPowerSGDHook) registered on a default PowerSGD state, returned
// too, that compresses from iteration 2 on.
func powerSGDReducer(g Group, params []Param, hook func(*PowerSGDState) CommHook) (*Reducer, *PowerSGDState, error) {
	red, err := New(context.Background(), g, params, Config{})
	if err != nil {
		return nil, nil, err
	}
	cfg := DefaultPowerSGDConfig()
	cfg.StartPowerSGDIter = 2
	st, err := NewPowerSGDState(cfg)
	if err != nil {
		return nil, nil, err
	}
	if err := red.RegisterCommHook(hook(st)); err != nil {
		return nil, nil, err
	}
	return red, st, nil
}
