package eventview

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/actors"
)

func work(rank int, group string, seq uint64, state string, at time.Time) actors.Event {
	return actors.Event{Job: "j", Rank: rank, Kind: actors.KindWork, Time: at, Group: group, Seq: seq, Op: "ALLREDUCE", State: state}
}

func TestTableStragglersAndMissing(t *testing.T) {
	now := time.Unix(100, 0)
	tb := NewTable(4)
	for seq := uint64(1); seq <= 5; seq++ {
		tb.Apply(work(0, "world", seq, actors.StateCompleted, now))
		if seq <= 3 {
			tb.Apply(work(1, "world", seq, actors.StateScheduled, now))
		}
		tb.Apply(work(2, "world", seq, actors.StateStarted, now))
	}
	// An out-of-order older event must not move rank 0 back.
	tb.Apply(work(0, "world", 2, actors.StateScheduled, now))
	tb.Apply(work(2, "world", 5, actors.StateFailed, now))
	tb.Apply(actors.Event{Rank: 2, Kind: actors.KindWatchdog, Action: "timeout", Error: "seq 5 timed out", Time: now})
	rows := tb.Rows()
	if len(rows) != 4 {
		t.Fatalf("%d rows, want 4: %+v", len(rows), rows)
	}
	r0, r1, r2, r3 := rows[0], rows[1], rows[2], rows[3]
	if r0.Seq != 5 || r0.State != actors.StateCompleted || r0.Straggler {
		t.Errorf("rank 0 row %+v", r0)
	}
	if !r1.Straggler || r1.Behind != 2 || r1.Seq != 3 {
		t.Errorf("rank 1 row %+v: want a straggler 2 behind", r1)
	}
	if !r2.Failed || r2.Note != "watchdog: timeout: seq 5 timed out" {
		t.Errorf("rank 2 row %+v", r2)
	}
	if !r3.Missing || r3.Rank != 3 {
		t.Errorf("rank 3 row %+v: want missing", r3)
	}
	var b bytes.Buffer
	tb.Render(&b, now.Add(1500*time.Millisecond), false)
	out := b.String()
	for _, want := range []string{"STRAGGLER (2 behind)", "MISSING (no events)", "FAILED", "1.5s"} {
		if !strings.Contains(out, want) {
			t.Errorf("render lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b[") {
		t.Error("colour codes without color")
	}
	b.Reset()
	tb.Render(&b, now, true)
	if !strings.Contains(b.String(), "\x1b[1;33m") {
		t.Error("straggler not highlighted in colour")
	}
}

func TestTableGroupsAreSeparate(t *testing.T) {
	tb := NewTable(0)
	tb.Apply(work(0, "world", 9, actors.StateCompleted, time.Time{}))
	tb.Apply(work(1, "world", 9, actors.StateCompleted, time.Time{}))
	tb.Apply(work(0, "sub", 2, actors.StateCompleted, time.Time{}))
	for _, r := range tb.Rows() {
		if r.Straggler {
			t.Errorf("row %+v marked straggler across groups", r)
		}
	}
}

func TestFormatLine(t *testing.T) {
	ev := work(1, "world", 7, actors.StateCompleted, time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC))
	ev.DType, ev.Count, ev.DurUS = "float32", 1024, 12.5
	got := FormatLine(ev)
	want := "10:00:00.000 rank=1 kind=work group=world seq=7 op=ALLREDUCE state=completed dtype=float32 count=1024 duration_us=12.5"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}
