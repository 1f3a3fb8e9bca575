package nccl

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cuda"
)

// TestWheelCandidates: the pip wheel's lib folder is found under
// $VIRTUAL_ENV (and the other prefixes) without asking python3.
func TestWheelCandidates(t *testing.T) {
	venv := t.TempDir()
	lib := filepath.Join(venv, "lib", "python3.12", "site-packages", "nvidia", "nccl", "lib")
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	so := filepath.Join(lib, "libnccl.so.2")
	if err := os.WriteFile(so, []byte("not really"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("VIRTUAL_ENV", venv)
	found := false
	for _, p := range wheelCandidates(false) {
		if p == so {
			found = true
		}
	}
	if !found {
		t.Fatalf("wheelCandidates(false) = %v; want it to include %s", wheelCandidates(false), so)
	}
	// A consolidated folder (nvidia/cu13/lib) is found too, after nccl's own.
	cu13 := filepath.Join(venv, "lib", "python3.12", "site-packages", "nvidia", "cu13", "lib")
	if err := os.MkdirAll(cu13, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cu13, "libnccl.so.2"), []byte("not really"), 0o644); err != nil {
		t.Fatal(err)
	}
	got := wheelCandidates(false)
	if i, j := slices.Index(got, so), slices.Index(got, filepath.Join(cu13, "libnccl.so.2")); i < 0 || j < i {
		t.Fatalf("wheelCandidates(false) = %v; want %s, then the cu13 folder's", got, so)
	}
	// Opening the bogus file fails with a LoadError naming it.
	_, err := Open(so)
	var le *cuda.LoadError
	if !errors.As(err, &le) || !errors.Is(err, comm.ErrUnsupported) || le.Tried[0] != so {
		t.Fatalf("Open(bogus) = %v", err)
	}
}
