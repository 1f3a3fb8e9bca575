package kernel

import "github.com/ranktree/ranktree/comm"

// integer is the set of integer element types; Go's fixed-size integer
// arithmetic wraps (two's complement), as torch's integer tensors do.
type integer interface {
	~int8 | ~uint8 | ~int32 | ~int64
}

// reduceInt reduces integer elements with plain loops (the compiler
// bounds-checks once per slice thanks to the reslice of s).
func reduceInt[T integer](d, s []T, t comm.RedOpType) {
	s = s[:len(d)]
	switch t {
	case comm.RedSum:
		for i := range d {
			d[i] += s[i]
		}
	case comm.RedProduct:
		for i := range d {
			d[i] *= s[i]
		}
	case comm.RedMin:
		for i := range d {
			d[i] = min(d[i], s[i])
		}
	case comm.RedMax:
		for i := range d {
			d[i] = max(d[i], s[i])
		}
	case comm.RedBAnd:
		for i := range d {
			d[i] &= s[i]
		}
	case comm.RedBOr:
		for i := range d {
			d[i] |= s[i]
		}
	case comm.RedBXor:
		for i := range d {
			d[i] ^= s[i]
		}
	default:
		panic("kernel: unreachable: integer reduction " + t.String())
	}
}

// b2u is 1 for true, 0 for false.
func b2u(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// reduceBool reduces bool bytes: non-zero is true, results are 0 or 1. By
// now Sum is Max (or) and Product is Min (and), per comm.ReduceOp.ForDType.
func reduceBool(d, s []byte, t comm.RedOpType) {
	s = s[:len(d)]
	switch t {
	case comm.RedMax, comm.RedBOr:
		for i := range d {
			d[i] = b2u(d[i]|s[i] != 0)
		}
	case comm.RedMin, comm.RedBAnd:
		for i := range d {
			d[i] = b2u(d[i] != 0) & b2u(s[i] != 0)
		}
	case comm.RedBXor:
		for i := range d {
			d[i] = b2u(d[i] != 0) ^ b2u(s[i] != 0)
		}
	default:
		panic("kernel: unreachable: bool reduction " + t.String())
	}
}
