package model

import "github.com/viterin/vek/vek32"

// The dense kernels of the MLP. Matrices are row-major float32 slices of
// exactly rows×cols elements. Products go to vek32.MatMul_Into (AVX2/FMA
// where the CPU has it, a portable loop otherwise; it splits rows across
// CPUs for large products). The results of one call do not depend on how
// rows are split, so every rank computes bit-identical values from
// bit-identical inputs.

// matMul sets dst (m×p) = a (m×n) · b (n×p).
func matMul(dst, a, b []float32, m, n, p int) {
	if m == 0 || p == 0 {
		return
	}
	if n == 0 {
		clear(dst[:m*p])
		return
	}
	vek32.MatMul_Into(dst[:m*p], a[:m*n], b[:n*p], n)
}

// transpose sets dst (cols×rows) = srcᵀ, src being rows×cols. It walks
// 32×32 tiles so both sides stay in cache.
func transpose(dst, src []float32, rows, cols int) {
	const t = 32
	for i0 := 0; i0 < rows; i0 += t {
		i1 := min(i0+t, rows)
		for j0 := 0; j0 < cols; j0 += t {
			j1 := min(j0+t, cols)
			for i := i0; i < i1; i++ {
				row := src[i*cols : i*cols+cols]
				for j := j0; j < j1; j++ {
					dst[j*rows+i] = row[j]
				}
			}
		}
	}
}

// addBiasReLU adds bias (n) to every row of z (m×n) and, if relu is set,
// clamps negatives to zero.
func addBiasReLU(z, bias []float32, m, n int, relu bool) {
	for i := range m {
		row := z[i*n : i*n+n]
		vek32.Add_Inplace(row, bias[:n])
		if relu {
			vek32.MaximumNumber_Inplace(row, 0)
		}
	}
}

// colSums sets dst (n) to the column sums of a (m×n), adding rows in order.
func colSums(dst, a []float32, m, n int) {
	clear(dst[:n])
	for i := range m {
		vek32.Add_Inplace(dst[:n], a[i*n:i*n+n])
	}
}

// reluBackward zeroes d where the layer's output h is not positive (the
// derivative of ReLU, with 0 at 0 as PyTorch takes it).
func reluBackward(d, h []float32) {
	for i, v := range h[:len(d)] {
		if v <= 0 {
			d[i] = 0
		}
	}
}
