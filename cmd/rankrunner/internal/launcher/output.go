package launcher

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
)

// console serialises whole lines from many ranks onto one writer, so lines
// of different ranks never interleave mid-line.
type console struct {
	mu sync.Mutex
	w  io.Writer
}

// writeLine writes prefix, line (without its terminator) and '\n' at once.
func (c *console) writeLine(prefix, line []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	buf := make([]byte, 0, len(prefix)+len(line)+1)
	buf = append(buf, prefix...)
	buf = append(buf, line...)
	buf = append(buf, '\n')
	_, _ = c.w.Write(buf) // the console going away must not stop the rank
}

// writeBlock writes s (whole lines) at once, unprefixed.
func (c *console) writeBlock(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, _ = io.WriteString(c.w, s)
}

// rankColors are ANSI SGR colours cycled over ranks on a terminal.
var rankColors = []int{36, 33, 32, 35, 34, 31, 96, 93, 92, 95, 94, 91}

// rankPrefix is "[rank N] ", coloured when color is set.
func rankPrefix(rank int, color bool) []byte {
	if !color {
		return []byte("[rank " + strconv.Itoa(rank) + "] ")
	}
	return []byte(fmt.Sprintf("\x1b[%dm[rank %d]\x1b[0m ", rankColors[rank%len(rankColors)], rank))
}

// maxLine bounds a console line: longer lines (no '\n' or '\r' within
// 1 MiB) are cut there, the only place a line is ever split.
const maxLine = 1 << 20

// pump copies one stream of a rank to the console (each line prefixed)
// and/or a log file (verbatim). A console line ends at '\n', "\r\n" or a
// lone '\r' (a progress bar's redraw becomes a line of its own instead of
// piling up after one prefix); a partial write is held until its line ends,
// so lines are never split in the middle (up to maxLine).
type pump struct {
	prefix []byte
	con    *console // nil: redirected to the file only
	file   *os.File // nil: no log file for this stream
	tail   *errTail // nil: the stream's errors are not recorded (stdout)
}

func (p pump) run(r io.Reader) {
	buf := make([]byte, 64<<10)
	var acc []byte // bytes read but not yet written to the console
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if p.file != nil {
				_, _ = p.file.Write(buf[:n])
			}
			acc = p.lines(append(acc, buf[:n]...), false)
		}
		if err != nil {
			p.lines(acc, true)
			return
		}
	}
}

// lines emits every complete line at the start of acc and returns the
// rest, moved to acc's start. At eof the rest is a line too.
func (p pump) lines(acc []byte, eof bool) []byte {
	rest := acc
	for len(rest) > 0 {
		i := bytes.IndexAny(rest, "\r\n")
		end, cr := 0, false
		switch {
		case i < 0 && len(rest) >= maxLine:
			end = maxLine
		case i < 0 && eof:
			end = len(rest)
		case i < 0:
		case rest[i] == '\n':
			end = i + 1
		case i+1 < len(rest) && rest[i+1] == '\n':
			end = i + 2 // "\r\n"
		case i+1 < len(rest) || eof:
			end, cr = i+1, true
		}
		if end == 0 {
			break // wait for the line's end (or whether '\r' is "\r\n")
		}
		p.emit(rest[:end], cr)
		rest = rest[end:]
	}
	return append(acc[:0], rest...)
}

// emit sends one line (with its terminator) to the error tail and the
// console; a lone '\r' ending nothing (a redraw's leading '\r') is dropped.
func (p pump) emit(line []byte, cr bool) {
	text := bytes.TrimRight(line, "\r\n")
	if cr && len(text) == 0 {
		return
	}
	if p.tail != nil {
		p.tail.observe(line)
	}
	if p.con != nil {
		p.con.writeLine(p.prefix, text)
	}
}

// rankOutput is where one rank's stdout and stderr go for one attempt.
type rankOutput struct {
	stdout, stderr pump
	files          []*os.File
}

func (o *rankOutput) close() {
	for _, f := range o.files {
		_ = f.Close()
	}
}

// openRankOutput decides the destinations of a rank's streams from --tee,
// --redirects and --log-dir, creating
// LogDir/<job>/attempt_<n>/<rank>/{stdout,stderr}.log as needed (torchrun's
// layout, with the global rank as the last directory).
func openRankOutput(cfg *Config, attempt int, slot RankSlot, out, errc *console) (*rankOutput, error) {
	prefix := rankPrefix(slot.Rank, cfg.Color)
	o := &rankOutput{stdout: pump{prefix: prefix, con: out}, stderr: pump{prefix: prefix, con: errc, tail: &errTail{}}}
	if cfg.LogDir == "" {
		return o, nil
	}
	tee, red := cfg.Tee.For(slot.LocalRank), cfg.Redirects.For(slot.LocalRank)
	dir := filepath.Join(cfg.LogDir, cfg.JobID, "attempt_"+strconv.Itoa(attempt), strconv.Itoa(slot.Rank))
	open := func(name string) (*os.File, error) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			return nil, err
		}
		o.files = append(o.files, f)
		return f, nil
	}
	for _, s := range []struct {
		bit  Std
		p    *pump
		name string
	}{{StdOut, &o.stdout, "stdout.log"}, {StdErr, &o.stderr, "stderr.log"}} {
		if (tee|red)&s.bit == 0 {
			continue
		}
		f, err := open(s.name)
		if err != nil {
			o.close()
			return nil, fmt.Errorf("launcher: rank %d log file: %w", slot.Rank, err)
		}
		s.p.file = f
		if red&s.bit != 0 {
			s.p.con = nil
		}
	}
	return o, nil
}
