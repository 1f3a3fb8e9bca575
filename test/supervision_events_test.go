package test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/internal/eventschema"
)

// spSubscribe subscribes to every event of job on the NATS server at url
// (before the ranks start) and returns a function that, once the ranks have
// exited, waits briefly for delivery and returns the events received. An
// event that is not valid JSON or arrives on a subject other than
// ranktree.<job>.events.<its rank>.<its kind>, or that does not validate
// against docs/events.schema.json, fails the test.
func spSubscribe(t *testing.T, url, job string) func() []actors.Event {
	t.Helper()
	schema, err := eventschema.Load("..")
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var mu sync.Mutex
	var events []actors.Event
	_, err = nc.Subscribe(actors.EventWildcard(job), func(m *nats.Msg) {
		var ev actors.Event
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Errorf("event on %s: %v", m.Subject, err)
			return
		}
		if m.Subject != actors.EventSubject(job, ev.Rank, ev.Kind) {
			t.Errorf("event of rank %d kind %s on subject %s", ev.Rank, ev.Kind, m.Subject)
		}
		if err := schema.Validate(m.Data); err != nil {
			t.Errorf("event on %s breaks the schema: %v", m.Subject, err)
		}
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func() []actors.Event {
		// Events were flushed before the processes closed; let delivery finish.
		time.Sleep(500 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		return append([]actors.Event(nil), events...)
	}
}

// TestSupervisionEvents: a NATS subscriber on ranktree.<job>.events.> sees,
// for each of 3 ranks running 4 world all-reduces, a comm_init event for
// default_pg and, for every seq 1..4, ALLREDUCE work events scheduled and
// completed (started when the watchdog's poll saw it running), on the
// subject of the rank and kind that published them, and nothing failed.
func TestSupervisionEvents(t *testing.T) {
	t.Parallel()
	url := spNATS(t)
	events := spSubscribe(t, url, "ev")
	ranks := spLaunch(t, url, "ev", 3, []string{"RANKTREE_EVENTS=all"}, "ops", "4")
	codes := spWait(t, ranks, 20*time.Second)
	for r, c := range codes {
		if c != 0 {
			t.Fatalf("rank %d exited %d", r, c)
		}
	}
	evs := events()
	type key struct {
		rank  int
		seq   uint64
		state string
	}
	seen := map[key]bool{}
	inits := map[int]bool{}
	for _, ev := range evs {
		switch ev.Kind {
		case actors.KindCommInit:
			if ev.Group == "default_pg" {
				inits[ev.Rank] = true
			}
		case actors.KindWork:
			if ev.Group != "default_pg" || !strings.EqualFold(ev.Op, "ALLREDUCE") || ev.Seq < 1 || ev.Seq > 4 {
				t.Errorf("unexpected work event %+v (only ALLREDUCE seq 1..4 on default_pg were issued)", ev)
			}
			if ev.State == actors.StateFailed {
				t.Errorf("rank %d: seq %d failed: %s", ev.Rank, ev.Seq, ev.Error)
			}
			if ev.Job != "ev" || ev.Count != 1 || ev.DType == "" {
				t.Errorf("work event with job %q count %d dtype %q, want ev, 1 and a dtype", ev.Job, ev.Count, ev.DType)
			}
			seen[key{ev.Rank, ev.Seq, ev.State}] = true
		}
	}
	t.Logf("%d events", len(evs))
	for r := 0; r < 3; r++ {
		if !inits[r] {
			t.Errorf("rank %d: no comm_init event for default_pg", r)
		}
		for s := uint64(1); s <= 4; s++ {
			for _, st := range []string{actors.StateScheduled, actors.StateCompleted} {
				if !seen[key{r, s, st}] {
					t.Errorf("rank %d: no %s event for seq %d", r, st, s)
				}
			}
		}
	}
}

// TestSupervisionInvalidEnv: invalid supervision variables make Init fail
// (exit 2 from superprog) with an error naming the variable.
func TestSupervisionInvalidEnv(t *testing.T) {
	t.Parallel()
	url := spNATS(t)
	cases := []struct{ name, value string }{
		{"RANKTREE_TIMEOUT", "abc"},
		{"RANKTREE_ASYNC_ERROR_HANDLING", "-1"},
		{"RANKTREE_TRACE_BUFFER_SIZE", "-5"},
		{"RANKTREE_BLOCKING_WAIT", "maybe"},
	}
	ranks := make([][]*spRank, len(cases))
	for i, c := range cases {
		ranks[i] = spLaunch(t, url, fmt.Sprintf("badenv%d", i), 1, []string{c.name + "=" + c.value}, "ops", "1")
	}
	for i, c := range cases {
		p := ranks[i][0]
		if code := spWait(t, ranks[i], 20*time.Second)[0]; code != 2 {
			t.Errorf("%s=%s: exit %d, want 2 (Init failed)", c.name, c.value, code)
			continue
		}
		r := p.mustStep(t, "init")
		if r.OK || !strings.Contains(r.Err, c.name) {
			t.Errorf("%s=%s: Init error %q does not name the variable", c.name, c.value, r.Err)
		}
	}
}
