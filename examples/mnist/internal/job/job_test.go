package job

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/examples/mnist/internal/memgroup"
	"github.com/ranktree/ranktree/examples/mnist/internal/train"
)

func TestParseFlags(t *testing.T) {
	o, err := ParseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Epochs != 3 || o.BatchSize != train.DefaultBatch || o.LR != train.DefaultLR || o.Momentum != train.DefaultMomentum || o.BucketCapMB != DefaultBucketCapMB || o.TrainLimit != 0 {
		t.Fatalf("defaults %+v", o)
	}
	o, err = ParseFlags([]string{"--epochs", "1", "--batch-size=64", "--lr", "0.1", "--seed", "9", "--bucket-cap-mb", "25", "--train-limit", "500", "--json-out", "m.json"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Epochs != 1 || o.BatchSize != 64 || o.LR != 0.1 || o.Seed != 9 || o.BucketCapMB != 25 || o.TrainLimit != 500 || o.JSONOut != "m.json" {
		t.Fatalf("parsed %+v", o)
	}
	for _, bad := range [][]string{{"--bucket-cap-mb", "0"}, {"--train-limit", "-1"}, {"--nope"}, {"extra"}} {
		if _, err := ParseFlags(bad, io.Discard); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	if _, err := ParseFlags([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

// TestTwoRankJob runs the whole program path for 2 ranks in one process
// (the in-process group stands in for ranktree.Init's world group): one
// short epoch on a subset, rank 0 prints the bar and the summary, rank 1
// prints nothing, every rank writes its JSON report, the reports agree on
// the parameter hash and accuracy clears a floor.
func TestTwoRankJob(t *testing.T) {
	dir := t.TempDir()
	o, err := ParseFlags([]string{"--epochs", "1", "--train-limit", "6400", "--json-out", filepath.Join(dir, "m{rank}.json"), "--params-out", filepath.Join(dir, "p.bin")}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	w := memgroup.New(2)
	var out, errOut [2]bytes.Buffer
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[r] = Run(context.Background(), o, w.Group(r), zerolog.Nop(), &out[r], &errOut[r])
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if !strings.Contains(out[0].String(), "test accuracy") || !strings.Contains(errOut[0].String(), "samples/s") {
		t.Errorf("rank 0 output:\n%s\n%s", out[0].String(), errOut[0].String())
	}
	if out[1].Len()+errOut[1].Len() != 0 {
		t.Errorf("rank 1 printed %q / %q", out[1].String(), errOut[1].String())
	}
	var reps [2]Report
	for r := range 2 {
		b, err := os.ReadFile(filepath.Join(dir, "m"+string(rune('0'+r))+".json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &reps[r]); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("rank 0 report: accuracy %.4f, %.0f samples/s, hash %s", reps[0].Accuracy, reps[0].SamplesPerSec, reps[0].ParamHash)
	if reps[0].ParamHash == "" || reps[0].ParamHash != reps[1].ParamHash {
		t.Fatalf("hashes %q and %q", reps[0].ParamHash, reps[1].ParamHash)
	}
	params, err := os.ReadFile(filepath.Join(dir, "p.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if h := fnv.New64a(); len(params) != 4*235146 {
		t.Errorf("params file has %d bytes, want %d", len(params), 4*235146)
	} else if h.Write(params); fmt.Sprintf("%016x", h.Sum64()) != reps[0].ParamHash {
		t.Errorf("params file hashes to %016x, report says %s", h.Sum64(), reps[0].ParamHash)
	}
	if reps[0].WorldSize != 2 || reps[0].TrainSamples != 6400 || reps[0].Steps != 50 || reps[0].TestSamples != 10000 {
		t.Errorf("report %+v", reps[0])
	}
	if reps[0].Accuracy < 0.88 {
		t.Errorf("accuracy %.4f after one epoch on 6400 samples, want ≥ 0.88", reps[0].Accuracy)
	}
}

func TestOutPath(t *testing.T) {
	for _, c := range []struct {
		flag string
		rank int
		want string
	}{
		{"", 0, ""}, {"m.json", 0, "m.json"}, {"m.json", 1, ""}, {"m{rank}.json", 0, "m0.json"}, {"d/{rank}/m.json", 3, "d/3/m.json"},
	} {
		if got := outPath(c.flag, c.rank); got != c.want {
			t.Errorf("outPath(%q, %d) = %q, want %q", c.flag, c.rank, got, c.want)
		}
	}
}
