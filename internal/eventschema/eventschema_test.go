package eventschema

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/actors"
)

func load(t *testing.T) *Schema {
	t.Helper()
	s, err := Load("../..")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSchemaAcceptsEveryKind: one well-formed event of each kind the code
// emits validates, with the version the code stamps.
func TestSchemaAcceptsEveryKind(t *testing.T) {
	s := load(t)
	now := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	base := actors.Event{SchemaVersion: actors.EventSchemaVersion, Job: "j", Rank: 1, Time: now}
	evs := []actors.Event{
		{Kind: actors.KindWork, Group: "world", Seq: 3, Op: "ALLREDUCE", State: actors.StateCompleted, DType: "float32", Count: 4, DurUS: 12.5},
		{Kind: actors.KindWork, Group: "world", P2PSeq: 1, Op: "SEND", State: actors.StateScheduled, DType: "float32", Count: 1},
		{Kind: actors.KindCommInit, Group: "world", Detail: map[string]string{"engine": "cpu", "members": "[0 1]"}},
		{Kind: actors.KindCommAbort, Group: "world", Epoch: 2, Action: "abort", Error: "comm: timeout"},
		{Kind: actors.KindWatchdog, Group: "world", Action: "timeout", Seq: 9, Op: "BARRIER", Error: "x"},
		{Kind: actors.KindWatchdog, Action: "teardown", Detail: map[string]string{"exit_code": "3", "mode": "teardown"}},
		{Kind: actors.KindRestart, Group: "world", Epoch: 2, Action: "restart", Detail: map[string]string{"from_epoch": "0"}},
		{Kind: actors.KindRestart, Action: "escalate", Error: "panic"},
		{Kind: actors.KindDrops, Dropped: 7},
	}
	for _, e := range evs {
		ev := base
		ev.Kind, ev.Group, ev.Seq, ev.P2PSeq, ev.Op, ev.State, ev.DType, ev.Count, ev.DurUS = e.Kind, e.Group, e.Seq, e.P2PSeq, e.Op, e.State, e.DType, e.Count, e.DurUS
		ev.Epoch, ev.Action, ev.Error, ev.Detail, ev.Dropped = e.Epoch, e.Action, e.Error, e.Detail, e.Dropped
		b, _ := json.Marshal(ev)
		if err := s.Validate(b); err != nil {
			t.Errorf("%s event rejected: %v", ev.Kind, err)
		}
	}
}

// TestSchemaRejects: events that break the contract are rejected, naming
// the problem.
func TestSchemaRejects(t *testing.T) {
	s := load(t)
	ok := `"schema_version":1,"job":"j","rank":0,"time":"2026-01-02T03:04:05Z"`
	for _, c := range []struct{ name, json, want string }{
		{"no version", `{"job":"j","rank":0,"kind":"drops","dropped":1,"time":"2026-01-02T03:04:05Z"}`, "schema_version"},
		{"wrong version", `{"schema_version":2,"job":"j","rank":0,"kind":"drops","dropped":1,"time":"2026-01-02T03:04:05Z"}`, "schema_version"},
		{"unknown field", `{` + ok + `,"kind":"drops","dropped":1,"extra":1}`, "extra"},
		{"bad time", `{"schema_version":1,"job":"j","rank":0,"kind":"drops","dropped":1,"time":"yesterday"}`, "time"},
		{"work without state", `{` + ok + `,"kind":"work","group":"world","seq":1,"op":"ALLREDUCE"}`, "state"},
		{"work without seq", `{` + ok + `,"kind":"work","group":"world","op":"ALLREDUCE","state":"started"}`, "seq"},
		{"unknown watchdog action", `{` + ok + `,"kind":"watchdog","action":"nap"}`, "action"},
		{"negative rank", `{"schema_version":1,"job":"j","rank":-1,"kind":"drops","dropped":1,"time":"2026-01-02T03:04:05Z"}`, "rank"},
	} {
		err := s.Validate([]byte(c.json))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want a rejection naming %q", c.name, err, c.want)
		}
	}
}
