package transport

import (
	"os"
	"syscall"
	"testing"
	"unsafe"
)

// TestShmRingsPrefaulted checks that a mapped segment's pages are all
// resident as soon as it is mapped (MAP_POPULATE), on the creating and the
// opening side: first-touch page faults on the rings were the 1-8 KiB
// latency cliff of issue 15.
func TestShmRingsPrefaulted(t *testing.T) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	const ring = 1 << 20
	a, err := CreateShm("/dev/shm", ring)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Unmap()
	defer a.Unlink()
	b, err := OpenShm(a.Path, ring, false)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Unmap()
	for name, s := range map[string]*ShmLink{"creator": a, "opener": b} {
		pages := (len(s.mem) + os.Getpagesize() - 1) / os.Getpagesize()
		vec := make([]byte, pages)
		if _, _, errno := syscall.Syscall(syscall.SYS_MINCORE, uintptr(unsafe.Pointer(&s.mem[0])), uintptr(len(s.mem)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
			t.Fatalf("mincore: %v", errno)
		}
		missing := 0
		for _, v := range vec {
			if v&1 == 0 {
				missing++
			}
		}
		if missing != 0 {
			t.Errorf("%s: %d of %d pages of a fresh segment are not resident", name, missing, pages)
		}
	}
}

// TestTouchPagesKeepsContents: touching a mapping's pages (an atomic add
// of 0 to each page's first word) leaves every byte as it was, the last
// partial page's included.
func TestTouchPagesKeepsContents(t *testing.T) {
	ps := os.Getpagesize()
	size := 3*ps + 100
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	for i := range mem {
		mem[i] = byte(i*7 + 3)
	}
	touchPages(mem)
	touchPages(mem[:5]) // shorter than a word: nothing to touch
	for i := range mem {
		if mem[i] != byte(i*7+3) {
			t.Fatalf("byte %d is %d after touchPages, want %d", i, mem[i], byte(i*7+3))
		}
	}
}
