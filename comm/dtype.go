package comm

import (
	"fmt"

	"github.com/x448/float16"
)

// DType is the element type of a Buffer. The set and the names follow
// torch.dtype (torch.float32, torch.bfloat16, ...) and ncclDataType_t.
type DType uint8

// The element types ranktree moves and reduces. The zero DType is invalid.
const (
	Float32  DType = iota + 1 // IEEE 754 binary32, 4 bytes
	Float64                   // IEEE 754 binary64, 8 bytes
	Float16                   // IEEE 754 binary16, 2 bytes (reduced through float32)
	BFloat16                  // bfloat16 (8-bit exponent), 2 bytes (reduced through float32)
	Int8                      // int8, 1 byte
	Uint8                     // uint8, 1 byte
	Int32                     // int32, 4 bytes
	Int64                     // int64, 8 bytes
	Bool                      // bool, 1 byte (0 or 1)
	// Complex64 is torch.complex64 (torch.cfloat): a float32 real part
	// followed by a float32 imaginary part, 8 bytes (Go's complex64).
	// Reductions allow Sum, Avg and PreMulSum only, as torch.distributed,
	// and run as float32 reductions over 2×count elements
	// (torch.view_as_real).
	Complex64
	// Complex128 is torch.complex128 (torch.cdouble): two float64 parts,
	// 16 bytes (Go's complex128); reduced like Complex64 through float64.
	Complex128
)

// AllDTypes lists every valid DType, in declaration order.
var AllDTypes = []DType{Float32, Float64, Float16, BFloat16, Int8, Uint8, Int32, Int64, Bool, Complex64, Complex128}

var dtypeInfo = [...]struct {
	name string
	size int
}{
	{"invalid", 0},
	{"float32", 4}, {"float64", 8}, {"float16", 2}, {"bfloat16", 2},
	{"int8", 1}, {"uint8", 1}, {"int32", 4}, {"int64", 8}, {"bool", 1},
	{"complex64", 8}, {"complex128", 16},
}

// Valid reports whether d is one of the declared element types.
func (d DType) Valid() bool { return d >= Float32 && d <= Complex128 }

// Size is the size of one element in bytes; 0 for an invalid DType.
func (d DType) Size() int {
	if !d.Valid() {
		return 0
	}
	return dtypeInfo[d].size
}

// String is the torch-style name ("float32", "bfloat16", "bool").
func (d DType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("dtype(%d)", uint8(d))
	}
	return dtypeInfo[d].name
}

// IsFloating reports whether d is a floating-point type (float16, bfloat16,
// float32, float64), as torch.is_floating_point.
func (d DType) IsFloating() bool {
	return d == Float32 || d == Float64 || d == Float16 || d == BFloat16
}

// IsComplex reports whether d is a complex type (complex64, complex128),
// as torch.is_complex. Complex types are not floating (IsFloating is false
// for them, as torch.is_floating_point).
func (d DType) IsComplex() bool { return d == Complex64 || d == Complex128 }

// Real is the type of one part of a complex element: float32 for
// Complex64, float64 for Complex128 (the dtype of torch.view_as_real's
// result, which has twice the elements). Every other dtype is its own Real.
func (d DType) Real() DType {
	switch d {
	case Complex64:
		return Float32
	case Complex128:
		return Float64
	}
	return d
}

// IsIntegral reports whether d is an integer type (bool excluded).
func (d DType) IsIntegral() bool {
	return d == Int8 || d == Uint8 || d == Int32 || d == Int64
}

// ParseDType maps a torch-style name ("float32", "float", "half", "bf16",
// "int64", "bool", "complex64", "cfloat", "cdouble", ...) to a DType.
// Unknown names give an error wrapping ErrInvalidArgument.
func ParseDType(s string) (DType, error) {
	switch s {
	case "float32", "float", "f32", "fp32":
		return Float32, nil
	case "float64", "double", "f64", "fp64":
		return Float64, nil
	case "float16", "half", "f16", "fp16":
		return Float16, nil
	case "bfloat16", "bf16":
		return BFloat16, nil
	case "int8":
		return Int8, nil
	case "uint8", "byte":
		return Uint8, nil
	case "int32", "int":
		return Int32, nil
	case "int64", "long":
		return Int64, nil
	case "bool":
		return Bool, nil
	case "complex64", "cfloat", "c64":
		return Complex64, nil
	case "complex128", "cdouble", "c128":
		return Complex128, nil
	}
	return 0, fmt.Errorf("%w: unknown dtype %q", ErrInvalidArgument, s)
}

// Float16Value is one IEEE 754 binary16 element (x448/float16's type).
type Float16Value = float16.Float16

// BFloat16Value is one bfloat16 element: the upper 16 bits of a float32.
type BFloat16Value uint16

// BFloat16FromFloat32 rounds f to the nearest bfloat16 (ties to even; NaN stays NaN).
func BFloat16FromFloat32(f float32) BFloat16Value {
	return BFloat16Value(bf16FromBits(f))
}

// Float32 widens b to float32 exactly.
func (b BFloat16Value) Float32() float32 { return bf16ToF32(uint16(b)) }

// Elem is the set of Go element types a host Buffer can hold; each maps to
// exactly one DType.
type Elem interface {
	float32 | float64 | Float16Value | BFloat16Value | int8 | uint8 | int32 | int64 | bool | complex64 | complex128
}

// DTypeOf returns the DType of element type T.
func DTypeOf[T Elem]() DType {
	var z T
	switch any(z).(type) {
	case float32:
		return Float32
	case float64:
		return Float64
	case Float16Value:
		return Float16
	case BFloat16Value:
		return BFloat16
	case int8:
		return Int8
	case uint8:
		return Uint8
	case int32:
		return Int32
	case int64:
		return Int64
	case bool:
		return Bool
	case complex64:
		return Complex64
	case complex128:
		return Complex128
	}
	panic("unreachable: Elem covers every case")
}
