package launcher

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// nestedModules writes an outer module with a nested module inside it
// (inner/, its own go.mod) holding a main package, and returns the
// outer root.
func nestedModules(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	write := func(rel, body string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/outer\n\ngo 1.22\n")
	write("inner/go.mod", "module example.com/outer/inner\n\ngo 1.22\n")
	write("inner/cmd/hello/main.go", "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello from inner\") }\n")
	return root
}

// TestBuildTargetNestedModule: a local package is built from the root of
// the module that contains it, relative to that root.
func TestBuildTargetNestedModule(t *testing.T) {
	root := nestedModules(t)
	dir, target := buildTarget(filepath.Join(root, "inner", "cmd", "hello"))
	if dir != filepath.Join(root, "inner") || target != "./cmd/hello" {
		t.Fatalf("buildTarget = %q, %q; want %q, ./cmd/hello", dir, target, filepath.Join(root, "inner"))
	}
	dir, target = buildTarget(filepath.Join(root, "inner", "cmd", "hello", "main.go"))
	if dir != filepath.Join(root, "inner") || target != "./cmd/hello/main.go" {
		t.Fatalf("buildTarget(file) = %q, %q", dir, target)
	}
	if dir, target := buildTarget("example.com/some/pkg"); dir != "" || target != "example.com/some/pkg" {
		t.Fatalf("import path: %q, %q", dir, target)
	}
}

// TestResolveProgramNestedModule: rankrunner started in the outer module
// builds and runs a package of the nested module (which `go build
// ./inner/cmd/hello` from the outer module refuses).
func TestResolveProgramNestedModule(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build")
	}
	root := nestedModules(t)
	t.Chdir(root)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin, cleanup, err := resolveProgram(ctx, "./inner/cmd/hello", zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	out, err := exec.Command(bin).CombinedOutput()
	if err != nil || string(out) != "hello from inner\n" {
		t.Fatalf("running the built program: %v %q", err, out)
	}
}
