package launcher

import (
	"bytes"
	"io"
	"strings"
	"sync"
	"testing"
)

func TestPumpPrefixesLines(t *testing.T) {
	var buf bytes.Buffer
	con := &console{w: &buf}
	p := pump{prefix: rankPrefix(3, false), con: con}
	p.run(strings.NewReader("a\nbb\nno newline"))
	if got, want := buf.String(), "[rank 3] a\n[rank 3] bb\n[rank 3] no newline\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if c := string(rankPrefix(1, true)); !strings.Contains(c, "\x1b[") || !strings.Contains(c, "[rank 1]") {
		t.Fatalf("coloured prefix %q", c)
	}
}

// TestPumpLinesNeverInterleave: many ranks writing at once produce whole lines.
func TestPumpLinesNeverInterleave(t *testing.T) {
	var buf bytes.Buffer
	con := &console{w: &buf}
	var wg sync.WaitGroup
	line := strings.Repeat("x", 1000) + "\n"
	for r := 0; r < 8; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pump{prefix: rankPrefix(r, false), con: con}.run(strings.NewReader(strings.Repeat(line, 50)))
		}()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 400 {
		t.Fatalf("%d lines, want 400", len(lines))
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "[rank ") || !strings.HasSuffix(l, "] "+line[:len(line)-1]) {
			t.Fatalf("mangled line %.60q", l)
		}
	}
}

// BenchmarkPumpLines measures prefixing throughput: 100-byte lines from one
// rank to the console (the cost rankrunner adds to a chatty rank's output).
func BenchmarkPumpLines(b *testing.B) {
	line := strings.Repeat("y", 99) + "\n"
	data := strings.Repeat(line, 10000)
	con := &console{w: io.Discard}
	p := pump{prefix: rankPrefix(7, false), con: con}
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p.run(strings.NewReader(data))
	}
}
