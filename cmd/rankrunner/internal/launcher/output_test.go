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

// TestPumpCarriageReturnsAndPartialWrites: a progress bar's "\r" redraws
// become lines of their own, "\r\n" ends one line, a line written in
// pieces (partial writes, even across the reader's buffer) comes out
// whole, and a 200 KiB line is never split.
func TestPumpCarriageReturnsAndPartialWrites(t *testing.T) {
	var buf bytes.Buffer
	con := &console{w: &buf}
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() { pump{prefix: rankPrefix(2, false), con: con}.run(pr); close(done) }()
	long := strings.Repeat("z", 200<<10)
	for _, w := range []string{"\r 10%", "\r 20%", "\r100%\n", "dos line\r\n", "par", "tial ", "line\n",
		long[:100<<10], long[100<<10:] + "\n", "\r", "\n", "last"} {
		if _, err := pw.Write([]byte(w)); err != nil {
			t.Fatal(err)
		}
	}
	pw.Close()
	<-done
	want := []string{"[rank 2]  10%", "[rank 2]  20%", "[rank 2] 100%", "[rank 2] dos line",
		"[rank 2] partial line", "[rank 2] " + long, "[rank 2] ", "[rank 2] last"}
	got := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(got) != len(want) {
		t.Fatalf("%d lines, want %d: %.300q", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d = %.80q, want %.80q", i, got[i], want[i])
		}
	}
	if strings.Contains(buf.String(), "\r") {
		t.Errorf("a carriage return reached the console")
	}
}
