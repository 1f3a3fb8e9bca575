// Package eventview is the model behind `rankrunner events`: a table of a
// job's ranks × last seq/op/state built from actors.Event messages, with
// stragglers (ranks behind the group's highest seq) and missing ranks
// marked. The table is a pure value: Apply feeds it events, Render draws it.
package eventview

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/ranktree/ranktree/actors"
)

// Row is the last known state of one rank in one process group.
type Row struct {
	Rank   int
	Group  string
	Epoch  uint32
	Seq    uint64 // highest collective seq seen
	Op     string // its op (c10d OpType name)
	State  string // its state (scheduled, started, completed, failed)
	Last   time.Time
	Note   string // last non-work event: comm_abort, watchdog, rank life cycle
	Events int
}

// Table aggregates events of one job. Not safe for concurrent use.
type Table struct {
	rows  map[rowKey]*Row
	notes map[int]string // rank-level notes before any work event
	seen  map[int]bool
	// WorldSize, when > 0, lists ranks 0..WorldSize-1 that sent nothing as missing.
	WorldSize int
}

type rowKey struct {
	rank  int
	group string
}

// NewTable returns an empty table; worldSize > 0 enables missing-rank rows.
func NewTable(worldSize int) *Table {
	return &Table{rows: map[rowKey]*Row{}, notes: map[int]string{}, seen: map[int]bool{}, WorldSize: worldSize}
}

// Apply records one event.
func (t *Table) Apply(ev actors.Event) {
	t.seen[ev.Rank] = true
	switch ev.Kind {
	case actors.KindWork:
		k := rowKey{ev.Rank, ev.Group}
		r := t.rows[k]
		if r == nil {
			r = &Row{Rank: ev.Rank, Group: ev.Group, Note: t.notes[ev.Rank]}
			t.rows[k] = r
		}
		r.Events++
		newer := ev.Epoch > r.Epoch || (ev.Epoch == r.Epoch && ev.Seq > r.Seq) ||
			(ev.Epoch == r.Epoch && ev.Seq == r.Seq && stateOrder(ev.State) >= stateOrder(r.State))
		if newer || r.Events == 1 {
			r.Epoch, r.Seq, r.Op, r.State = ev.Epoch, ev.Seq, ev.Op, ev.State
		}
		if ev.Time.After(r.Last) {
			r.Last = ev.Time
		}
	default:
		note := noteOf(ev)
		t.notes[ev.Rank] = note
		found := false
		for k, r := range t.rows {
			if k.rank == ev.Rank && (ev.Group == "" || ev.Group == k.group) {
				r.Note, found = note, true
				if ev.Time.After(r.Last) {
					r.Last = ev.Time
				}
			}
		}
		if !found {
			k := rowKey{ev.Rank, ev.Group}
			t.rows[k] = &Row{Rank: ev.Rank, Group: ev.Group, Note: note, Last: ev.Time, Events: 1}
		}
	}
}

func stateOrder(s string) int {
	switch s {
	case actors.StateScheduled:
		return 1
	case actors.StateStarted:
		return 2
	case actors.StateCompleted, actors.StateFailed:
		return 3
	}
	return 0
}

func noteOf(ev actors.Event) string {
	parts := []string{ev.Kind}
	if ev.Action != "" {
		parts = append(parts, ev.Action)
	}
	if ev.State != "" {
		parts = append(parts, ev.State)
	}
	if ev.Error != "" {
		parts = append(parts, ev.Error)
	}
	if ev.Dropped > 0 {
		parts = append(parts, fmt.Sprintf("%d dropped", ev.Dropped))
	}
	return strings.Join(parts, ": ")
}

// Status of a row relative to its group.
type Status struct {
	Behind    uint64 // seqs behind the group's highest (0: up to date)
	Failed    bool   // last work failed
	Missing   bool   // rank sent no event at all
	Straggler bool   // Behind > 0
}

// View is one rendered row.
type View struct {
	Row
	Status
}

// Rows returns the rows sorted by rank then group, with their status, and
// a row per missing rank (WorldSize > 0).
func (t *Table) Rows() []View {
	maxSeq := map[string]uint64{}
	for k, r := range t.rows {
		if r.Seq > maxSeq[k.group] {
			maxSeq[k.group] = r.Seq
		}
	}
	var out []View
	for k, r := range t.rows {
		v := View{Row: *r}
		if m := maxSeq[k.group]; r.Seq < m && r.Op != "" {
			v.Behind, v.Straggler = m-r.Seq, true
		}
		v.Failed = r.State == actors.StateFailed
		out = append(out, v)
	}
	for rank := 0; rank < t.WorldSize; rank++ {
		if !t.seen[rank] {
			out = append(out, View{Row: Row{Rank: rank}, Status: Status{Missing: true}})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Rank != out[j].Rank {
			return out[i].Rank < out[j].Rank
		}
		return out[i].Group < out[j].Group
	})
	return out
}

// Render writes the table at time now; color highlights stragglers,
// failures and missing ranks with ANSI colours.
func (t *Table) Render(w io.Writer, now time.Time, color bool) {
	fmt.Fprintf(w, "%-5s %-12s %6s %-16s %-10s %8s  %s\n", "RANK", "GROUP", "SEQ", "OP", "STATE", "AGE", "NOTE")
	for _, v := range t.Rows() {
		age := "-"
		if !v.Last.IsZero() {
			age = now.Sub(v.Last).Round(100 * time.Millisecond).String()
		}
		mark, c := "", ""
		switch {
		case v.Missing:
			mark, c = "MISSING (no events)", "\x1b[1;31m"
		case v.Failed:
			mark, c = "FAILED", "\x1b[31m"
		case v.Straggler:
			mark, c = fmt.Sprintf("STRAGGLER (%d behind)", v.Behind), "\x1b[1;33m"
		}
		note := v.Note
		if mark != "" {
			note = strings.TrimSpace(mark + "  " + note)
		}
		group, op, state, seq := dash(v.Group), dash(v.Op), dash(v.State), "-"
		if v.Op != "" {
			seq = fmt.Sprint(v.Seq)
		}
		line := fmt.Sprintf("%-5d %-12s %6s %-16s %-10s %8s  %s", v.Rank, group, seq, op, state, age, note)
		if color && c != "" {
			line = c + line + "\x1b[0m"
		}
		fmt.Fprintln(w, strings.TrimRight(line, " "))
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// FormatLine is the one-line form of an event used by `events --lines`:
// "rank=1 kind=work group=world seq=7 op=ALLREDUCE state=completed ...".
func FormatLine(ev actors.Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s rank=%d kind=%s", ev.Time.Format("15:04:05.000"), ev.Rank, ev.Kind)
	add := func(k, v string) {
		if v != "" {
			fmt.Fprintf(&b, " %s=%s", k, v)
		}
	}
	add("group", ev.Group)
	if ev.Epoch != 0 {
		add("epoch", fmt.Sprint(ev.Epoch))
	}
	if ev.Seq != 0 || ev.Op != "" {
		add("seq", fmt.Sprint(ev.Seq))
	}
	add("op", ev.Op)
	add("state", ev.State)
	add("dtype", ev.DType)
	if ev.Count != 0 {
		add("count", fmt.Sprint(ev.Count))
	}
	if ev.DurUS != 0 {
		add("duration_us", fmt.Sprintf("%.1f", ev.DurUS))
	}
	add("action", ev.Action)
	if ev.Error != "" {
		add("error", fmt.Sprintf("%q", ev.Error))
	}
	return b.String()
}
