package reducer

import (
	"math"
	"math/rand/v2"

	"github.com/viterin/vek"
	"github.com/viterin/vek/vek32"
)

// Dense kernels of the PowerSGD hooks (powersgd.go). A gradient tensor is
// an n×m row-major matrix M (its first dimension by the product of the
// rest, torch's tensor.view(shape[0], -1)). The low-rank factors P (n×r)
// and Q (m×r) are stored column by column: column k of P is p[k*n:(k+1)*n],
// so every kernel works on contiguous runs (vek's SIMD dot, axpy). The
// layout of P and Q matters to no one else: their allreduce is
// elementwise and every rank uses the same layout.

// psgdFloat is the element type the PowerSGD kernels compute in.
type psgdFloat interface{ float32 | float64 }

// dotOf returns Σ x[i]·y[i] (vek: AVX2 where available). len(y) ≥ len(x).
func dotOf[T psgdFloat](x, y []T) T {
	y = y[:len(x)]
	switch xs := any(x).(type) {
	case []float32:
		return T(vek32.Dot(xs, any(y).([]float32)))
	case []float64:
		return T(vek.Dot(xs, any(y).([]float64)))
	}
	panic("reducer: unreachable psgdFloat")
}

// axpy sets y[i] += a·x[i]. len(y) ≥ len(x).
func axpy[T psgdFloat](a T, x, y []T) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += a * v
	}
}

// scaleBy sets x[i] *= a.
func scaleBy[T psgdFloat](x []T, a T) {
	switch xs := any(x).(type) {
	case []float32:
		vek32.MulNumber_Inplace(xs, float32(a))
	case []float64:
		vek.MulNumber_Inplace(xs, float64(a))
	}
}

// orthogonalize makes the cols columns of length rows stored in a
// (column k at a[k*rows:]) orthonormal in place by the Gram-Schmidt
// process, as torch's _orthogonalize_gram_schmidt: column i is divided by
// its norm plus eps, then its projection is removed from every later
// column. eps > 0 keeps a vanishing column finite. Where torch divides 0
// by 0 (eps 0 and an all-zero column), the column stays zero instead of
// becoming NaN, so a gradient that is zero on every rank decompresses to
// zero.
func orthogonalize[T psgdFloat](a []T, rows, cols int, eps float64) {
	for i := range cols {
		col := a[i*rows : (i+1)*rows]
		norm := math.Sqrt(float64(dotOf(col, col)))
		if norm+eps == 0 {
			continue
		}
		scaleBy(col, T(1/(norm+eps)))
		for j := i + 1; j < cols; j++ {
			rest := a[j*rows : (j+1)*rows]
			axpy(-dotOf(col, rest), col, rest)
		}
	}
}

// mulMQ sets P = M·Q for M n×m (row-major), Q m×r and P n×r (by column):
// P[i,k] = M[i,:]·Q[:,k].
func mulMQ[T psgdFloat](mat []T, n, m int, q []T, r int, p []T) {
	for k := range r {
		qk, pk := q[k*m:(k+1)*m], p[k*n:(k+1)*n]
		for i := range n {
			pk[i] = dotOf(mat[i*m:(i+1)*m], qk)
		}
	}
}

// mulMtP sets Q = Mᵀ·P for M n×m (row-major), P n×r and Q m×r (by
// column): Q[:,k] = Σ_i P[i,k]·M[i,:].
func mulMtP[T psgdFloat](mat []T, n, m int, p []T, r int, q []T) {
	for k := range r {
		qk, pk := q[k*m:(k+1)*m], p[k*n:(k+1)*n]
		clear(qk)
		for i := range n {
			if pk[i] != 0 {
				axpy(pk[i], mat[i*m:(i+1)*m], qk)
			}
		}
	}
}

// mulPQt sets M = P·Qᵀ for P n×r, Q m×r (by column) and M n×m
// (row-major): M[i,:] = Σ_k P[i,k]·Q[:,k].
func mulPQt[T psgdFloat](p []T, n int, q []T, m, r int, mat []T) {
	for i := range n {
		row := mat[i*m : (i+1)*m]
		clear(row)
		for k := range r {
			axpy(p[k*n+i], q[k*m:(k+1)*m], row)
		}
	}
}

// fillNormal fills x with standard normal values drawn from a generator
// seeded with seed: the same seed gives the same values on every rank
// (torch seeds its CPU generator with the state's draw and calls randn).
func fillNormal[T psgdFloat](x []T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	for i := range x {
		x[i] = T(rng.NormFloat64())
	}
}
