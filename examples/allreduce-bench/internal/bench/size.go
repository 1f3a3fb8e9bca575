package bench

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
)

// sizeUnits maps a size suffix to its multiplier. Binary multiples use the
// IEC names and nccl-tests' bare letters (K, M, G = 2^10, 2^20, 2^30); the SI
// names KB, MB, GB are powers of ten. Matching is case-sensitive only where
// it matters: "kb" and "KB" are both 1000, "k" and "K" both 1024.
var sizeUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1 << 10, "ki": 1 << 10, "kib": 1 << 10, "kb": 1e3,
	"m": 1 << 20, "mi": 1 << 20, "mib": 1 << 20, "mb": 1e6,
	"g": 1 << 30, "gi": 1 << 30, "gib": 1 << 30, "gb": 1e9,
}

// maxSize bounds one message: 1 TiB, far above any host buffer.
const maxSize = 1 << 40

// ParseSize parses a byte size such as "4", "4KiB", "64MiB", "1G" or "10MB"
// (see sizeUnits: K/Ki/KiB = 1024, KB = 1000). The size must be positive and
// at most 1 TiB. Errors name the offending text.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return !unicode.IsDigit(r) && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.TrimSpace(t[i:])
	}
	mult, ok := sizeUnits[strings.ToLower(unit)]
	if !ok || num == "" {
		return 0, fmt.Errorf("bench: bad size %q: want a number with an optional unit (B, K, KiB, KB, M, MiB, MB, G, GiB, GB)", s)
	}
	var v int64
	if strings.Contains(num, ".") {
		f, err := strconv.ParseFloat(num, 64)
		if err != nil {
			return 0, fmt.Errorf("bench: bad size %q: %v", s, err)
		}
		fv := f * float64(mult)
		if fv != float64(int64(fv)) {
			return 0, fmt.Errorf("bench: bad size %q: not a whole number of bytes", s)
		}
		if fv > maxSize {
			return 0, fmt.Errorf("bench: size %q is above the 1 TiB limit", s)
		}
		v = int64(fv)
	} else {
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n > maxSize/mult {
			return 0, fmt.Errorf("bench: size %q is not a number of bytes up to 1 TiB", s)
		}
		v = n * mult
	}
	if v <= 0 {
		return 0, fmt.Errorf("bench: size %q must be positive", s)
	}
	return v, nil
}

// ParseSizes parses a comma-separated list of sizes (ParseSize), where an
// item "A..B" expands to A, 2A, 4A, ... up to B (nccl-tests' -b A -e B -f 2).
// The result keeps the order given; empty items are errors.
func ParseSizes(list string) ([]int64, error) {
	var out []int64
	for _, item := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(item, "..")
		a, err := ParseSize(lo)
		if err != nil {
			return nil, err
		}
		if !isRange {
			out = append(out, a)
			continue
		}
		b, err := ParseSize(hi)
		if err != nil {
			return nil, err
		}
		if b < a {
			return nil, fmt.Errorf("bench: size range %q ends below its start", item)
		}
		for v := a; v <= b; v *= 2 {
			out = append(out, v)
		}
	}
	return out, nil
}

// FormatSize writes n bytes in the largest binary unit that divides it
// exactly ("4", "4KiB", "64MiB", "1536KiB").
func FormatSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + "GiB"
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + "KiB"
	}
	return strconv.FormatInt(n, 10)
}
