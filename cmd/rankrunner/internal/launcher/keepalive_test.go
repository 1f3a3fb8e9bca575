package launcher

import (
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLiveness: a runner is lost once its key has been silent for the
// timeout, counted from the attempt's start for keys found at the start;
// self, runners never seen, skipped runners and runners already reported
// are not.
func TestLiveness(t *testing.T) {
	start := t0
	l := newLiveness("node0", 30*time.Second, start)
	none := func(string) bool { return false }
	l.beat("node0", start.Add(-time.Hour)) // self: never watched
	l.beat("node1", start.Add(-time.Hour)) // found at the start: counts from start
	l.beat("node2", start.Add(10*time.Second))
	if id, _, ok := l.check(start.Add(29*time.Second), none); ok {
		t.Fatalf("%s lost before the timeout", id)
	}
	id, silent, ok := l.check(start.Add(30*time.Second), none)
	if !ok || id != "node1" || silent != 30*time.Second {
		t.Fatalf("check = %q, %v, %v; want node1 after 30s", id, silent, ok)
	}
	if id, _, ok := l.check(start.Add(31*time.Second), none); ok {
		t.Fatalf("reported again or too early: %s", id)
	}
	l.beat("node2", start.Add(35*time.Second)) // it beats: silence restarts
	if id, _, ok := l.check(start.Add(60*time.Second), none); ok {
		t.Fatalf("%s lost although it beat 25s ago", id)
	}
	// A runner whose ranks succeeded (done) is not watched any more.
	done := func(id string) bool { return id == "node2" }
	if id, _, ok := l.check(start.Add(90*time.Second), done); ok {
		t.Fatalf("done runner %s reported lost", id)
	}
	if id, _, ok := l.check(start.Add(90*time.Second), none); !ok || id != "node2" {
		t.Fatalf("node2 silent 55s: check = %q, %v", id, ok)
	}
	if _, _, ok := newLiveness("node0", time.Second, start).check(start.Add(time.Hour), none); ok {
		t.Fatal("a runner never seen was reported lost")
	}
}

// TestPolicyRunnerLost: a lost runner aborts a running attempt (restartable,
// exit code 1) and ends the exit barrier of a runner whose ranks succeeded.
func TestPolicyRunnerLost(t *testing.T) {
	p := NewPolicy("node0", []int{0, 1}, 0, 3*time.Second)
	acts := p.Step(RunnerLost{Runner: "node1", Silent: 30 * time.Second}, t0)
	if len(acts) != 2 || !reflect.DeepEqual(acts[1], SignalRanks{syscall.SIGTERM}) {
		t.Fatalf("running: actions %#v, want an abort then SIGTERM", acts)
	}
	pa, ok := acts[0].(PublishAbort)
	if !ok || pa.Abort.Runner != "node0" || pa.Abort.Rank != -1 || pa.Abort.ExitCode != 1 || pa.Abort.Final ||
		!strings.Contains(pa.Abort.Reason, "runner node1 sent no heartbeat for 30s") {
		t.Fatalf("abort = %#v", acts[0])
	}
	p.Step(RankExited{Local: 0, Code: 143}, t0.Add(time.Millisecond))
	acts = p.Step(RankExited{Local: 1, Code: 143}, t0.Add(time.Millisecond))
	fin, ok := acts[0].(Finish)
	if !ok || fin.Outcome.Kind != Failed || fin.Outcome.ExitCode != 1 || fin.Outcome.Final || !strings.Contains(fin.Outcome.Reason, "node1") {
		t.Fatalf("outcome %#v", acts)
	}

	// Waiting at the exit barrier: a lost runner will never write its done key.
	p = NewPolicy("node0", []int{0}, 0, 3*time.Second)
	if acts := p.Step(RankExited{Local: 0, Code: 0}, t0); !reflect.DeepEqual(acts, []Action{PublishDone{}}) {
		t.Fatalf("success: %#v", acts)
	}
	acts = p.Step(RunnerLost{Runner: "node1", Silent: 31 * time.Second}, t0.Add(time.Minute))
	if len(acts) != 2 {
		t.Fatalf("barrier: %#v", acts)
	}
	if fin, ok := acts[1].(Finish); !ok || fin.Outcome.Kind != Failed || !p.Done() {
		t.Fatalf("barrier: %#v, want an abort then Finish(Failed)", acts)
	}
}
