package reducer

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

// wantErr checks that err unwraps to sentinel, is a *Error for rank, and
// that its text contains every fragment.
func wantErr(err, sentinel error, rank int, fragments ...string) error {
	if !errors.Is(err, sentinel) {
		return fmt.Errorf("error %v does not unwrap to %v", err, sentinel)
	}
	var e *Error
	if !errors.As(err, &e) || e.Rank != rank {
		return fmt.Errorf("error %v is not a *Error for rank %d", err, rank)
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			return fmt.Errorf("error %q lacks %q", err, f)
		}
	}
	return nil
}

// TestModelMismatch: New fails on every rank, with DDP's wording, when
// ranks differ in parameter count, shape or dtype.
func TestModelMismatch(t *testing.T) {
	cases := []struct {
		name  string
		build func(rank int) []Param
		want  []string
	}{
		{"count", func(rank int) []Param { return newModel(append([]int{4, 4}, make([]int, rank)...)...).params },
			[]string{"DDP expects same model across all ranks", "rank 1 has 3 params, while rank 0 has inconsistent 2 params"}},
		{"shape", func(rank int) []Param {
			m := newModel(4, 6)
			m.params[1].Shape = []int{2 + rank, 6 / (2 + rank)}
			return m.params
		}, []string{"params[1] on rank 1 with sizes float32 [3 2] appears not to match sizes of the same param on rank 0 (float32 [2 3])", "parameter 1 (p1)"}},
		{"dtype", func(rank int) []Param {
			if rank == 0 {
				return newModel(4).params
			}
			return []Param{{Name: "p0", Data: comm.HostBuffer(make([]float64, 4))}}
		}, []string{"appears not to match", "float64 [4]"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eachWorld(t, 2, func(t *testing.T, groups []Group, _ *memWorld) {
				runRanks(t, groups, func(rank int, g Group) error {
					_, err := New(bg, g, tc.build(rank), Config{})
					return wantErr(err, ErrModelMismatch, rank, tc.want...)
				})
			})
		})
	}
}

// TestProtocolErrors covers every error a training loop can provoke, on
// one rank (none of them issues a collective).
func TestProtocolErrors(t *testing.T) {
	newRed := func(t *testing.T, cfg Config) (*Reducer, *model) {
		t.Helper()
		groups, _ := newTestGroups(t, 1)
		m := newModel(2, 3, 4)
		m.params[1].Name = "fc.bias"
		red, err := New(bg, groups[0], m.params, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return red, m
	}
	grad := func(m *model, p int) comm.Buffer { return comm.HostBuffer(m.grads[p]) }
	check := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Error(err)
		}
	}

	t.Run("marked twice", func(t *testing.T) {
		red, m := newRed(t, Config{})
		check(t, red.GradReady(1, grad(m, 1)))
		check(t, wantErr(red.GradReady(1, grad(m, 1)), ErrMarkedTwice, 0, "Expected to mark a variable ready only once", "parameter 1 (fc.bias)"))
	})
	t.Run("missing then prior iteration", func(t *testing.T) {
		red, m := newRed(t, Config{})
		check(t, red.GradReady(2, grad(m, 2)))
		check(t, wantErr(red.EndBackward(bg), ErrMissingGradients, 0, "did not receive grad for rank 0: 0 (p0), 1 (fc.bias)", "FindUnusedParameters"))
		check(t, wantErr(red.GradReady(2, grad(m, 2)), ErrUnfinishedReduction, 0,
			"Expected to have finished reduction in the prior iteration before starting a new one", "Parameter indices which did not receive grad for rank 0: 0 (p0), 1 (fc.bias)"))
		check(t, wantErr(red.PrepareForBackward(), ErrUnfinishedReduction, 0, "prior iteration"))
	})
	t.Run("new iteration without EndBackward", func(t *testing.T) {
		red, m := newRed(t, Config{})
		check(t, red.PrepareForBackward())
		check(t, red.GradReady(0, grad(m, 0)))
		check(t, wantErr(red.PrepareForBackward(), ErrUnfinishedReduction, 0, "did not receive grad for rank 0: 1 (fc.bias), 2 (p2)"))
	})
	t.Run("hook twice", func(t *testing.T) {
		red, _ := newRed(t, Config{})
		check(t, red.RegisterCommHook(FP16CompressHook()))
		check(t, wantErr(red.RegisterCommHook(AllReduceHook()), ErrHookRegistered, 0, "can only be called once", `"fp16_compress" is already registered`))
		check(t, wantErr(red.RegisterCommHook(nil), comm.ErrInvalidArgument, 0, "nil hook"))
	})
	t.Run("static graph changed", func(t *testing.T) {
		red, m := newRed(t, Config{StaticGraph: true})
		check(t, red.GradReady(1, grad(m, 1)))
		check(t, red.GradReady(0, grad(m, 0)))
		check(t, red.EndBackward(bg)) // 2 unused in the first iteration
		check(t, red.GradReady(1, grad(m, 1)))
		check(t, wantErr(red.EndBackward(bg), ErrStaticGraphChanged, 0, "Your training graph has changed in this iteration", "used in first iteration, but then got unused", "parameter 0 (p0)"))
	})
	t.Run("bad arguments", func(t *testing.T) {
		red, m := newRed(t, Config{})
		check(t, wantErr(red.GradReady(3, grad(m, 0)), comm.ErrInvalidArgument, 0, "index 3 out of range"))
		check(t, wantErr(red.GradReady(1, grad(m, 0)), comm.ErrInvalidArgument, 0, "float32×2 does not match the parameter (float32×3"))
		check(t, wantErr(red.GradReady(1, comm.HostBuffer(make([]float64, 3))), comm.ErrInvalidArgument, 0, "does not match"))
		check(t, wantErr(red.PrepareForBackward(1), comm.ErrInvalidArgument, 0, "neither FindUnusedParameters nor StaticGraph"))
		check(t, wantErr(red.Join(bg), comm.ErrInvalidArgument, 0, "UnevenInputs"))
		check(t, red.GradReady(0, grad(m, 0)))
		check(t, wantErr(red.SetRequireSync(false), ErrBadState, 0, "during a backward pass"))
		check(t, wantErr(red.RegisterCommHook(AllReduceHook()), ErrBadState, 0, "during a backward pass"))
		if b := red.GradBuffer(9); b.Valid() {
			t.Errorf("GradBuffer(9) = %v", b)
		}
	})
	t.Run("bad construction", func(t *testing.T) {
		groups, _ := newTestGroups(t, 1)
		g := groups[0]
		bad := []struct {
			params   []Param
			cfg      Config
			sentinel error
			frag     string
		}{
			{[]Param{{Data: comm.HostBuffer(make([]float32, 4)), Shape: []int{3}}}, Config{}, comm.ErrInvalidArgument, "shape [3] holds 3 elements but Data has 4"},
			{[]Param{{Data: comm.HostBuffer(make([]int32, 4))}}, Config{}, comm.ErrInvalidArgument, "floating dtype"},
			{[]Param{{Data: comm.DeviceBuffer(0x1000, 4, comm.Float32, 0, 0)}}, Config{}, comm.ErrUnsupported, "host parameters only"},
			{nil, Config{DivideByActiveRanks: true}, comm.ErrInvalidArgument, "needs UnevenInputs"},
			{nil, Config{BucketCapBytes: -1}, comm.ErrInvalidArgument, "negative size"},
		}
		for i, b := range bad {
			_, err := New(bg, g, b.params, b.cfg)
			if !errors.Is(err, b.sentinel) || !strings.Contains(err.Error(), b.frag) {
				t.Errorf("case %d: %v, want %v with %q", i, err, b.sentinel, b.frag)
			}
		}
		if _, err := New(bg, nil, nil, Config{}); !errors.Is(err, comm.ErrInvalidArgument) {
			t.Errorf("nil group: %v", err)
		}
	})
}
