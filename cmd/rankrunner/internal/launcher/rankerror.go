package launcher

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"sync"
	"unicode/utf8"
)

// How a rank's error reaches the runner, for the failure summary
// (summary.go): the rank's error file when it wrote one (RANKTREE_ERROR_FILE,
// torchrun's TORCHELASTIC_ERROR_FILE; ranktree.Init writes its error
// there), else the last error-looking line of its stderr, else its last
// stderr line. A rank killed by a signal may have reported nothing; the
// summary then shows its signal alone.

// maxErrorLen caps a reported error in the summary and the abort key.
const maxErrorLen = 400

// errTail remembers, from one rank's stderr, the last error-looking line
// and the last non-empty line. The rank's stderr pump writes it; the exit
// goroutine reads it once the pump drained (or gave up), hence the lock.
type errTail struct {
	mu      sync.Mutex
	lastErr string
	last    string
	panic   bool // lastErr is a Go panic/fatal line: stack lines must not replace it
}

// observe records one line of stderr.
func (t *errTail) observe(line []byte) {
	text, isErr, isPanic := classifyLine(line)
	if text == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.last = text
	switch {
	case isPanic:
		t.lastErr, t.panic = text, true
	case isErr && !t.panic:
		t.lastErr = text
	}
}

// get returns the rank's reported error from its stderr: the last
// error-looking line, else "(last stderr line) ..." ("" if it wrote
// nothing).
func (t *errTail) get() string {
	if t == nil {
		return ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.lastErr != "" || t.last == "" {
		return t.lastErr
	}
	return "(last stderr line) " + t.last
}

var ansiRe = regexp.MustCompile(`\x1b\[[0-9;]*[A-Za-z]`)

// classifyLine cleans a stderr line (no newline, no colour codes) and says
// whether it looks like an error, and whether it starts a Go panic or
// fatal error. A zerolog JSON line is an error by its level, and reads as
// "message: error".
func classifyLine(line []byte) (text string, isErr, isPanic bool) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return "", false, false
	}
	if line[0] == '{' {
		var m struct {
			Level   string `json:"level"`
			Message string `json:"message"`
			Error   string `json:"error"`
		}
		if json.Unmarshal(line, &m) == nil && m.Level != "" {
			text = m.Message
			if m.Error != "" {
				text = strings.TrimPrefix(text+": "+m.Error, ": ")
			}
			switch m.Level {
			case "error", "fatal", "panic":
				return clip(text), true, false
			}
			return clip(text), false, false
		}
	}
	s := strings.TrimSpace(ansiRe.ReplaceAllString(string(line), ""))
	if strings.HasPrefix(s, "panic: ") || strings.HasPrefix(s, "fatal error: ") {
		return clip(s), true, true
	}
	l := strings.ToLower(s)
	for _, w := range []string{"error", "panic", "fatal", "fail", "timed out", "timeout", "died", "killed", "abort"} {
		if strings.Contains(l, w) {
			return clip(s), true, false
		}
	}
	return clip(s), false, false
}

// clip shortens s to maxErrorLen bytes on a rune boundary.
func clip(s string) string {
	if len(s) <= maxErrorLen {
		return s
	}
	cut := maxErrorLen
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// readErrorFile returns the first line of a rank's error file ("" when
// absent or empty).
func readErrorFile(path string) string {
	if path == "" {
		return ""
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	first, _, _ := bytes.Cut(bytes.TrimSpace(b), []byte("\n"))
	return clip(strings.TrimSpace(string(first)))
}

// rankError is what a finished rank reported: its error file, else its
// stderr tail.
func rankError(errFile string, tail *errTail) string {
	if s := readErrorFile(errFile); s != "" {
		return s
	}
	return tail.get()
}
