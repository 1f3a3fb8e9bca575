package model

import "fmt"

// SGD is stochastic gradient descent with momentum, with the update of
// torch.optim.SGD (dampening 0, weight decay optional, Nesterov optional):
//
//	g ← g + wd·p
//	b ← g on the first step, else b ← μ·b + g
//	g ← g + μ·b if Nesterov, else g ← b
//	p ← p − lr·g
//
// It owns its momentum buffer; one goroutine at a time.
type SGD struct {
	LR          float32 // learning rate, > 0
	Momentum    float32 // μ in [0, 1)
	WeightDecay float32 // L2 penalty, ≥ 0
	Nesterov    bool    // Nesterov momentum (needs Momentum > 0)

	buf   []float32
	steps int
}

// NewSGD validates the hyper-parameters.
func NewSGD(lr, momentum, weightDecay float32, nesterov bool) (*SGD, error) {
	switch {
	case !(lr > 0):
		return nil, fmt.Errorf("sgd: learning rate %v, want > 0", lr)
	case momentum < 0 || momentum >= 1:
		return nil, fmt.Errorf("sgd: momentum %v, want in [0, 1)", momentum)
	case weightDecay < 0:
		return nil, fmt.Errorf("sgd: weight decay %v, want ≥ 0", weightDecay)
	case nesterov && momentum == 0:
		return nil, fmt.Errorf("sgd: Nesterov momentum needs momentum > 0")
	}
	return &SGD{LR: lr, Momentum: momentum, WeightDecay: weightDecay, Nesterov: nesterov}, nil
}

// Steps is the number of updates applied so far.
func (o *SGD) Steps() int { return o.steps }

// Step updates params in place from grads (same length; grads is only
// read). Every call must pass vectors of the same length.
func (o *SGD) Step(params, grads []float32) error {
	if len(params) != len(grads) {
		return fmt.Errorf("sgd: %d parameters but %d gradients", len(params), len(grads))
	}
	if o.buf != nil && len(o.buf) != len(params) {
		return fmt.Errorf("sgd: %d parameters, but the momentum buffer holds %d", len(params), len(o.buf))
	}
	lr, mu, wd := o.LR, o.Momentum, o.WeightDecay
	if mu != 0 && o.buf == nil {
		o.buf = make([]float32, len(params))
	}
	first := o.steps == 0
	for i, g := range grads {
		if wd != 0 {
			g += wd * params[i]
		}
		if mu != 0 {
			b := g
			if !first {
				b = mu*o.buf[i] + g
			}
			o.buf[i] = b
			if o.Nesterov {
				g += mu * b
			} else {
				g = b
			}
		}
		params[i] -= lr * g
	}
	o.steps++
	return nil
}
