package kernel

import (
	"encoding/binary"

	"github.com/ranktree/ranktree/comm"
)

// SWAR ("SIMD within a register") loops: the narrow integer and bool
// reductions work on 8 bytes at a time in a uint64, which the compiler
// loads and stores with single unaligned moves. Each handles the whole
// 8-byte words of dst and returns how many bytes it did; the caller
// finishes the tail with the element loops.

var native = binary.NativeEndian

// Lane high-bit masks: bit 7 of every byte, bit 31 of every 32-bit lane.
const (
	hiBytes  = 0x8080808080808080
	hiLanes  = 0x8000000080000000
	lowBytes = 0x0101010101010101
	low7     = 0x7f7f7f7f7f7f7f7f
)

// addLanesSWAR adds lane-wise with wrap-around, lanes marked by their high
// bits h (hiBytes: int8/uint8, hiLanes: int32): the low bits of each lane
// are added without carrying out of the lane, and the lane's top bit is the
// xor of both top bits and that carry.
func addLanesSWAR(d, s []byte, h uint64) int {
	n := len(d) &^ 7
	s = s[:len(d)]
	for i := 0; i < n; i += 8 {
		a, b := native.Uint64(d[i:]), native.Uint64(s[i:])
		native.PutUint64(d[i:], ((a&^h)+(b&^h))^((a^b)&h))
	}
	return n
}

// bitwiseSWAR applies and/or/xor to whole words (the same for every
// integer width).
func bitwiseSWAR(d, s []byte, t comm.RedOpType) int {
	n := len(d) &^ 7
	s = s[:len(d)]
	switch t {
	case comm.RedBAnd:
		for i := 0; i < n; i += 8 {
			native.PutUint64(d[i:], native.Uint64(d[i:])&native.Uint64(s[i:]))
		}
	case comm.RedBOr:
		for i := 0; i < n; i += 8 {
			native.PutUint64(d[i:], native.Uint64(d[i:])|native.Uint64(s[i:]))
		}
	case comm.RedBXor:
		for i := 0; i < n; i += 8 {
			native.PutUint64(d[i:], native.Uint64(d[i:])^native.Uint64(s[i:]))
		}
	default:
		return 0
	}
	return n
}

// truth maps each byte of x to 1 if it is non-zero, else 0: adding 0x7f to
// the low 7 bits sets bit 7 exactly when they are non-zero, or-ing x adds
// bytes whose own bit 7 is set.
func truth(x uint64) uint64 {
	return (((x & low7) + low7) | x) >> 7 & lowBytes
}

// boolSWAR reduces bool bytes (any non-zero byte is true) to 0/1 bytes.
// t is already mapped by ForDType: Max or BOr is or, Min or BAnd is and.
func boolSWAR(d, s []byte, t comm.RedOpType) int {
	n := len(d) &^ 7
	s = s[:len(d)]
	switch t {
	case comm.RedMax, comm.RedBOr:
		for i := 0; i < n; i += 8 {
			native.PutUint64(d[i:], truth(native.Uint64(d[i:])|native.Uint64(s[i:])))
		}
	case comm.RedMin, comm.RedBAnd:
		for i := 0; i < n; i += 8 {
			native.PutUint64(d[i:], truth(native.Uint64(d[i:]))&truth(native.Uint64(s[i:])))
		}
	case comm.RedBXor:
		for i := 0; i < n; i += 8 {
			native.PutUint64(d[i:], truth(native.Uint64(d[i:]))^truth(native.Uint64(s[i:])))
		}
	default:
		return 0
	}
	return n
}

// reduceIntBytes reduces an aligned integer buffer: the word-wise SWAR loop
// where one applies, then the element loop for the rest.
func reduceIntBytes[T integer](dst, src []byte, t comm.RedOpType, lanes uint64) {
	done := 0
	switch {
	case t == comm.RedBAnd || t == comm.RedBOr || t == comm.RedBXor:
		done = bitwiseSWAR(dst, src, t)
	case t == comm.RedSum && lanes != 0:
		done = addLanesSWAR(dst, src, lanes)
	}
	reduceInt(view[T](dst[done:]), view[T](src[done:]), t)
}

// reduceBoolBytes is reduceIntBytes for bool.
func reduceBoolBytes(dst, src []byte, t comm.RedOpType) {
	done := boolSWAR(dst, src, t)
	reduceBool(dst[done:], src[done:], t)
}
