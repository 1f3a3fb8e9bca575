package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/internal/testrank"
)

// End-to-end tests of issue 16: the framework adapters (nested modules
// that root `go test ./...` does not enter), the framework examples under
// rankrunner from the repository root, and rankrunner installed with
// `go get -tool` in a user's own module.

// repoRoot is the repository root (this package lives in test/).
func repoRoot(t *testing.T) string {
	t.Helper()
	abs, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// goCmd runs the go command in dir with extra environment and returns its
// combined output.
func goCmd(ctx context.Context, t *testing.T, dir string, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(testrank.LauncherEnv(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestAdapterModules runs the unit tests of every adapter module
// (adapters/*: own go.mod), so CI covers them: the DDP parity tests among
// them.
func TestAdapterModules(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the framework adapters")
	}
	mods, _ := filepath.Glob(filepath.Join(repoRoot(t), "adapters", "*", "go.mod"))
	if len(mods) == 0 {
		t.Fatal("no adapter modules found under adapters/")
	}
	for _, m := range mods {
		dir := filepath.Dir(m)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
			defer cancel()
			out, err := goCmd(ctx, t, dir, nil, "test", "-count=1", "./...")
			if err != nil {
				t.Fatalf("go test ./... in %s: %v\n%s", dir, err, out)
			}
			t.Logf("%s", strings.TrimSpace(out))
		})
	}
}

// frameworkReport is the part of the examples' --json-out we check.
type frameworkReport struct {
	Rank         int     `json:"rank"`
	WorldSize    int     `json:"world_size"`
	Accuracy     float64 `json:"accuracy"`
	Steps        int     `json:"steps"`
	ParamHash    string  `json:"param_hash"`
	CommFraction float64 `json:"comm_fraction"`
}

// runFrameworkExample launches example (a nested module under examples/)
// with rankrunner from the repository root on 2 ranks, and returns both
// ranks' reports.
func runFrameworkExample(t *testing.T, example string, args ...string) [2]frameworkReport {
	t.Helper()
	runner, _ := rrBuild(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	argv := append([]string{"--nproc-per-node", "2", "./examples/" + example,
		"--json-out", filepath.Join(dir, "r{rank}.json")}, args...)
	cmd := exec.CommandContext(ctx, runner, argv...)
	cmd.Dir = repoRoot(t)
	cmd.Env = testrank.LauncherEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("rankrunner %s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	var reps [2]frameworkReport
	for r := range reps {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("r%d.json", r)))
		if err != nil {
			t.Fatalf("rank %d wrote no report: %v\n%s", r, err, out)
		}
		if err := json.Unmarshal(b, &reps[r]); err != nil {
			t.Fatalf("rank %d report: %v", r, err)
		}
		if reps[r].Rank != r || reps[r].WorldSize != 2 {
			t.Errorf("rank %d's report says rank %d of %d", r, reps[r].Rank, reps[r].WorldSize)
		}
	}
	if !strings.Contains(string(out), "samples/s") || !strings.Contains(string(out), "test accuracy") {
		t.Errorf("rank 0 printed no accuracy / samples/s line:\n%s", out)
	}
	if reps[0].ParamHash == "" || reps[0].ParamHash != reps[1].ParamHash {
		t.Errorf("final parameters differ: rank 0 %q, rank 1 %q", reps[0].ParamHash, reps[1].ParamHash)
	}
	return reps
}

// TestGorgoniaExampleThroughRankrunner: examples/gorgonia-mnist, its own
// module, runs with `rankrunner --nproc-per-node 2 ./examples/gorgonia-mnist`
// from the repository root on a small train limit; both ranks end with
// the same weights and learn.
func TestGorgoniaExampleThroughRankrunner(t *testing.T) {
	if testing.Short() {
		t.Skip("builds Gorgonia and runs 2 ranks")
	}
	reps := runFrameworkExample(t, "gorgonia-mnist", "--epochs", "1", "--train-limit", "6400")
	if reps[0].Steps != 50 {
		t.Errorf("%d steps, want 6400/128 = 50", reps[0].Steps)
	}
	if reps[0].Accuracy < 0.85 {
		t.Errorf("test accuracy %.4f after one epoch on 6400 samples, want ≥ 0.85", reps[0].Accuracy)
	}
}

// TestGoMLXExampleThroughRankrunner: examples/gomlx-mnist (its own
// module, GoMLX's pure-Go backend) runs under rankrunner from the
// repository root on a tiny train limit (simplego is slow); both ranks
// end with the same weights.
func TestGoMLXExampleThroughRankrunner(t *testing.T) {
	if testing.Short() {
		t.Skip("builds GoMLX and runs 2 ranks")
	}
	reps := runFrameworkExample(t, "gomlx-mnist", "--epochs", "1", "--train-limit", "1280", "--lr", "0.003")
	if reps[0].Steps != 10 {
		t.Errorf("%d steps, want 1280/128 = 10", reps[0].Steps)
	}
	if reps[0].Accuracy < 0.5 {
		t.Errorf("test accuracy %.4f after 10 steps, want ≥ 0.5 (chance is 0.1)", reps[0].Accuracy)
	}
}

// userProgram is a user's data-parallel program in their own module.
const userProgram = `package main

import (
	"context"
	"fmt"
	"os"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/ddp"
)

func main() {
	ctx := context.Background()
	rt, err := ddp.Init(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer rt.Close(ctx)
	w := []float32{float32(rt.Rank())}
	g := []float32{float32(rt.Rank() + 1)}
	m, err := ddp.Wrap(ctx, rt.World(), []ddp.Param{{Name: "w", Shape: []int{1},
		Value: func(fn func(comm.Buffer)) error { fn(comm.HostBuffer(w)); return nil },
		Grad:  func(fn func(comm.Buffer)) error { fn(comm.HostBuffer(g)); return nil }}}, ddp.Config{})
	if err == nil {
		err = m.Sync(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("user-train rank %d of %d: w=%v grad=%v\n", rt.Rank(), rt.WorldSize(), w[0], g[0])
}
`

// TestRankrunnerGoGetTool: in a throwaway module of its own (requiring
// ranktree through a replace directive to this repository),
// `go get -tool github.com/ranktree/ranktree/cmd/rankrunner` then
// `go tool rankrunner --nproc-per-node 2 ./cmd/train` builds and runs the
// user's program on 2 ranks (the README's instructions).
func TestRankrunnerGoGetTool(t *testing.T) {
	if testing.Short() {
		t.Skip("builds rankrunner in a new module")
	}
	root := repoRoot(t)
	mod := t.TempDir()
	gomod := fmt.Sprintf("module example.com/user\n\ngo 1.26.0\n\nrequire github.com/ranktree/ranktree v0.0.0-00010101000000-000000000000\n\nreplace github.com/ranktree/ranktree => %s\n", root)
	sum, err := os.ReadFile(filepath.Join(root, "go.sum")) // the hashes, so no checksum database is asked
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"go.mod": gomod, "go.sum": string(sum), "cmd/train/main.go": userProgram} {
		p := filepath.Join(mod, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// go get resolves the whole module graph, which may name modules that
	// building ranktree never fetched (cobra's go-md2man and mousetrap on a
	// fresh module cache): it may use the environment's module proxy, and
	// falls through to "off" on any error, since the proxy refuses to look
	// up ranktree's own paths (served here by the replace directive).
	getEnv := []string{"GOFLAGS=-mod=mod", "GOPROXY=" + fallThroughOff(t)}
	if out, err := goCmd(ctx, t, mod, getEnv, "get", "-tool", "github.com/ranktree/ranktree/cmd/rankrunner"); err != nil {
		t.Fatalf("go get -tool: %v\n%s", err, out)
	}
	b, _ := os.ReadFile(filepath.Join(mod, "go.mod"))
	if !strings.Contains(string(b), "tool github.com/ranktree/ranktree/cmd/rankrunner") {
		t.Fatalf("go.mod has no tool directive:\n%s", b)
	}
	env := []string{"GOFLAGS=-mod=mod", "GOPROXY=off"} // offline: everything comes from the module cache
	out, err := goCmd(ctx, t, mod, env, "tool", "rankrunner", "--nproc-per-node", "2", "./cmd/train")
	if err != nil {
		t.Fatalf("go tool rankrunner: %v\n%s", err, out)
	}
	for r := range 2 {
		want := fmt.Sprintf("user-train rank %d of 2: w=0 grad=1.5", r)
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// fallThroughOff is the proxies of the environment's GOPROXY list, each
// falling through to the next on any error ('|'), ending in "off" (no
// "direct": there is no network beside the module proxy).
func fallThroughOff(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOPROXY").Output()
	if err != nil {
		t.Fatalf("go env GOPROXY: %v", err)
	}
	var keep []string
	for _, p := range strings.FieldsFunc(strings.TrimSpace(string(out)), func(r rune) bool { return r == ',' || r == '|' }) {
		if p != "direct" && p != "off" {
			keep = append(keep, p)
		}
	}
	return strings.Join(append(keep, "off"), "|")
}
