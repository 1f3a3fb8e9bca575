package comm

import (
	"fmt"
	"math"
	"math/bits"
	"strings"
)

// Buffers with a shape (torch.Tensor.shape / torch.Size).
//
// A Buffer is a flat run of elements; WithShape gives it a shape as well.
// Collectives move and reduce the elements exactly as without one, but the
// shape is checked and becomes part of the op's Fingerprint, so that ranks
// that pass buffers of one length but different shapes (a [3, 4] buffer
// on one rank, [4, 3] on another) fail with ErrMismatch instead of
// silently running as the same op: the check c10d makes under
// TORCH_DISTRIBUTED_DEBUG=DETAIL, whose collective fingerprint
// (ProcessGroupWrapper's CollectiveFingerPrint) holds the tensors' sizes.
// A buffer without a shape is a 1-D tensor of Len elements, so that
// WithShape(n) and no shape are the same op.

// shapeInfo is a buffer's shape, built once by WithShape and shared by
// copies of the Buffer (a Buffer stays a small comparable value).
type shapeInfo struct {
	dims []int
	key  ShapeKey
	prod int  // product of dims (valid only when ok)
	ok   bool // no negative dim and no overflow
}

// WithShape returns b carrying shape dims (copied): dims are torch sizes,
// outermost first; no dims is a 0-dim (scalar) shape of one element. The
// shape must describe b: no negative dim and a product equal to Len(). That
// is checked when b is used: every ProcessGroup op given a buffer whose
// shape does not fit fails with an *ArgError (ErrInvalidArgument) naming
// the shape and the length, before anything is sent; CheckShape reports
// the same at any time. Slice returns a view without a shape.
//
// Cost: WithShape allocates once; ops on shaped buffers allocate nothing
// more, and buffers without a shape pay nothing.
func (b Buffer) WithShape(dims ...int) Buffer {
	s := &shapeInfo{dims: append(make([]int, 0, len(dims)), dims...), ok: true, prod: 1}
	for _, d := range dims {
		if d < 0 {
			s.ok = false
			break
		}
		hi, lo := bits.Mul64(uint64(s.prod), uint64(d))
		if hi != 0 || lo > math.MaxInt {
			s.ok = false
			break
		}
		s.prod = int(lo)
	}
	s.key = shapeKeyOf(s.dims)
	b.shape = s
	return b
}

// Shape is the buffer's shape (a copy), or nil when it has none (a 1-D
// buffer of Len elements). A 0-dim shape is an empty, non-nil slice.
func (b Buffer) Shape() []int {
	if b.shape == nil {
		return nil
	}
	return append(make([]int, 0, len(b.shape.dims)), b.shape.dims...)
}

// HasShape reports whether WithShape gave b a shape.
func (b Buffer) HasShape() bool { return b.shape != nil }

// ShapeKey is the shape as Fingerprint carries it (see ShapeKeyOf).
func (b Buffer) ShapeKey() ShapeKey {
	if b.shape == nil {
		return 0
	}
	return b.shape.key
}

// CheckShape reports whether b's shape describes it: nil when b has no
// shape or one with no negative dim whose product is Len(); otherwise an
// error wrapping ErrInvalidArgument naming the shape and the length.
func (b Buffer) CheckShape() error {
	if msg := b.shapeProblem(); msg != "" {
		return fmt.Errorf("%w: %s", ErrInvalidArgument, msg)
	}
	return nil
}

// shapeProblem is CheckShape's message, or "" (no allocation when fine).
func (b Buffer) shapeProblem() string {
	s := b.shape
	if s == nil || (s.ok && s.prod == b.count) {
		return ""
	}
	for _, d := range s.dims {
		if d < 0 {
			return fmt.Sprintf("shape %v has a negative dimension %d", FormatShape(s.dims), d)
		}
	}
	if !s.ok {
		return fmt.Sprintf("shape %v has more elements than an int holds", FormatShape(s.dims))
	}
	return fmt.Sprintf("shape %v holds %d elements but the buffer has %d (shape '%v' is invalid for input of size %d)",
		FormatShape(s.dims), s.prod, b.count, FormatShape(s.dims), b.count)
}

// FormatShape writes dims as torch prints a size: "[3, 4]", "[]" for a
// scalar.
func FormatShape(dims []int) string {
	var sb strings.Builder
	sb.WriteByte('[')
	for i, d := range dims {
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprint(&sb, d)
	}
	sb.WriteByte(']')
	return sb.String()
}

// ShapeKey is a buffer shape reduced to 64 bits for the Fingerprint (it
// travels in every message header of the CPU engine). 0 means no shape or
// a 1-D one: the count already says all a 1-D shape says. Other shapes
// with up to 6 dimensions whose leading dimensions fit are packed exactly
// (the last dimension follows from the count), so Dims can print them;
// the rest are a 61-bit FNV-1a hash of the dimensions.
//
// Layout: the top 3 bits are the kind (0: none or 1-D; 1: 0-dim; 2..6:
// that many dimensions, the leading ones packed in 61/(kind-1)-bit fields
// from the low end; 7: hashed).
type ShapeKey uint64

const (
	shapeKindShift = 61
	shapeKindHash  = 7
	shapeLowMask   = 1<<shapeKindShift - 1
)

// ShapeKeyOf is the key of shape dims (ShapeKey's rules).
func ShapeKeyOf(dims []int) ShapeKey { return shapeKeyOf(dims) }

func shapeKeyOf(dims []int) ShapeKey {
	k := len(dims)
	switch {
	case k == 1:
		return 0
	case k == 0:
		return 1 << shapeKindShift
	case k <= 6:
		w := shapeKindShift / (k - 1)
		packed, fits := uint64(0), true
		for i, d := range dims[:k-1] {
			if d <= 0 || uint64(d) >= 1<<w {
				fits = false // a leading zero hides the last dim from the count
				break
			}
			packed |= uint64(d) << (uint(i) * uint(w))
		}
		if fits {
			return ShapeKey(uint64(k)<<shapeKindShift | packed)
		}
	}
	h := uint64(14695981039346656037)
	mix := func(v uint64) {
		for i := 0; i < 8; i++ {
			h ^= v & 0xff
			h *= 1099511628211
			v >>= 8
		}
	}
	mix(uint64(k))
	for _, d := range dims {
		mix(uint64(d))
	}
	return ShapeKey(shapeKindHash<<shapeKindShift | h&shapeLowMask)
}

// Dims recovers the shape from a key and the element count it went with:
// the dims and true for 0-dim and packed shapes; nil and true for no shape
// (or 1-D); nil and false for a hashed one.
func (k ShapeKey) Dims(count int64) ([]int, bool) {
	kind := int(k >> shapeKindShift)
	switch kind {
	case 0:
		return nil, true
	case 1:
		return []int{}, true
	case shapeKindHash:
		return nil, false
	}
	w := shapeKindShift / (kind - 1)
	dims := make([]int, kind)
	prod := int64(1)
	for i := 0; i < kind-1; i++ {
		dims[i] = int((uint64(k) >> (uint(i) * uint(w))) & (1<<w - 1))
		prod *= int64(dims[i])
	}
	if prod > 0 {
		dims[kind-1] = int(count / prod)
	}
	return dims, true
}

// format is the shape as fingerprints print it: "[3, 4]", or
// "[#1a2b3c4d5e6f7]" for a hashed key; "" for none.
func (k ShapeKey) format(count int64) string {
	if k == 0 {
		return ""
	}
	if d, ok := k.Dims(count); ok {
		return FormatShape(d)
	}
	return fmt.Sprintf("[#%x]", uint64(k)&shapeLowMask)
}

// combineShapeKeys folds the shape keys of a coalesced op's children into
// one hashed key (0 when none has a shape), so that the closing agreement
// of a coalesced op also compares its children's shapes.
func combineShapeKeys(children []*Op) ShapeKey {
	h, any := uint64(14695981039346656037), false
	for _, c := range children {
		any = any || c.FP.Shape != 0
		v := uint64(c.FP.Shape)
		for i := 0; i < 8; i++ {
			h ^= v & 0xff
			h *= 1099511628211
			v >>= 8
		}
	}
	if !any {
		return 0
	}
	return ShapeKey(shapeKindHash<<shapeKindShift | h&shapeLowMask)
}
