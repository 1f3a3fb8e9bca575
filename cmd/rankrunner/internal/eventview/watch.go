package eventview

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/cmd/rankrunner/internal/natsauth"
)

// Options configures Watch.
type Options struct {
	URL       string // NATS server of the job
	Job       string // job id; "" watches every job (groups shown as <job>/<group>)
	Creds     natsauth.Credentials
	WorldSize int           // > 0: show ranks that sent nothing as missing
	Duration  time.Duration // stop after this long (0: until ctx ends)
	Lines     bool          // print one line per event instead of redrawing the table
	Live      bool          // redraw the table every Refresh (a terminal)
	Refresh   time.Duration // redraw period (default 1s)
	Out       io.Writer
}

// Watch subscribes to the job's events (actors.EventWildcard) and shows
// them until ctx ends or Duration passes: a live table on a terminal, or
// one line per event (Lines). It always ends with the final table.
func Watch(ctx context.Context, o Options) error {
	if o.Refresh <= 0 {
		o.Refresh = time.Second
	}
	copts, err := o.Creds.Options()
	if err != nil {
		return err
	}
	copts = append(copts, nats.Name("rankrunner-events/"+o.Job), nats.Timeout(5*time.Second))
	nc, err := nats.Connect(o.URL, copts...)
	if err != nil {
		return fmt.Errorf("events: connect to %s: %w", o.URL, err)
	}
	defer nc.Close()
	ch := make(chan *nats.Msg, 4096)
	subject := actors.EventWildcard(o.Job)
	if o.Job == "" {
		subject = "ranktree.*.events.>"
	}
	sub, err := nc.ChanSubscribe(subject, ch)
	if err != nil {
		return fmt.Errorf("events: subscribe %s: %w", subject, err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("events: subscribe %s: %w", subject, err)
	}
	if !o.Live {
		fmt.Fprintf(o.Out, "watching %s on %s\n", subject, o.URL)
	}
	if o.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Duration)
		defer cancel()
	}
	t := NewTable(o.WorldSize)
	var redraw <-chan time.Time
	if o.Live && !o.Lines {
		tk := time.NewTicker(o.Refresh)
		defer tk.Stop()
		redraw = tk.C
	}
	bad := 0
	for {
		select {
		case m := <-ch:
			var ev actors.Event
			if err := json.Unmarshal(m.Data, &ev); err != nil {
				bad++
				if bad <= 3 {
					fmt.Fprintf(o.Out, "bad event on %s: %v\n", m.Subject, err)
				}
				continue
			}
			if o.Job == "" {
				ev.Group = ev.Job + "/" + ev.Group
			}
			t.Apply(ev)
			if o.Lines || !o.Live {
				fmt.Fprintln(o.Out, FormatLine(ev))
			}
		case <-redraw:
			fmt.Fprint(o.Out, "\x1b[H\x1b[2J")
			fmt.Fprintf(o.Out, "%s  %s  (Ctrl-C to quit)\n\n", subject, time.Now().Format("15:04:05"))
			t.Render(o.Out, time.Now(), true)
		case <-ctx.Done():
			fmt.Fprintln(o.Out)
			t.Render(o.Out, time.Now(), o.Live)
			return nil
		}
	}
}
