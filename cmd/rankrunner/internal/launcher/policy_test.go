package launcher

import (
	"reflect"
	"syscall"
	"testing"
	"time"
)

var t0 = time.Unix(1000, 0)

func TestPolicyLocalFailureStopsAndEscalates(t *testing.T) {
	p := NewPolicy("node0", []int{4, 5, 6}, 3*time.Second)
	if acts := p.Start(); acts != nil {
		t.Fatalf("Start = %v", acts)
	}
	acts := p.Step(RankExited{Local: 1, Code: 7}, t0)
	want := []Action{
		PublishAbort{Abort{Runner: "node0", Rank: 5, Reason: "rank 5 exited with code 7", ExitCode: 7}},
		SignalRanks{syscall.SIGTERM},
	}
	if !reflect.DeepEqual(acts, want) {
		t.Fatalf("failure actions = %#v, want %#v", acts, want)
	}
	if d, ok := p.Deadline(); !ok || !d.Equal(t0.Add(3*time.Second)) {
		t.Fatalf("Deadline = %v, %v; want t0+3s", d, ok)
	}
	if acts := p.Step(Tick{}, t0.Add(2999*time.Millisecond)); acts != nil {
		t.Fatalf("SIGKILL before the grace period: %v", acts)
	}
	// A rank exiting 143 from our SIGTERM is not a new failure.
	if acts := p.Step(RankExited{Local: 0, Code: 143}, t0.Add(time.Second)); acts != nil {
		t.Fatalf("stopped rank's exit produced %v", acts)
	}
	if acts := p.Step(Tick{}, t0.Add(3*time.Second)); !reflect.DeepEqual(acts, []Action{SignalRanks{syscall.SIGKILL}}) {
		t.Fatalf("at the grace deadline: %v, want SIGKILL", acts)
	}
	if p.Running(0) || !p.Running(2) {
		t.Fatalf("running state wrong: %v", p.running)
	}
	acts = p.Step(RankExited{Local: 2, Code: 137}, t0.Add(3100*time.Millisecond))
	fin, ok := acts[0].(Finish)
	if !ok || len(acts) != 1 {
		t.Fatalf("last exit: %v, want Finish", acts)
	}
	if o := fin.Outcome; o.Kind != Failed || o.Rank != 5 || o.ExitCode != 7 || o.Remote || o.Final {
		t.Fatalf("outcome %+v", o)
	}
	if !p.Done() || p.Step(Tick{}, t0.Add(time.Hour)) != nil {
		t.Fatal("a done policy must ignore inputs")
	}
}

func TestPolicySuccessWaitsForOtherRunners(t *testing.T) {
	p := NewPolicy("node1", []int{2, 3}, time.Second)
	if acts := p.Step(RankExited{Local: 0, Code: 0}, t0); acts != nil {
		t.Fatalf("one rank done: %v", acts)
	}
	if acts := p.Step(RankExited{Local: 1, Code: 0}, t0); !reflect.DeepEqual(acts, []Action{PublishDone{}}) {
		t.Fatalf("all local ranks done: %v, want PublishDone", acts)
	}
	if acts := p.Step(RunnersDone{}, t0); len(acts) != 1 || acts[0].(Finish).Outcome.Kind != Succeeded {
		t.Fatalf("RunnersDone: %v", acts)
	}
}

func TestPolicyAbortDuringBarrierFails(t *testing.T) {
	p := NewPolicy("node1", []int{2}, time.Second)
	p.Step(RankExited{Local: 0, Code: 0}, t0)
	acts := p.Step(AbortSeen{Abort{Runner: "node0", Rank: 0, Reason: "x", ExitCode: 3}}, t0)
	if len(acts) != 1 {
		t.Fatalf("%v", acts)
	}
	if o := acts[0].(Finish).Outcome; o.Kind != Failed || !o.Remote || o.ExitCode != 3 || o.Rank != 0 {
		t.Fatalf("outcome %+v", o)
	}
}

func TestPolicyRemoteAbortStopsRanks(t *testing.T) {
	p := NewPolicy("node0", []int{0, 1}, time.Second)
	if acts := p.Step(AbortSeen{Abort{Runner: "node0", Rank: 1, ExitCode: 4}}, t0); acts != nil {
		t.Fatalf("own abort echoed back must be ignored: %v", acts)
	}
	acts := p.Step(AbortSeen{Abort{Runner: "node1", Rank: 3, Reason: "rank 3 exited with code 4", ExitCode: 4}}, t0)
	if !reflect.DeepEqual(acts, []Action{SignalRanks{syscall.SIGTERM}}) {
		t.Fatalf("remote abort: %v", acts)
	}
	p.Step(RankExited{Local: 0, Code: 0}, t0)
	acts = p.Step(RankExited{Local: 1, Code: 143}, t0)
	if o := acts[0].(Finish).Outcome; o.Kind != Failed || !o.Remote || o.Rank != 3 || o.ExitCode != 4 {
		t.Fatalf("outcome %+v", o)
	}
}

func TestPolicySignalForwardedAndFinal(t *testing.T) {
	p := NewPolicy("node0", []int{0, 1}, time.Second)
	acts := p.Step(SignalReceived{syscall.SIGINT}, t0)
	if len(acts) != 2 {
		t.Fatalf("%v", acts)
	}
	if a := acts[0].(PublishAbort).Abort; !a.Final || a.ExitCode != 130 || a.Rank != -1 {
		t.Fatalf("abort %+v", a)
	}
	if acts[1] != (SignalRanks{syscall.SIGINT}) {
		t.Fatalf("forwarded %v, want SIGINT", acts[1])
	}
	// A second Ctrl-C kills at once.
	if acts := p.Step(SignalReceived{syscall.SIGINT}, t0); !reflect.DeepEqual(acts, []Action{SignalRanks{syscall.SIGKILL}}) {
		t.Fatalf("second signal: %v", acts)
	}
	p.Step(RankExited{Local: 0, Code: 130}, t0)
	acts = p.Step(RankExited{Local: 1, Code: 137}, t0)
	if o := acts[0].(Finish).Outcome; o.Kind != Interrupted || !o.Final || o.ExitCode != 130 {
		t.Fatalf("outcome %+v", o)
	}
}

func TestPolicyFinalRemoteAbortIsFinal(t *testing.T) {
	p := NewPolicy("node1", []int{0}, time.Second)
	p.Step(AbortSeen{Abort{Runner: "node0", Rank: -1, ExitCode: 143, Final: true}}, t0)
	acts := p.Step(RankExited{Local: 0, Code: 143}, t0)
	if o := acts[0].(Finish).Outcome; !o.Final || o.ExitCode != 143 {
		t.Fatalf("outcome %+v", o)
	}
}

func TestPolicyNoLocalRanks(t *testing.T) {
	p := NewPolicy("node0", nil, time.Second)
	if acts := p.Start(); !reflect.DeepEqual(acts, []Action{PublishDone{}}) {
		t.Fatalf("Start with no ranks: %v", acts)
	}
}

func TestPolicyStopWithNothingRunningFinishes(t *testing.T) {
	p := NewPolicy("node0", []int{0}, time.Second)
	acts := p.Step(RankExited{Local: 0, Code: 2}, t0)
	if len(acts) != 2 || acts[1].(Finish).Outcome.ExitCode != 2 {
		t.Fatalf("sole rank failing: %v", acts)
	}
}

func TestPolicyIgnoresDuplicateAndUnknownExits(t *testing.T) {
	p := NewPolicy("node0", []int{0, 1}, time.Second)
	p.Step(RankExited{Local: 0, Code: 0}, t0)
	if acts := p.Step(RankExited{Local: 0, Code: 0}, t0); acts != nil {
		t.Fatalf("duplicate exit: %v", acts)
	}
	if acts := p.Step(RankExited{Local: 9, Code: 1}, t0); acts != nil {
		t.Fatalf("unknown rank: %v", acts)
	}
}
