package reducer

import (
	"math"
	"math/rand/v2"
	"testing"
	"testing/quick"
)

func randMat(rng *rand.Rand, n int) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = rng.NormFloat64()
	}
	return x
}

// TestOrthogonalize: after Gram-Schmidt the columns are orthonormal, and
// each original column j lies in the span of the first j+1 new ones (the
// QR property), for ranks 1–5 and both element types; with epsilon the
// norms are 1/(1+eps·…) instead of 1.
func TestOrthogonalize(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, shape := range [][2]int{{1, 1}, {7, 1}, {20, 2}, {50, 3}, {9, 5}} {
		rows, cols := shape[0], shape[1]
		orig := randMat(rng, rows*cols)
		a := append([]float64(nil), orig...)
		orthogonalize(a, rows, cols, 0)
		for i := range cols {
			for j := range cols {
				want := 0.0
				if i == j {
					want = 1
				}
				if d := dotOf(a[i*rows:(i+1)*rows], a[j*rows:(j+1)*rows]); math.Abs(d-want) > 1e-10 {
					t.Fatalf("%dx%d: <q%d,q%d> = %v, want %v", rows, cols, i, j, d, want)
				}
			}
			// Residual of column i of the input after projecting on q_0..q_i.
			res := append([]float64(nil), orig[i*rows:(i+1)*rows]...)
			for k := 0; k <= i; k++ {
				qk := a[k*rows : (k+1)*rows]
				axpy(-dotOf(qk, res), qk, res)
			}
			if n := math.Sqrt(dotOf(res, res)); n > 1e-9 {
				t.Fatalf("%dx%d: column %d leaves residual %v outside span(q0..q%d)", rows, cols, i, n, i)
			}
		}
		// float32 agrees with float64.
		a32 := make([]float32, len(orig))
		for i, v := range orig {
			a32[i] = float32(v)
		}
		orthogonalize(a32, rows, cols, 0)
		for i := range a32 {
			if math.Abs(float64(a32[i])-a[i]) > 1e-4 {
				t.Fatalf("%dx%d float32 [%d] = %v, float64 %v", rows, cols, i, a32[i], a[i])
			}
		}
	}
	// Epsilon: a single column of norm 2 becomes col/(2+eps).
	c := []float64{2, 0, 0}
	orthogonalize(c, 3, 1, 0.5)
	if c[0] != 2/2.5 {
		t.Errorf("eps 0.5: %v, want %v", c[0], 2/2.5)
	}
	// A zero column stays zero (torch would give NaN with eps 0), and the
	// next column is still normalized.
	z := []float32{0, 0, 0, 3, 4, 0}
	orthogonalize(z, 3, 2, 0)
	for i, v := range []float32{0, 0, 0, 0.6, 0.8, 0} {
		if math.IsNaN(float64(z[i])) || math.Abs(float64(z[i]-v)) > 1e-6 {
			t.Fatalf("zero column: %v, want [0 0 0 0.6 0.8 0]", z)
		}
	}
}

// TestPowerSGDKernelsQuick checks mulMQ, mulMtP and mulPQt against naive
// loops on random shapes (testing/quick), in float64 and float32.
func TestPowerSGDKernelsQuick(t *testing.T) {
	f := func(seed uint64, n8, m8, r8 uint8) bool {
		n, m, r := int(n8%17)+1, int(m8%13)+1, int(r8%4)+1
		rng := rand.New(rand.NewPCG(seed, 7))
		mat, q, p := randMat(rng, n*m), randMat(rng, m*r), randMat(rng, n*r)
		// P = M Q
		gotP := make([]float64, n*r)
		mulMQ(mat, n, m, q, r, gotP)
		for i := range n {
			for k := range r {
				s := 0.0
				for j := range m {
					s += mat[i*m+j] * q[k*m+j]
				}
				if math.Abs(gotP[k*n+i]-s) > 1e-9 {
					return false
				}
			}
		}
		// Q = Mᵀ P
		gotQ := make([]float64, m*r)
		mulMtP(mat, n, m, p, r, gotQ)
		for j := range m {
			for k := range r {
				s := 0.0
				for i := range n {
					s += mat[i*m+j] * p[k*n+i]
				}
				if math.Abs(gotQ[k*m+j]-s) > 1e-9 {
					return false
				}
			}
		}
		// M = P Qᵀ
		gotM := make([]float64, n*m)
		mulPQt(p, n, q, m, r, gotM)
		for i := range n {
			for j := range m {
				s := 0.0
				for k := range r {
					s += p[k*n+i] * q[k*m+j]
				}
				if math.Abs(gotM[i*m+j]-s) > 1e-9 {
					return false
				}
			}
		}
		// float32 path agrees.
		m32, q32 := make([]float32, len(mat)), make([]float32, len(q))
		for i, v := range mat {
			m32[i] = float32(v)
		}
		for i, v := range q {
			q32[i] = float32(v)
		}
		p32 := make([]float32, n*r)
		mulMQ(m32, n, m, q32, r, p32)
		for i, v := range p32 {
			if math.Abs(float64(v)-gotP[i]) > 1e-4*(1+math.Abs(gotP[i])) {
				return false
			}
		}
		return true
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 300}); err != nil {
		t.Fatal(err)
	}
}

// TestFillNormalSeeded: the same seed gives the same values (what makes Q
// identical on every rank), another seed different ones, and the values
// look standard normal.
func TestFillNormalSeeded(t *testing.T) {
	a, b, c := make([]float64, 4000), make([]float64, 4000), make([]float64, 4000)
	fillNormal(a, 42)
	fillNormal(b, 42)
	fillNormal(c, 43)
	mean, sq := 0.0, 0.0
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("seed 42 gave %v and %v at %d", a[i], b[i], i)
		}
		mean += a[i]
		sq += a[i] * a[i]
	}
	mean /= float64(len(a))
	if v := sq/float64(len(a)) - mean*mean; math.Abs(mean) > 0.1 || math.Abs(v-1) > 0.1 {
		t.Errorf("mean %v variance %v, want ≈ 0 and 1", mean, v)
	}
	same := 0
	for i := range a {
		if a[i] == c[i] {
			same++
		}
	}
	if same > 10 {
		t.Errorf("seeds 42 and 43 agree on %d of %d values", same, len(a))
	}
}
