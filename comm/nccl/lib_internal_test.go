package nccl

import (
	"errors"
	"os"
	"path/filepath"
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
	// Opening the bogus file fails with a LoadError naming it.
	_, err := Open(so)
	var le *cuda.LoadError
	if !errors.As(err, &le) || !errors.Is(err, comm.ErrUnsupported) || le.Tried[0] != so {
		t.Fatalf("Open(bogus) = %v", err)
	}
}
