package bench

import (
	"slices"
	"testing"
)

func TestParseSize(t *testing.T) {
	good := map[string]int64{
		"4": 4, "4B": 4, "4b": 4, " 8 ": 8, "4K": 4096, "4k": 4096, "4KiB": 4096, "4kib": 4096, "4Ki": 4096,
		"4KB": 4000, "64MiB": 64 << 20, "64M": 64 << 20, "10MB": 10e6, "1G": 1 << 30, "2GiB": 2 << 30,
		"1GB": 1e9, "1.5KiB": 1536, "0.5M": 512 << 10, "1024GiB": 1 << 40,
	}
	for in, want := range good {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "K", "0", "-4", "4XB", "4 KiBs", "1.1", "0.3K", "abc", "1..2", "99999999999999999999", "1025GiB", "2TB"} {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, got)
		}
	}
}

func TestParseSizes(t *testing.T) {
	got, err := ParseSizes("4,4KiB,1MiB..8MiB,64MiB")
	want := []int64{4, 4096, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 64 << 20}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("ParseSizes = %v, %v; want %v", got, err, want)
	}
	// A range whose end is not a power-of-two multiple stops below it.
	got, err = ParseSizes("3..20")
	if err != nil || !slices.Equal(got, []int64{3, 6, 12}) {
		t.Fatalf("ParseSizes(3..20) = %v, %v", got, err)
	}
	for _, in := range []string{"", "4,,8", "8..4", "4..x", "4,"} {
		if got, err := ParseSizes(in); err == nil {
			t.Errorf("ParseSizes(%q) = %v, want an error", in, got)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int64]string{4: "4", 1000: "1000", 4096: "4KiB", 1536 << 10: "1536KiB", 64 << 20: "64MiB", 3 << 30: "3GiB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
		if back, err := ParseSize(FormatSize(n)); err != nil || back != n {
			t.Errorf("ParseSize(FormatSize(%d)) = %d, %v", n, back, err)
		}
	}
}
