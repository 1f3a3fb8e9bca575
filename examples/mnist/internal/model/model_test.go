package model

import (
	"math"
	"math/rand/v2"
	"testing"
)

// refLoss is an independent float64 forward pass: mean softmax cross-entropy
// of the MLP with parameters p (laid out as MLP.Params) on x, y.
func refLoss(m *MLP, p []float64, x []float32, y []uint8) float64 {
	sizes := m.sizes
	batch := len(y)
	var total float64
	for s := range batch {
		h := make([]float64, sizes[0])
		for i := range h {
			h[i] = float64(x[s*sizes[0]+i])
		}
		for l := 0; l < len(sizes)-1; l++ {
			ni, no := sizes[l], sizes[l+1]
			wo, bo := m.params[2*l].Offset, m.params[2*l+1].Offset
			out := make([]float64, no)
			for o := range no {
				v := p[bo+o]
				for i := range ni {
					v += h[i] * p[wo+i*no+o]
				}
				if l < len(sizes)-2 && v < 0 {
					v = 0
				}
				out[o] = v
			}
			h = out
		}
		mx := math.Inf(-1)
		for _, v := range h {
			mx = max(mx, v)
		}
		var sum float64
		for _, v := range h {
			sum += math.Exp(v - mx)
		}
		total += math.Log(sum) - (h[y[s]] - mx)
	}
	return total / float64(batch)
}

func randomBatch(rng *rand.Rand, batch, in, classes int) ([]float32, []uint8) {
	x := make([]float32, batch*in)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	y := make([]uint8, batch)
	for i := range y {
		y[i] = uint8(rng.IntN(classes))
	}
	return x, y
}

// checkGrad compares LossAndGrad's analytic gradient with central finite
// differences of the float64 reference loss on coordinates coords.
func checkGrad(t *testing.T, sizes []int, batch int, coords []int, seed uint64) {
	t.Helper()
	m, err := New(sizes, seed)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	// Non-zero biases so they matter in the check.
	for i := range m.Params {
		if rng.IntN(4) == 0 {
			m.Params[i] += float32(0.1 * rng.NormFloat64())
		}
	}
	x, y := randomBatch(rng, batch, sizes[0], sizes[len(sizes)-1])
	ws := m.NewWorkspace(batch)
	grad := make([]float32, m.NumParams())
	var order []int
	loss, _, err := m.LossAndGrad(ws, x, y, grad, func(i int) { order = append(order, i) })
	if err != nil {
		t.Fatal(err)
	}
	// Parameters are announced once each, in reverse registration order.
	if len(order) != 2*m.Layers() {
		t.Fatalf("ready called %d times, want %d", len(order), 2*m.Layers())
	}
	for k, i := range order {
		if want := 2*m.Layers() - 1 - k; i != want {
			t.Fatalf("ready order %v, want descending indices", order)
		}
	}
	p := make([]float64, m.NumParams())
	for i, v := range m.Params {
		p[i] = float64(v)
	}
	if ref := refLoss(m, p, x, y); math.Abs(ref-loss) > 1e-5*max(1, math.Abs(ref)) {
		t.Fatalf("loss %v, float64 reference %v", loss, ref)
	}
	const eps = 1e-5
	for _, c := range coords {
		orig := p[c]
		p[c] = orig + eps
		lp := refLoss(m, p, x, y)
		p[c] = orig - eps
		lm := refLoss(m, p, x, y)
		p[c] = orig
		num := (lp - lm) / (2 * eps)
		ana := float64(grad[c])
		if math.Abs(num-ana) > 2e-6+1e-4*math.Abs(num) {
			t.Errorf("param %d (%s): analytic %.8g, finite difference %.8g", c, m.paramName(c), ana, num)
		}
	}
}

func (m *MLP) paramName(c int) string {
	for _, p := range m.params {
		if c >= p.Offset && c < p.Offset+p.Len() {
			return p.Name
		}
	}
	return "?"
}

func TestGradCheckSmallAllParams(t *testing.T) {
	sizes := []int{7, 6, 5, 4}
	m, _ := New(sizes, 1)
	coords := make([]int, m.NumParams())
	for i := range coords {
		coords[i] = i
	}
	checkGrad(t, sizes, 9, coords, 1)
}

func TestGradCheckMNISTSizes(t *testing.T) {
	m, _ := New(MNISTSizes, 3)
	rng := rand.New(rand.NewPCG(3, 3))
	var coords []int
	for _, p := range m.ParamList() { // every tensor, first and last element plus random ones
		coords = append(coords, p.Offset, p.Offset+p.Len()-1)
		for range 10 {
			coords = append(coords, p.Offset+rng.IntN(p.Len()))
		}
	}
	checkGrad(t, MNISTSizes, 4, coords, 3)
}

func TestMatMulMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for _, d := range [][3]int{{1, 1, 1}, {3, 5, 7}, {17, 33, 9}, {64, 784, 256}, {2, 1, 13}, {128, 128, 10}} {
		m, n, p := d[0], d[1], d[2]
		a, b := make([]float32, m*n), make([]float32, n*p)
		for i := range a {
			a[i] = float32(rng.NormFloat64())
		}
		for i := range b {
			b[i] = float32(rng.NormFloat64())
		}
		got := make([]float32, m*p)
		for i := range got {
			got[i] = 123 // must be overwritten
		}
		matMul(got, a, b, m, n, p)
		for i := range m {
			for j := range p {
				var want float64
				for k := range n {
					want += float64(a[i*n+k]) * float64(b[k*p+j])
				}
				if math.Abs(float64(got[i*p+j])-want) > 1e-4*math.Sqrt(float64(n))*max(1, math.Abs(want)) {
					t.Fatalf("%v: [%d,%d] = %v, want %v", d, i, j, got[i*p+j], want)
				}
			}
		}
	}
}

func TestTranspose(t *testing.T) {
	for _, d := range [][2]int{{1, 1}, {1, 40}, {33, 70}, {64, 64}} {
		r, c := d[0], d[1]
		src := make([]float32, r*c)
		for i := range src {
			src[i] = float32(i)
		}
		dst := make([]float32, r*c)
		transpose(dst, src, r, c)
		for i := range r {
			for j := range c {
				if dst[j*r+i] != src[i*c+j] {
					t.Fatalf("%v: dst[%d,%d] = %v, want %v", d, j, i, dst[j*r+i], src[i*c+j])
				}
			}
		}
	}
}

func TestInitHeUniform(t *testing.T) {
	a, _ := New(MNISTSizes, 7)
	b, _ := New(MNISTSizes, 7)
	c, _ := New(MNISTSizes, 8)
	if a.Hash() != b.Hash() {
		t.Fatal("same seed gave different parameters")
	}
	if a.Hash() == c.Hash() {
		t.Fatal("different seeds gave identical parameters")
	}
	if want := 784*256 + 256 + 256*128 + 128 + 128*10 + 10; a.NumParams() != want {
		t.Fatalf("NumParams %d, want %d", a.NumParams(), want)
	}
	for l := range a.Layers() {
		w, bias := a.weight(a.Params, l), a.bias(a.Params, l)
		bound := math.Sqrt(6 / float64(MNISTSizes[l]))
		var sumsq float64
		for _, v := range w {
			if math.Abs(float64(v)) > bound {
				t.Fatalf("layer %d weight %v outside ±%v", l, v, bound)
			}
			sumsq += float64(v) * float64(v)
		}
		// Variance of U(−b, b) is b²/3 = 2/fan_in.
		if v, want := sumsq/float64(len(w)), 2/float64(MNISTSizes[l]); math.Abs(v-want) > 0.1*want {
			t.Errorf("layer %d weight variance %v, want ≈ %v", l, v, want)
		}
		for _, v := range bias {
			if v != 0 {
				t.Fatalf("layer %d bias %v, want 0", l, v)
			}
		}
	}
	if _, err := New([]int{5}, 1); err == nil {
		t.Error("New accepted a single layer size")
	}
	if _, err := New([]int{5, 0, 2}, 1); err == nil {
		t.Error("New accepted a zero width")
	}
}

func TestHashSeesEveryBit(t *testing.T) {
	m, _ := New([]int{3, 2}, 1)
	h := m.Hash()
	m.Params[len(m.Params)-1] = math.Float32frombits(math.Float32bits(m.Params[len(m.Params)-1]) ^ 1)
	if m.Hash() == h {
		t.Fatal("flipping the lowest bit of the last parameter left the hash unchanged")
	}
}

func TestLossAndGradErrors(t *testing.T) {
	m, _ := New([]int{3, 2}, 1)
	ws := m.NewWorkspace(2)
	g := make([]float32, m.NumParams())
	if _, _, err := m.LossAndGrad(ws, make([]float32, 6), []uint8{0, 2}, g, nil); err == nil {
		t.Error("label 2 of 2 classes accepted")
	}
	if _, _, err := m.LossAndGrad(ws, make([]float32, 6), []uint8{0, 1}, g[:1], nil); err == nil {
		t.Error("short gradient vector accepted")
	}
	if _, _, err := m.LossAndGrad(ws, nil, nil, g, nil); err == nil {
		t.Error("empty batch accepted")
	}
}

// TestSGDMatchesTorchFormula runs three steps by hand with torch.optim.SGD's
// update rule (momentum, weight decay, with and without Nesterov).
func TestSGDMatchesTorchFormula(t *testing.T) {
	for _, nesterov := range []bool{false, true} {
		const lr, mu, wd = 0.1, 0.9, 0.01
		o, err := NewSGD(lr, mu, wd, nesterov)
		if err != nil {
			t.Fatal(err)
		}
		p := []float32{1, -2}
		grads := [][]float32{{0.5, 1}, {-0.25, 0.5}, {1, -1}}
		wp := []float64{1, -2}
		buf := []float64{0, 0}
		for s, g := range grads {
			if err := o.Step(p, g); err != nil {
				t.Fatal(err)
			}
			for i := range wp {
				d := float64(g[i]) + wd*wp[i]
				if s == 0 {
					buf[i] = d
				} else {
					buf[i] = mu*buf[i] + d
				}
				if nesterov {
					d += mu * buf[i]
				} else {
					d = buf[i]
				}
				wp[i] -= lr * d
			}
			for i := range p {
				if math.Abs(float64(p[i])-wp[i]) > 1e-6 {
					t.Fatalf("nesterov=%v step %d: p[%d] = %v, want %v", nesterov, s, i, p[i], wp[i])
				}
			}
		}
		if o.Steps() != 3 {
			t.Fatalf("Steps() = %d", o.Steps())
		}
	}
	if _, err := NewSGD(0, 0.9, 0, false); err == nil {
		t.Error("lr 0 accepted")
	}
	if _, err := NewSGD(0.1, 1, 0, false); err == nil {
		t.Error("momentum 1 accepted")
	}
	if _, err := NewSGD(0.1, 0, 0, true); err == nil {
		t.Error("Nesterov without momentum accepted")
	}
}
