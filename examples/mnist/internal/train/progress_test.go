package train

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/examples/mnist/internal/model"
)

// TestProgressPlainLinesWhenNotATerminal: with Progress not a terminal, a
// run writes whole plain lines (no carriage return, no ANSI escape), each
// with epoch, step, samples/s, loss and ETA, and one at each epoch's end.
func TestProgressPlainLinesWhenNotATerminal(t *testing.T) {
	tr, te := mnist(t)
	m, _ := model.New(model.MNISTSizes, 1)
	var buf bytes.Buffer
	cfg := baseConfig()
	cfg.Epochs = 2
	cfg.Progress = &buf
	cfg.ProgressEvery = time.Nanosecond // a line per step
	if _, err := Run(context.Background(), cfg, m, tr.Head(960), te.Head(10), &simRank{g: newSimGroup(1)}); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if strings.ContainsAny(out, "\r\x1b") {
		t.Fatalf("plain progress has carriage returns or escapes: %q", out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	steps := 960 / cfg.GlobalBatch
	if len(lines) < 2*steps {
		t.Fatalf("%d lines for 2 epochs of %d steps, want one per step and epoch end:\n%s", len(lines), steps, out)
	}
	for _, l := range lines {
		for _, f := range []string{"epoch ", " step ", " samples/s ", " loss ", " eta "} {
			if !strings.Contains(l, f) {
				t.Errorf("line %q lacks %q", l, f)
			}
		}
	}
	ends := 0
	for _, l := range lines {
		if strings.Contains(l, " done in ") {
			ends++
			if !strings.Contains(l, "samples 960/960 (100%)") {
				t.Errorf("epoch-end line %q does not show the whole epoch", l)
			}
		}
	}
	if ends != 2 {
		t.Errorf("%d epoch-end lines, want 2:\n%s", ends, out)
	}
}

// TestLineProgressIntervalAndETA: lines come at most every `every`, and
// the ETA covers the rest of this epoch and the later epochs at the
// current rate.
func TestLineProgressIntervalAndETA(t *testing.T) {
	var buf bytes.Buffer
	t0 := time.Unix(1000, 0)
	p := newProgress(&Config{Progress: &buf, Epochs: 3, ProgressEvery: 10 * time.Second}, 1, 1000, t0)
	p.update(t0.Add(5*time.Second), 100, 1, 2.5)  // before the interval: silent
	p.update(t0.Add(10*time.Second), 200, 2, 2.0) // 20 samples/s; 800 + 2×1000 left: 140s
	p.update(t0.Add(15*time.Second), 300, 3, 1.5) // silent again
	p.finish(t0.Add(50*time.Second), 1000, 10, 1.0)
	want := "epoch 1/3 step 2 samples 200/1000 (20%) samples/s 20 loss 2.0000 eta 2m20s\n" +
		"epoch 1/3 step 10 samples 1000/1000 (100%) samples/s 20 loss 1.0000 eta 1m40s done in 50s\n"
	if buf.String() != want {
		t.Errorf("got\n%q\nwant\n%q", buf.String(), want)
	}
}
