package launcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// ErrProgram is returned (wrapped in a *ProgramError) when PROGRAM is
// neither an executable nor a Go package that builds.
var ErrProgram = errors.New("launcher: cannot run program")

// ProgramError says why PROGRAM cannot be run; Output holds go build's output.
type ProgramError struct {
	Program string
	Msg     string
	Output  string
}

func (e *ProgramError) Error() string {
	s := fmt.Sprintf("launcher: cannot run %q: %s", e.Program, e.Msg)
	if e.Output != "" {
		s += "\n" + strings.TrimRight(e.Output, "\n")
	}
	return s
}

// Unwrap returns ErrProgram.
func (e *ProgramError) Unwrap() error { return ErrProgram }

// isGoPackage reports whether prog names a Go package rather than an
// executable: a directory, a .go file, or an import path such as
// example.com/train/cmd/train that is not a file.
func isGoPackage(prog string) (bool, error) {
	st, err := os.Stat(prog)
	switch {
	case err == nil && st.IsDir():
		return true, nil
	case err == nil && strings.HasSuffix(prog, ".go"):
		return true, nil
	case err == nil:
		if st.Mode()&0o111 == 0 {
			return false, &ProgramError{Program: prog, Msg: "file is not executable"}
		}
		return false, nil
	case !strings.Contains(prog, "/"):
		return false, nil // a command name, looked up in PATH
	case strings.HasPrefix(prog, "/") || strings.HasPrefix(prog, "./") || strings.HasPrefix(prog, "../"):
		return false, &ProgramError{Program: prog, Msg: "no such file or directory"}
	default:
		return true, nil // an import path
	}
}

// resolveProgram returns the executable to run for prog, building a Go
// package once with `go build` into a temporary directory (removed by
// cleanup). Executables are returned as absolute paths.
func resolveProgram(ctx context.Context, prog string, log zerolog.Logger) (path string, cleanup func(), err error) {
	cleanup = func() {}
	pkg, err := isGoPackage(prog)
	if err != nil {
		return "", cleanup, err
	}
	if !pkg {
		p, err := exec.LookPath(prog)
		if err != nil {
			return "", cleanup, &ProgramError{Program: prog, Msg: err.Error()}
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", cleanup, &ProgramError{Program: prog, Msg: err.Error()}
		}
		return abs, cleanup, nil
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", cleanup, &ProgramError{Program: prog, Msg: "it is a Go package but the go command is not in PATH"}
	}
	dir, err := os.MkdirTemp("", "rankrunner-build-")
	if err != nil {
		return "", cleanup, &ProgramError{Program: prog, Msg: err.Error()}
	}
	cleanup = func() { _ = os.RemoveAll(dir) }
	name := strings.TrimSuffix(filepath.Base(strings.TrimRight(prog, "/")), ".go")
	if name == "" || name == "." || name == ".." {
		name = "program"
	}
	out := filepath.Join(dir, name)
	start := time.Now()
	workDir, target := buildTarget(prog)
	cmd := exec.CommandContext(ctx, gobin, "build", "-o", out, target)
	cmd.Dir = workDir
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		cleanup()
		return "", func() {}, &ProgramError{Program: prog, Msg: "go build failed: " + err.Error(), Output: buf.String()}
	}
	log.Info().Str("package", prog).Str("module_dir", workDir).Str("binary", out).Dur("took", time.Since(start)).Msg("built Go package")
	return out, cleanup, nil
}

// buildTarget returns where to run `go build` for prog and what to pass
// it. A local package (a directory or a .go file) is built from the root
// of the module that contains it (the nearest folder above it with a
// go.mod), as "./<path inside that module>", so a package of a nested
// module (examples/gorgonia-mnist with its own go.mod) builds from any
// working directory, with that module's requirements. Import paths, and
// local paths outside any module, are built from the current directory
// ("" for workDir) as given.
func buildTarget(prog string) (workDir, target string) {
	st, err := os.Stat(prog)
	if err != nil {
		return "", prog
	}
	abs, err := filepath.Abs(prog)
	if err != nil {
		return "", prog
	}
	dir := abs
	if !st.IsDir() {
		dir = filepath.Dir(abs)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if fi, err := os.Stat(filepath.Join(d, "go.mod")); err == nil && !fi.IsDir() {
			rel, err := filepath.Rel(d, abs)
			if err != nil {
				return "", prog
			}
			return d, "./" + filepath.ToSlash(rel)
		}
		if parent := filepath.Dir(d); parent == d {
			return "", prog
		}
	}
}
