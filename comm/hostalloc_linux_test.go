package comm

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// thpEnabled reports whether the kernel gives transparent huge pages to
// a process that asks (enabled is "always" or "madvise").
func thpEnabled() bool {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	return err == nil && !strings.Contains(string(b), "[never]")
}

// anonHugeKB is the AnonHugePages (kB) of the mapping of this process
// that holds addr, from /proc/self/smaps.
func anonHugeKB(t *testing.T, addr uintptr) int {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	defer f.Close()
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if lo, hi, ok := strings.Cut(fields[0], "-"); ok && !strings.HasSuffix(fields[0], ":") {
			l, err1 := strconv.ParseUint(lo, 16, 64)
			h, err2 := strconv.ParseUint(hi, 16, 64)
			in = err1 == nil && err2 == nil && uint64(addr) >= l && uint64(addr) < h
			continue
		}
		if in && fields[0] == "AnonHugePages:" && len(fields) >= 2 {
			kb, err := strconv.Atoi(fields[1])
			if err != nil {
				t.Fatalf("smaps: %q: %v", sc.Text(), err)
			}
			return kb
		}
	}
	t.Fatalf("no mapping of /proc/self/smaps holds %#x", addr)
	return 0
}

// TestNewHostBufferHugePages: a buffer of 2 MiB or more starts on a 2 MiB
// boundary, is zero, holds what is written after a collection, and, where
// the kernel gives huge pages, its whole 2 MiB pages are huge; a smaller
// one is an ordinary allocation.
func TestNewHostBufferHugePages(t *testing.T) {
	small := NewHostBuffer(Float32, 1000)
	if small.Len() != 1000 || len(small.Bytes()) != 4000 {
		t.Fatalf("small buffer: %d elements, %d bytes", small.Len(), len(small.Bytes()))
	}
	const count = (5<<20 + 100) / 8 // 5 MiB and a bit: two whole huge pages
	b := NewHostBuffer(Float64, count)
	ptr := unsafe.Pointer(unsafe.SliceData(b.Bytes()))
	p := uintptr(ptr)
	if p%HugePageBytes != 0 {
		t.Fatalf("a %d-byte buffer starts at %#x, not on a 2 MiB boundary", b.NumBytes(), p)
	}
	for i, v := range b.Bytes() {
		if v != 0 {
			t.Fatalf("byte %d of a new buffer is %d", i, v)
		}
	}
	runtime.GC()
	f := unsafe.Slice((*float64)(ptr), count)
	for i := range f {
		f[i] = float64(i)
	}
	runtime.GC()
	for i, v := range f {
		if v != float64(i) {
			t.Fatalf("element %d is %v after a collection", i, v)
		}
	}
	if !thpEnabled() {
		t.Skip("transparent huge pages are turned off on this host")
	}
	if kb := anonHugeKB(t, p); kb < 4096 {
		t.Fatalf("the buffer's mapping has %d kB in huge pages, want at least 4096 (its two whole 2 MiB pages)", kb)
	}
	runtime.KeepAlive(b)
}

// TestHugePagesPresent: memory whose 4 KiB pages are already there (Go
// memory reused, which the runtime zeroed) is collapsed into huge pages
// (hugePages' MADV_COLLAPSE step).
func TestHugePagesPresent(t *testing.T) {
	if !thpEnabled() {
		t.Skip("transparent huge pages are turned off on this host")
	}
	words := make([]uint64, 3*HugePageBytes/8)
	for i := range words {
		words[i] = 1 // every 4 KiB page present
	}
	p := unsafe.Pointer(&words[0])
	p = unsafe.Add(p, -int(uintptr(p))&(HugePageBytes-1))
	if err := hugePages(p, HugePageBytes); err != nil {
		t.Skipf("MADV_COLLAPSE: %v (Linux 6.1 or later collapses present pages)", err)
	}
	if kb := anonHugeKB(t, uintptr(p)); kb < 2048 {
		t.Fatalf("%d kB in huge pages after hugePages on 2 MiB of present pages, want 2048", kb)
	}
	if got := *(*uint64)(p); got != 1 {
		t.Fatalf("a collapsed page lost its contents: %d, want 1", got)
	}
	runtime.KeepAlive(words)
}
