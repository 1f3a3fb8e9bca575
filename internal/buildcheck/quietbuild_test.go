package buildcheck

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// allowedCgo are the non-standard packages with cgo files that ranktree's
// programs may link; each one was checked to compile without a warning.
var allowedCgo = map[string]bool{
	"github.com/ebitengine/purego/internal/cgo": true,
}

// moduleRoot is the repository root (two levels up from this package).
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// goCmd runs the go command in the module root with extra environment and
// returns stdout and stderr separately.
func goCmd(t *testing.T, env []string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = moduleRoot(t)
	cmd.Env = append(os.Environ(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// mainPackages lists the module's main packages.
func mainPackages(t *testing.T) []string {
	t.Helper()
	out, stderr, err := goCmd(t, nil, "list", "-f", `{{if eq .Name "main"}}{{.ImportPath}}{{end}}`, "./...")
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	return strings.Fields(out)
}

// cgoDeps lists the packages with cgo files that pkgs link: standard ones
// and others apart.
func cgoDeps(t *testing.T, pkgs []string) (std, other []string) {
	t.Helper()
	args := append([]string{"list", "-deps", "-f", `{{if .CgoFiles}}{{.ImportPath}} {{.Standard}}{{end}}`}, pkgs...)
	out, stderr, err := goCmd(t, nil, args...)
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, stderr)
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 || seen[f[0]] {
			continue
		}
		seen[f[0]] = true
		if f[1] == "true" {
			std = append(std, f[0])
		} else {
			other = append(other, f[0])
		}
	}
	sort.Strings(std)
	sort.Strings(other)
	return std, other
}

// TestNoUnexpectedCgo: the main packages link no cgo package outside the
// standard library except allowedCgo. A new one (go-nvml coming back, a
// cgo binding) must be checked for build warnings and listed.
func TestNoUnexpectedCgo(t *testing.T) {
	mains := mainPackages(t)
	if len(mains) < 3 {
		t.Fatalf("found only %d main packages: %v", len(mains), mains)
	}
	_, other := cgoDeps(t, mains)
	for _, p := range other {
		if !allowedCgo[p] {
			t.Errorf("%s has cgo files and is linked into a program; its first build may print warnings (issue 18)", p)
		}
	}
}

// TestCgoPackagesBuildQuietly: with an empty build cache (a fresh
// machine), the cgo packages the programs link compile without printing
// anything. About 20 s on two cores.
func TestCgoPackagesBuildQuietly(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles the cgo packages with an empty build cache")
	}
	std, other := cgoDeps(t, mainPackages(t))
	pkgs := append(std, other...)
	if len(pkgs) == 0 {
		t.Skip("no cgo package linked (CGO_ENABLED=0?)")
	}
	_, stderr, err := goCmd(t, []string{"GOCACHE=" + t.TempDir(), "GOFLAGS=-mod=readonly"}, append([]string{"build"}, pkgs...)...)
	if err != nil {
		t.Fatalf("go build %v: %v\n%s", pkgs, err, stderr)
	}
	if stderr != "" {
		t.Errorf("building %v with an empty cache printed:\n%s", pkgs, stderr)
	}
}

// TestFreshBuildQuiet: every main package built with an empty build cache
// prints nothing on stderr. Several minutes on two cores: it runs only
// with RANKTREE_FULL_BUILD_CHECK=1.
func TestFreshBuildQuiet(t *testing.T) {
	if os.Getenv("RANKTREE_FULL_BUILD_CHECK") != "1" {
		t.Skip("RANKTREE_FULL_BUILD_CHECK=1 runs the full fresh-cache build (minutes)")
	}
	args := append([]string{"build", "-o", t.TempDir() + string(filepath.Separator)}, mainPackages(t)...)
	_, stderr, err := goCmd(t, []string{"GOCACHE=" + t.TempDir(), "GOFLAGS=-mod=readonly"}, args...)
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, stderr)
	}
	if stderr != "" {
		t.Errorf("a fresh build printed:\n%s", stderr)
	}
}
