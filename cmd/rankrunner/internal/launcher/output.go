package launcher

import (
	"bufio"
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

func (c *console) writeLine(prefix, line []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	buf := make([]byte, 0, len(prefix)+len(line)+1)
	buf = append(buf, prefix...)
	buf = append(buf, line...)
	if len(line) == 0 || line[len(line)-1] != '\n' {
		buf = append(buf, '\n')
	}
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

// pump copies one stream of a rank line by line to the console (prefixed)
// and/or a log file (verbatim). Lines longer than 64 KiB are split.
type pump struct {
	prefix []byte
	con    *console // nil: redirected to the file only
	file   *os.File // nil: no log file for this stream
	tail   *errTail // nil: the stream's errors are not recorded (stdout)
}

func (p pump) run(r io.Reader) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			if p.tail != nil {
				p.tail.observe(line)
			}
			if p.file != nil {
				_, _ = p.file.Write(line)
			}
			if p.con != nil {
				p.con.writeLine(p.prefix, line)
			}
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return
		}
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
