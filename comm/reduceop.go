package comm

import (
	"fmt"
	"math"
)

// RedOpType names a reduction, as torch.distributed.ReduceOp / ncclRedOp_t.
type RedOpType uint8

// The reductions. Bitwise ones apply to integer and bool types only; Avg and
// PreMulSum to floating and complex types only; complex types take Sum, Avg
// and PreMulSum only (c10d's rules: ProcessGroupNCCL's dtype checks and
// torch.distributed's supports_complex).
const (
	RedSum RedOpType = iota + 1
	RedAvg
	RedProduct
	RedMin
	RedMax
	RedPreMulSum
	RedBAnd
	RedBOr
	RedBXor
)

var redNames = [...]string{"invalid", "sum", "avg", "product", "min", "max", "premul_sum", "band", "bor", "bxor"}

// String is the lower-case c10d name ("sum", "premul_sum", ...).
func (t RedOpType) String() string {
	if t < RedSum || t > RedBXor {
		return fmt.Sprintf("redop(%d)", uint8(t))
	}
	return redNames[t]
}

// ReduceOp is a reduction plus, for PreMulSum, its scalar factor. Compare
// with ==. Semantics of torch.distributed.ReduceOp and
// torch.distributed._make_nccl_premul_sum.
type ReduceOp struct {
	typ    RedOpType
	factor float64
}

// The reductions without parameters.
var (
	Sum     = ReduceOp{typ: RedSum}     // elementwise sum; for bool, logical or
	Avg     = ReduceOp{typ: RedAvg}     // sum divided by the group size (floating types)
	Product = ReduceOp{typ: RedProduct} // elementwise product; for bool, logical and
	Min     = ReduceOp{typ: RedMin}     // elementwise minimum
	Max     = ReduceOp{typ: RedMax}     // elementwise maximum
	BAnd    = ReduceOp{typ: RedBAnd}    // bitwise and (integers, bool)
	BOr     = ReduceOp{typ: RedBOr}     // bitwise or (integers, bool)
	BXor    = ReduceOp{typ: RedBXor}    // bitwise xor (integers, bool)
)

// PreMulSum multiplies every rank's input by factor, then sums (ncclRedOpCreatePreMulSum).
func PreMulSum(factor float64) ReduceOp { return ReduceOp{typ: RedPreMulSum, factor: factor} }

// Type is the kind of reduction.
func (o ReduceOp) Type() RedOpType { return o.typ }

// Factor is PreMulSum's scalar; 1 for every other op.
func (o ReduceOp) Factor() float64 {
	if o.typ == RedPreMulSum {
		return o.factor
	}
	return 1
}

// String is the c10d name; PreMulSum shows its factor.
func (o ReduceOp) String() string {
	if o.typ == RedPreMulSum {
		return fmt.Sprintf("premul_sum(%g)", o.factor)
	}
	return o.typ.String()
}

// ReduceOpFrom rebuilds a ReduceOp from its wire form (type and factor).
// An unknown type gives an error wrapping ErrInvalidArgument.
func ReduceOpFrom(t RedOpType, factor float64) (ReduceOp, error) {
	if t < RedSum || t > RedBXor {
		return ReduceOp{}, fmt.Errorf("%w: unknown reduce op %d", ErrInvalidArgument, t)
	}
	if t != RedPreMulSum {
		factor = 0
	}
	return ReduceOp{typ: t, factor: factor}, nil
}

// ParseReduceOp maps "sum", "avg", "prod"/"product", "min", "max", "band",
// "bor", "bxor" to a ReduceOp.
func ParseReduceOp(s string) (ReduceOp, error) {
	switch s {
	case "sum":
		return Sum, nil
	case "avg":
		return Avg, nil
	case "prod", "product":
		return Product, nil
	case "min":
		return Min, nil
	case "max":
		return Max, nil
	case "band":
		return BAnd, nil
	case "bor":
		return BOr, nil
	case "bxor":
		return BXor, nil
	}
	return ReduceOp{}, fmt.Errorf("%w: unknown reduce op %q", ErrInvalidArgument, s)
}

// Check reports whether o may reduce elements of type dt, with c10d's rules:
// bitwise ops need an integer or bool type; Avg and PreMulSum need a floating
// or complex type; complex types allow Sum, Avg and PreMulSum only (torch
// refuses Product, Min, Max and the bitwise ops on complex tensors:
// supports_complex in distributed_c10d.py); PreMulSum's factor must be
// finite. PreMulSum's factor is real for complex types too: it scales both
// parts, as torch's premul_sum on view_as_real. The error wraps
// ErrInvalidArgument and names the op and the dtype.
func (o ReduceOp) Check(dt DType) error {
	if !dt.Valid() {
		return fmt.Errorf("%w: invalid dtype %v", ErrInvalidArgument, dt)
	}
	if dt.IsComplex() {
		switch o.typ {
		case RedSum, RedAvg, RedPreMulSum:
		case RedProduct, RedMin, RedMax, RedBAnd, RedBOr, RedBXor:
			return fmt.Errorf("%w: Cannot use ReduceOp.%s with dtype %v: complex tensors support only sum, avg and premul_sum", ErrInvalidArgument, o.typ, dt)
		}
	}
	switch o.typ {
	case RedSum, RedProduct, RedMin, RedMax:
		return nil
	case RedBAnd, RedBOr, RedBXor:
		if dt.IsIntegral() || dt == Bool {
			return nil
		}
		return fmt.Errorf("%w: Cannot use ReduceOp.%s with dtype %v: bitwise ops need an integer or bool dtype", ErrInvalidArgument, o.typ, dt)
	case RedAvg, RedPreMulSum:
		if !dt.IsFloating() && !dt.IsComplex() {
			return fmt.Errorf("%w: Cannot use ReduceOp.%s with dtype %v: it needs a floating dtype (or a complex one)", ErrInvalidArgument, o.typ, dt)
		}
		if o.typ == RedPreMulSum && (math.IsNaN(o.factor) || math.IsInf(o.factor, 0)) {
			return fmt.Errorf("%w: PreMulSum factor %v is not finite", ErrInvalidArgument, o.factor)
		}
		return nil
	}
	return fmt.Errorf("%w: invalid reduce op %v", ErrInvalidArgument, o)
}

// ForDType returns the op an engine should run for dt: on bool, Sum is
// logical or (Max) and Product logical and (Min), as c10d maps them.
func (o ReduceOp) ForDType(dt DType) ReduceOp {
	if dt == Bool {
		switch o.typ {
		case RedSum:
			return Max
		case RedProduct:
			return Min
		}
	}
	return o
}
