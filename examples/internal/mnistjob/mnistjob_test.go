package mnistjob

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseChecksOptions(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--epochs", "0"}, "--epochs 0"},
		{[]string{"--batch-size", "0"}, "--batch-size 0"},
		{[]string{"--lr", "-1"}, "--lr -1"},
		{[]string{"--threads", "-2"}, "--threads"},
	} {
		fs, o := NewFlagSet("x-mnist", 0.1, "lr", "threads")
		err := o.Parse(fs, tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "x-mnist:") {
			t.Errorf("%v: %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
	fs, o := NewFlagSet("x-mnist", 0.1, "lr", "threads")
	extra := fs.Float64("momentum", 0.9, "")
	if err := o.Parse(fs, []string{"--epochs", "2", "--momentum", "0.5"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if o.Epochs != 2 || o.Batch != 128 || o.LR != 0.1 || *extra != 0.5 {
		t.Fatalf("parsed %+v momentum %v", o, *extra)
	}
}

// TestEmitWritesEveryRank: with "{rank}" in --json-out every rank writes
// its own report; without it only rank 0 does.
func TestEmitWritesEveryRank(t *testing.T) {
	dir := t.TempDir()
	o := &Options{Name: "x", JSONOut: filepath.Join(dir, "r{rank}.json")}
	rep := Report{Rank: 1, WorldSize: 2, SamplesPerSec: 123, CommFraction: 0.05, ParamHash: "00ff"}
	if err := rep.Emit(o); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "r1.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got["samples_per_sec"] != 123.0 || got["comm_fraction"] != 0.05 || got["param_hash"] != "00ff" {
		t.Fatalf("report %s", b)
	}
	if _, ok := got["forward_seconds"]; ok {
		t.Fatalf("zero forward_seconds written: %s", b)
	}
	o.JSONOut = filepath.Join(dir, "one.json")
	if err := rep.Emit(o); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(o.JSONOut); !os.IsNotExist(err) {
		t.Fatalf("rank 1 wrote a rank-0-only report: %v", err)
	}
}

func TestParamHash(t *testing.T) {
	a, b, c := NewParamHash(), NewParamHash(), NewParamHash()
	a.Add([]float32{1, 2})
	b.Add([]float32{1, 2})
	c.Add([]float32{1, 2.0000002})
	if a.String() != b.String() || a.String() == c.String() || len(a.String()) != 16 {
		t.Fatalf("hashes %s %s %s", a, b, c)
	}
}

func TestDefaultThreads(t *testing.T) {
	cases := []struct {
		env           string
		cpus, localWS int
		want          int
	}{
		// rankrunner on 16 CPUs with 2 ranks sets GOMAXPROCS=8 and binds
		// each rank to 8 CPUs (NumCPU 8): the rank keeps 8, not 8/2.
		{"8", 8, 2, 8},
		{"", 16, 2, 8}, // no launcher: split the node's CPUs
		{"", 1, 2, 1},  // never below 1
		{"0", 4, 1, 4}, // not a positive count: ignored
		{"x", 4, 2, 2}, // malformed: ignored
		{"", 4, 0, 4},  // local world size unknown
	}
	for _, c := range cases {
		if got := defaultThreads(c.env, c.cpus, c.localWS); got != c.want {
			t.Errorf("defaultThreads(%q, %d, %d) = %d, want %d", c.env, c.cpus, c.localWS, got, c.want)
		}
	}
}
