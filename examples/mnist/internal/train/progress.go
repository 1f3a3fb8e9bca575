package train

import (
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
)

// DefaultProgressEvery is the interval of the plain progress lines written
// when Config.Progress is not a terminal.
const DefaultProgressEvery = 10 * time.Second

// progress reports one epoch's advance: a redrawn progress bar on a
// terminal (schollz/progressbar), or plain lines for files and pipes,
// where carriage returns would pile up into one endless line. progressbar
// v3.19.1 has no non-terminal mode, hence the plain writer.
type progress interface {
	// update is called after each step: done samples (all ranks) out of
	// total this epoch, steps taken this epoch, mean loss so far.
	update(now time.Time, done, steps int, loss float64)
	// finish is called once at the end of the epoch.
	finish(now time.Time, done, steps int, loss float64)
}

// newProgress returns the epoch's reporter, or nil when cfg.Progress is nil.
func newProgress(cfg *Config, epoch, total int, start time.Time) progress {
	if cfg.Progress == nil {
		return nil
	}
	if cfg.ProgressTTY {
		return &barProgress{cfg: cfg, epoch: epoch, start: start, bar: progressbar.NewOptions(total,
			progressbar.OptionSetWriter(cfg.Progress),
			progressbar.OptionSetDescription(fmt.Sprintf("epoch %d/%d", epoch, cfg.Epochs)),
			progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(200*time.Millisecond),
			progressbar.OptionShowElapsedTimeOnFinish(),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(cfg.Progress) }))}
	}
	every := cfg.ProgressEvery
	if every <= 0 {
		every = DefaultProgressEvery
	}
	return &lineProgress{w: cfg.Progress, epoch: epoch, epochs: cfg.Epochs, total: total, start: start, last: start, every: every}
}

// barProgress is the terminal progress bar.
type barProgress struct {
	cfg   *Config
	epoch int
	start time.Time
	bar   *progressbar.ProgressBar
}

func (b *barProgress) update(now time.Time, done, _ int, loss float64) {
	rate := float64(done) / now.Sub(b.start).Seconds()
	b.bar.Describe(fmt.Sprintf("epoch %d/%d loss %.4f %6.0f samples/s", b.epoch, b.cfg.Epochs, loss, rate))
	_ = b.bar.Set(done) // rendering errors only concern the terminal
}

func (b *barProgress) finish(time.Time, int, int, float64) { _ = b.bar.Finish() }

// lineProgress writes one self-contained line every `every` and at the
// epoch's end:
//
//	epoch 1/3 step 120 samples 7680/60000 (13%) samples/s 5321 loss 0.4321 eta 31s
//
// eta covers the rest of the run (this epoch and the epochs after it) at
// this epoch's rate.
type lineProgress struct {
	w             io.Writer
	epoch, epochs int
	total         int
	start, last   time.Time
	every         time.Duration
}

func (l *lineProgress) update(now time.Time, done, steps int, loss float64) {
	if now.Sub(l.last) < l.every {
		return
	}
	l.last = now
	l.write(now, done, steps, loss, "")
}

func (l *lineProgress) finish(now time.Time, done, steps int, loss float64) {
	l.write(now, done, steps, loss, " done in "+now.Sub(l.start).Round(100*time.Millisecond).String())
}

func (l *lineProgress) write(now time.Time, done, steps int, loss float64, suffix string) {
	secs := now.Sub(l.start).Seconds()
	rate := 0.0
	if secs > 0 {
		rate = float64(done) / secs
	}
	eta := "?"
	if rate > 0 {
		left := float64(l.total-done) + float64(l.epochs-l.epoch)*float64(l.total)
		eta = time.Duration(left / rate * float64(time.Second)).Round(time.Second).String()
	}
	pct := 100
	if l.total > 0 {
		pct = done * 100 / l.total
	}
	fmt.Fprintf(l.w, "epoch %d/%d step %d samples %d/%d (%d%%) samples/s %.0f loss %.4f eta %s%s\n",
		l.epoch, l.epochs, steps, done, l.total, pct, rate, loss, eta, suffix)
}
