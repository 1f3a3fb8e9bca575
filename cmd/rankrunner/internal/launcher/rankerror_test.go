package launcher

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestErrTail: the last error-looking stderr line wins; zerolog JSON lines
// count by level; a Go panic line is not replaced by its stack trace; with
// no error line the last line is shown as such.
func TestErrTail(t *testing.T) {
	feed := func(lines ...string) string {
		var tl errTail
		for _, l := range lines {
			tl.observe([]byte(l + "\n"))
		}
		return tl.get()
	}
	cases := []struct {
		name  string
		lines []string
		want  string
	}{
		{"none", nil, ""},
		{"plain", []string{"starting", "initprog: ranktree: rank 0: init barrier: rank 1 died", "bye"}, "initprog: ranktree: rank 0: init barrier: rank 1 died"},
		{"json error", []string{`{"level":"info","message":"error budget fine"}`, `{"level":"error","error":"comm: timeout","message":"watchdog fired"}`, `{"level":"info","message":"x"}`}, "watchdog fired: comm: timeout"},
		{"json info only", []string{`{"level":"info","message":"no error here"}`}, "(last stderr line) no error here"},
		{"panic", []string{"panic: runtime error: index out of range", "", "goroutine 1 [running]:", "main.fail(...)", "\t/x/errors.go:3"}, "panic: runtime error: index out of range"},
		{"colour", []string{"\x1b[31mERROR\x1b[0m disk full"}, "ERROR disk full"},
		{"no error line", []string{"a", "b"}, "(last stderr line) b"},
	}
	for _, c := range cases {
		if got := feed(c.lines...); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
	long := strings.Repeat("é", maxErrorLen)
	if got := feed("error " + long); len(got) > maxErrorLen+len("…") || !strings.HasSuffix(got, "…") {
		t.Errorf("long line not clipped: %d bytes", len(got))
	}
}

// TestRankErrorPrefersErrorFile: the error file's first line wins over
// stderr; a missing or empty file falls back to stderr.
func TestRankErrorPrefersErrorFile(t *testing.T) {
	var tl errTail
	tl.observe([]byte("error: from stderr\n"))
	path := filepath.Join(t.TempDir(), "err.txt")
	if got := rankError(path, &tl); got != "error: from stderr" {
		t.Fatalf("no file: %q", got)
	}
	if err := os.WriteFile(path, []byte("ranktree: rank 2: init barrier: rank 1 (signal: killed (SIGKILL)) died\nmore\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := rankError(path, &tl); got != "ranktree: rank 2: init barrier: rank 1 (signal: killed (SIGKILL)) died" {
		t.Fatalf("with file: %q", got)
	}
	if got := rankError("", nil); got != "" {
		t.Fatalf("nothing: %q", got)
	}
}
