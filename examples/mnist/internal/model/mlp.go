// Package model is a multilayer perceptron with hand-written batched forward
// and backward passes over flat float32 parameters, and torch.optim.SGD.
//
// Layer l computes h_{l+1} = ReLU(h_l · W_l + b_l) (no ReLU after the last
// layer, whose outputs are the logits of a softmax cross-entropy loss).
// W_l is stored in×out row-major — the transpose of torch.nn.Linear.weight
// — so the forward product needs no transpose.
//
// Caller's duties:
//  1. Build the model with New (same seed on every rank, or broadcast).
//  2. Give each goroutine its own Workspace (NewWorkspace).
//  3. Per step: LossAndGrad fills a gradient vector laid out like Params,
//     announcing each parameter as its gradient becomes final (in reverse
//     order, so a DDP reducer can overlap communication with backward);
//     then SGD.Step.
package model

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
)

// MNISTSizes is the 784-256-128-10 network of the main job.
var MNISTSizes = []int{784, 256, 128, 10}

// Param describes one parameter tensor inside the flat vector.
type Param struct {
	Name   string // "fc1.weight", "fc1.bias", ...
	Offset int    // index of the first element in Params (and in gradients)
	Shape  []int  // [in, out] for weights, [out] for biases
}

// Len is the number of elements of p.
func (p Param) Len() int {
	n := 1
	for _, d := range p.Shape {
		n *= d
	}
	return n
}

// MLP is a fully connected ReLU network. Params is its flat parameter vector:
// W_0, b_0, W_1, b_1, ... in that order. An MLP is not safe for concurrent
// mutation; concurrent read-only use (Forward with separate Workspaces) is.
type MLP struct {
	sizes  []int
	Params []float32
	params []Param
}

// New builds an MLP with layer widths sizes (input first, classes last; at
// least two entries, all ≥ 1). Weights get He (Kaiming) uniform
// initialisation for ReLU, U(−√(6/fan_in), √(6/fan_in)) as
// torch.nn.init.kaiming_uniform_(nonlinearity="relu"); biases start at 0.
// The draw depends only on seed, so every rank builds the same model.
func New(sizes []int, seed uint64) (*MLP, error) {
	if len(sizes) < 2 {
		return nil, fmt.Errorf("model: %d layer sizes, want at least 2 (input and output)", len(sizes))
	}
	for i, s := range sizes {
		if s < 1 {
			return nil, fmt.Errorf("model: layer size %d at position %d, want ≥ 1", s, i)
		}
	}
	m := &MLP{sizes: append([]int(nil), sizes...)}
	off := 0
	for l := 0; l+1 < len(sizes); l++ {
		in, out := sizes[l], sizes[l+1]
		m.params = append(m.params,
			Param{Name: fmt.Sprintf("fc%d.weight", l+1), Offset: off, Shape: []int{in, out}},
			Param{Name: fmt.Sprintf("fc%d.bias", l+1), Offset: off + in*out, Shape: []int{out}})
		off += in*out + out
	}
	m.Params = make([]float32, off)
	rng := rand.New(rand.NewPCG(seed, 0x6d6e697374)) // second word: a fixed stream id
	for l := 0; l < m.Layers(); l++ {
		w := m.weight(m.Params, l)
		bound := math.Sqrt(6 / float64(sizes[l]))
		for i := range w {
			w[i] = float32((2*rng.Float64() - 1) * bound)
		}
	}
	return m, nil
}

// Sizes returns the layer widths (a copy).
func (m *MLP) Sizes() []int { return append([]int(nil), m.sizes...) }

// Layers is the number of linear layers (len(Sizes())−1).
func (m *MLP) Layers() int { return len(m.sizes) - 1 }

// NumParams is len(Params).
func (m *MLP) NumParams() int { return len(m.Params) }

// ParamList describes the parameter tensors in registration order
// (fc1.weight, fc1.bias, fc2.weight, ...). LossAndGrad announces them in the
// reverse of this order.
func (m *MLP) ParamList() []Param { return append([]Param(nil), m.params...) }

// View returns parameter i's elements inside flat (Params or a gradient
// vector of the same length).
func (m *MLP) View(flat []float32, i int) []float32 {
	p := m.params[i]
	return flat[p.Offset : p.Offset+p.Len()]
}

func (m *MLP) weight(flat []float32, l int) []float32 { return m.View(flat, 2*l) }
func (m *MLP) bias(flat []float32, l int) []float32   { return m.View(flat, 2*l+1) }

// Hash is FNV-1a (64 bit) over the IEEE-754 bits of Params, little-endian:
// equal exactly when the parameters are bit-identical (barring collisions).
func (m *MLP) Hash() uint64 {
	h := fnv.New64a()
	buf := make([]byte, 0, 4096)
	for _, v := range m.Params {
		b := math.Float32bits(v)
		buf = append(buf, byte(b), byte(b>>8), byte(b>>16), byte(b>>24))
		if len(buf) == cap(buf) {
			h.Write(buf)
			buf = buf[:0]
		}
	}
	h.Write(buf)
	return h.Sum64()
}

// Workspace holds the activations and scratch space of one forward/backward
// pass for batches of up to MaxBatch samples. One goroutine at a time.
type Workspace struct {
	maxBatch int
	h        [][]float32 // h[l+1]: output of layer l (post-ReLU; logits for the last), maxBatch×sizes[l+1]
	d, d2    []float32   // gradient w.r.t. a layer's output / input, maxBatch×max(sizes)
	tA       []float32   // transposed activations, max(sizes)×maxBatch
	tW       []float32   // transposed weights
}

// NewWorkspace allocates a Workspace for batches of up to maxBatch (≥ 1).
func (m *MLP) NewWorkspace(maxBatch int) *Workspace {
	maxBatch = max(maxBatch, 1)
	ws := &Workspace{maxBatch: maxBatch, h: make([][]float32, len(m.sizes))}
	widest, wmax := 0, 0
	for l, s := range m.sizes {
		widest = max(widest, s)
		if l > 0 {
			ws.h[l] = make([]float32, maxBatch*s)
			wmax = max(wmax, s*m.sizes[l-1])
		}
	}
	ws.d = make([]float32, maxBatch*widest)
	ws.d2 = make([]float32, maxBatch*widest)
	ws.tA = make([]float32, maxBatch*widest)
	ws.tW = make([]float32, wmax)
	return ws
}

// MaxBatch is the largest batch the Workspace can hold.
func (ws *Workspace) MaxBatch() int { return ws.maxBatch }

// Forward runs the network on x (batch×Sizes()[0], row-major) and returns the
// logits (batch×classes), a view into ws valid until its next use. It panics
// if batch exceeds ws.MaxBatch() or x is too short (programming errors).
func (m *MLP) Forward(ws *Workspace, x []float32, batch int) []float32 {
	if batch > ws.maxBatch || len(x) < batch*m.sizes[0] {
		panic(fmt.Sprintf("model.Forward: batch %d, input %d floats, workspace for %d×%d", batch, len(x), ws.maxBatch, m.sizes[0]))
	}
	in := x[:batch*m.sizes[0]]
	last := m.Layers() - 1
	for l := 0; l <= last; l++ {
		ni, no := m.sizes[l], m.sizes[l+1]
		out := ws.h[l+1][:batch*no]
		matMul(out, in, m.weight(m.Params, l), batch, ni, no)
		addBiasReLU(out, m.bias(m.Params, l), batch, no, l < last)
		in = out
	}
	return in
}

// LossAndGrad runs forward and backward on a batch: x is batch×Sizes()[0]
// row-major, labels holds batch class indices in [0, classes). It returns the
// mean softmax cross-entropy over the batch (torch.nn.CrossEntropyLoss with
// reduction "mean") and the number of samples whose arg-max logit equals the
// label, and overwrites grad (len NumParams, laid out like Params) with the
// gradient of that mean loss. ready, if not nil, is called with each
// parameter index as soon as its gradient is final, in reverse registration
// order (last bias first); grad's slice for that parameter is not written
// again in this call. A label out of range is an error and leaves grad
// unspecified.
func (m *MLP) LossAndGrad(ws *Workspace, x []float32, labels []uint8, grad []float32, ready func(param int)) (loss float64, correct int, err error) {
	batch := len(labels)
	if batch == 0 {
		return 0, 0, fmt.Errorf("model: empty batch")
	}
	if len(grad) != len(m.Params) {
		return 0, 0, fmt.Errorf("model: gradient vector has %d floats, want %d", len(grad), len(m.Params))
	}
	logits := m.Forward(ws, x, batch)
	classes := m.sizes[len(m.sizes)-1]
	dz := ws.d[:batch*classes]
	loss, correct, err = softmaxCrossEntropy(dz, logits, labels, batch, classes)
	if err != nil {
		return 0, 0, err
	}
	for l := m.Layers() - 1; l >= 0; l-- {
		ni, no := m.sizes[l], m.sizes[l+1]
		in := x[:batch*ni]
		if l > 0 {
			in = ws.h[l][:batch*ni]
		}
		// Bias: column sums of dz.
		colSums(m.bias(grad, l), dz, batch, no)
		if ready != nil {
			ready(2*l + 1)
		}
		// Weight: inᵀ (ni×batch) · dz (batch×no).
		tA := ws.tA[:ni*batch]
		transpose(tA, in, batch, ni)
		matMul(m.weight(grad, l), tA, dz, ni, batch, no)
		if ready != nil {
			ready(2 * l)
		}
		if l == 0 {
			break
		}
		// Input: dz (batch×no) · Wᵀ (no×ni), then through the ReLU.
		tW := ws.tW[:no*ni]
		transpose(tW, m.weight(m.Params, l), ni, no)
		dIn := ws.d2[:batch*ni]
		matMul(dIn, dz, tW, batch, no, ni)
		reluBackward(dIn, in)
		ws.d, ws.d2 = ws.d2, ws.d
		dz = dIn
	}
	return loss, correct, nil
}

// softmaxCrossEntropy writes d = (softmax(z) − onehot(y)) / batch and returns
// the mean loss and the count of correct arg-max predictions. Sums run in
// float64.
func softmaxCrossEntropy(d, z []float32, y []uint8, batch, classes int) (float64, int, error) {
	var total float64
	correct := 0
	inv := 1 / float64(batch)
	for i := range batch {
		row := z[i*classes : (i+1)*classes]
		lab := int(y[i])
		if lab >= classes {
			return 0, 0, fmt.Errorf("model: label %d of sample %d is outside [0, %d)", lab, i, classes)
		}
		arg := argmax(row)
		if arg == lab {
			correct++
		}
		mx := float64(row[arg])
		var sum float64
		for _, v := range row {
			sum += math.Exp(float64(v) - mx)
		}
		total += math.Log(sum) - (float64(row[lab]) - mx)
		drow := d[i*classes : (i+1)*classes]
		for j, v := range row {
			p := math.Exp(float64(v)-mx) / sum
			if j == lab {
				p--
			}
			drow[j] = float32(p * inv)
		}
	}
	return total * inv, correct, nil
}

// argmax is the index of the largest element (the first on ties).
func argmax(row []float32) int {
	best := 0
	for j, v := range row {
		if v > row[best] {
			best = j
		}
	}
	return best
}

// Predict writes the arg-max class of each of the batch rows of x into out
// (len ≥ batch).
func (m *MLP) Predict(ws *Workspace, x []float32, batch int, out []int) {
	classes := m.sizes[len(m.sizes)-1]
	logits := m.Forward(ws, x, batch)
	for i := range batch {
		out[i] = argmax(logits[i*classes : (i+1)*classes])
	}
}
