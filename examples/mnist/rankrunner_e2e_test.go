package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/internal/testrank"
)

// TestMainJobThroughRankrunner is issue 7's end-to-end test: the main job
// exactly as users start it (rankrunner, embedded NATS, 2 ranks, the CPU
// engine, the DDP reducer), for one short epoch on a subset. Every rank
// writes its report; the test asserts an accuracy floor and identical final
// parameters on both ranks.
func TestMainJobThroughRankrunner(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs rankrunner with 2 processes")
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	runner := filepath.Join(dir, "rankrunner")
	build := exec.CommandContext(ctx, "go", "build", "-o", runner, "github.com/ranktree/ranktree/cmd/rankrunner")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building rankrunner: %v\n%s", err, out)
	}
	cmd := exec.CommandContext(ctx, runner, "--nproc-per-node", "2", "github.com/ranktree/ranktree/examples/mnist",
		"--epochs", "1", "--train-limit", "6400", "--json-out", filepath.Join(dir, "m{rank}.json"))
	cmd.Env = testrank.LauncherEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("rankrunner: %v\n%s", err, out)
	}
	// Ranks write to pipes: rank 0's progress is plain lines, each whole
	// under its prefix, never a bar's carriage returns.
	if strings.Contains(string(out), "\r") {
		t.Errorf("carriage returns in the output of a run that is not on a terminal:\n%q", out)
	}
	if !regexp.MustCompile(`(?m)^\[rank 0\] epoch 1/1 step \d+ samples 6400/6400 \(100%\) samples/s \d+ loss [0-9.]+ eta \S+ done in `).Match(out) {
		t.Errorf("no plain epoch-end progress line from rank 0:\n%s", out)
	}
	type report struct {
		Rank      int     `json:"rank"`
		WorldSize int     `json:"world_size"`
		Accuracy  float64 `json:"accuracy"`
		ParamHash string  `json:"param_hash"`
	}
	var reps [2]report
	for r := range reps {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("m%d.json", r)))
		if err != nil {
			t.Fatalf("rank %d wrote no report: %v\n%s", r, err, out)
		}
		if err := json.Unmarshal(b, &reps[r]); err != nil {
			t.Fatalf("rank %d report: %v", r, err)
		}
		if reps[r].Rank != r || reps[r].WorldSize != 2 {
			t.Errorf("rank %d report says rank %d of %d", r, reps[r].Rank, reps[r].WorldSize)
		}
	}
	if reps[0].ParamHash == "" || reps[0].ParamHash != reps[1].ParamHash {
		t.Errorf("final parameter hashes differ: rank 0 %q, rank 1 %q", reps[0].ParamHash, reps[1].ParamHash)
	}
	if reps[0].Accuracy < 0.85 {
		t.Errorf("test accuracy %.4f after one epoch on 6400 samples, want ≥ 0.85", reps[0].Accuracy)
	}
}
