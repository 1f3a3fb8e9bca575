//go:build !amd64

package kernel

// useF16C is false off amd64: float16 conversion uses the portable loops.
var useF16C = false

func widenF16C(dst *float32, src *uint16, n int) { panic("kernel: F16C is amd64-only") }

func narrowF16C(dst *uint16, src *float32, n int) { panic("kernel: F16C is amd64-only") }

// useAVX2BF16 is false off amd64: bfloat16 conversion uses the portable loops.
var useAVX2BF16 = false

func widenBF16AVX2(dst *float32, src *uint16, n int) { panic("kernel: AVX2 is amd64-only") }

func narrowBF16AVX2(dst *uint16, src *float32, n int) { panic("kernel: AVX2 is amd64-only") }

// useAVXMinMax is false off amd64: Min and Max use the builtin loops.
var useAVXMinMax = false

func minF32AVX(d, s *float32, n int) { panic("kernel: AVX is amd64-only") }
func maxF32AVX(d, s *float32, n int) { panic("kernel: AVX is amd64-only") }
func minF64AVX(d, s *float64, n int) { panic("kernel: AVX is amd64-only") }
func maxF64AVX(d, s *float64, n int) { panic("kernel: AVX is amd64-only") }

func sumF16C(d, s *uint16, n int)     { panic("kernel: F16C is amd64-only") }
func sumBF16AVX2(d, s *uint16, n int) { panic("kernel: AVX2 is amd64-only") }
