package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/ranktree/ranktree"
)

// TestStandaloneRun runs the program without rankrunner (RANK unset): a
// single rank over ranktree's real runtime with an in-memory store, one
// short epoch, JSON report written.
func TestStandaloneRun(t *testing.T) {
	if v, ok := os.LookupEnv(ranktree.EnvRank); ok {
		t.Setenv(ranktree.EnvRank, v) // restored after the test
		os.Unsetenv(ranktree.EnvRank)
	}
	out := filepath.Join(t.TempDir(), "m.json")
	if code := run([]string{"--epochs", "1", "--train-limit", "2560", "--json-out", out}); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Accuracy  float64 `json:"accuracy"`
		WorldSize int     `json:"world_size"`
		Steps     int     `json:"steps"`
		ParamHash string  `json:"param_hash"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.WorldSize != 1 || rep.Steps != 20 || len(rep.ParamHash) != 16 || rep.Accuracy < 0.75 {
		t.Fatalf("report %+v", rep)
	}
}

func TestBadFlagsExit2(t *testing.T) {
	if code := run([]string{"--bucket-cap-mb", "-1"}); code != 2 {
		t.Fatalf("exit status %d, want 2", code)
	}
}
