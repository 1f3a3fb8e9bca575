package comm

import "math"

func bf16FromBits(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN: keep it quiet and non-zero
		return uint16(u>>16) | 0x40
	}
	// round to nearest even
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

func bf16ToF32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }
