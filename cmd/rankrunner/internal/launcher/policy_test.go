package launcher

import (
	"reflect"
	"syscall"
	"testing"
	"time"

	"github.com/ranktree/ranktree"
)

var t0 = time.Unix(1000, 0)

func TestPolicyLocalFailureStopsAndEscalates(t *testing.T) {
	p := NewPolicy("node0", []int{4, 5, 6}, 0, 3*time.Second)
	if acts := p.Start(); acts != nil {
		t.Fatalf("Start = %v", acts)
	}
	acts := p.Step(RankExited{Local: 1, Code: 7}, t0)
	want := []Action{
		PublishDead{ranktree.DeadRank{Rank: 5, ExitCode: 7, Status: "exit code 7"}},
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
	p := NewPolicy("node1", []int{2, 3}, 0, time.Second)
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
	p := NewPolicy("node1", []int{2}, 0, time.Second)
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
	p := NewPolicy("node0", []int{0, 1}, 0, time.Second)
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
	p := NewPolicy("node0", []int{0, 1}, 0, time.Second)
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
	p := NewPolicy("node1", []int{0}, 0, time.Second)
	p.Step(AbortSeen{Abort{Runner: "node0", Rank: -1, ExitCode: 143, Final: true}}, t0)
	acts := p.Step(RankExited{Local: 0, Code: 143}, t0)
	if o := acts[0].(Finish).Outcome; !o.Final || o.ExitCode != 143 {
		t.Fatalf("outcome %+v", o)
	}
}

func TestPolicyNoLocalRanks(t *testing.T) {
	p := NewPolicy("node0", nil, 0, time.Second)
	if acts := p.Start(); !reflect.DeepEqual(acts, []Action{PublishDone{}}) {
		t.Fatalf("Start with no ranks: %v", acts)
	}
}

func TestPolicyStopWithNothingRunningFinishes(t *testing.T) {
	p := NewPolicy("node0", []int{0}, 0, time.Second)
	acts := p.Step(RankExited{Local: 0, Code: 2}, t0)
	if len(acts) != 3 || acts[2].(Finish).Outcome.ExitCode != 2 {
		t.Fatalf("sole rank failing: %v", acts)
	}
}

func TestPolicyIgnoresDuplicateAndUnknownExits(t *testing.T) {
	p := NewPolicy("node0", []int{0, 1}, 0, time.Second)
	p.Step(RankExited{Local: 0, Code: 0}, t0)
	if acts := p.Step(RankExited{Local: 0, Code: 0}, t0); acts != nil {
		t.Fatalf("duplicate exit: %v", acts)
	}
	if acts := p.Step(RankExited{Local: 9, Code: 1}, t0); acts != nil {
		t.Fatalf("unknown rank: %v", acts)
	}
}

// TestPolicyFailureGraceLetsOthersReport: after rank 1 is killed, the
// others are not signalled during the failure grace period; one reports
// and exits by itself, the other gets SIGTERM at the end of the period and
// SIGKILL a stop grace later. The outcome lists the failures in exit
// order, the victim first.
func TestPolicyFailureGraceLetsOthersReport(t *testing.T) {
	p := NewPolicy("node0", []int{0, 1, 2}, 3*time.Second, 2*time.Second)
	acts := p.Step(RankExited{Local: 1, Code: 137, Signal: syscall.SIGKILL, PID: 11}, t0)
	reason := "rank 1 died of signal: killed (SIGKILL) (exit code 137)"
	want := []Action{
		PublishDead{ranktree.DeadRank{Rank: 1, ExitCode: 137, Status: "signal: killed (SIGKILL)"}},
		PublishAbort{Abort{Runner: "node0", Rank: 1, Reason: reason, ExitCode: 137}},
	}
	if !reflect.DeepEqual(acts, want) {
		t.Fatalf("failure actions = %#v, want %#v (no signal during the grace period)", acts, want)
	}
	if d, ok := p.Deadline(); !ok || !d.Equal(t0.Add(3*time.Second)) {
		t.Fatalf("Deadline = %v, %v; want the end of the failure grace t0+3s", d, ok)
	}
	if acts := p.Step(Tick{}, t0.Add(2999*time.Millisecond)); acts != nil {
		t.Fatalf("signalled before the failure grace ended: %v", acts)
	}
	// Rank 0 reports its own error and exits by itself.
	acts = p.Step(RankExited{Local: 0, Code: 12, Err: "lost rank 1", PID: 10}, t0.Add(200*time.Millisecond))
	if !reflect.DeepEqual(acts, []Action{PublishDead{ranktree.DeadRank{Rank: 0, ExitCode: 12, Status: "exit code 12", Error: "lost rank 1"}}}) {
		t.Fatalf("second failure during the grace period: %v", acts)
	}
	if acts := p.Step(AbortSeen{Abort{Runner: "node1", Rank: 7, ExitCode: 1}}, t0.Add(time.Second)); acts != nil {
		t.Fatalf("a later remote abort changed course: %v", acts)
	}
	if acts := p.Step(Tick{}, t0.Add(3*time.Second)); !reflect.DeepEqual(acts, []Action{SignalRanks{syscall.SIGTERM}}) {
		t.Fatalf("end of the failure grace: %v, want SIGTERM", acts)
	}
	if d, ok := p.Deadline(); !ok || !d.Equal(t0.Add(5*time.Second)) {
		t.Fatalf("SIGKILL deadline = %v, %v; want t0+3s+2s", d, ok)
	}
	if acts := p.Step(Tick{}, t0.Add(5*time.Second)); !reflect.DeepEqual(acts, []Action{SignalRanks{syscall.SIGKILL}}) {
		t.Fatalf("end of the stop grace: %v, want SIGKILL", acts)
	}
	acts = p.Step(RankExited{Local: 2, Code: 137, Signal: syscall.SIGKILL, PID: 12}, t0.Add(5100*time.Millisecond))
	if len(acts) != 1 {
		t.Fatalf("last exit: %v, want only Finish (a stopped rank is no news)", acts)
	}
	o := acts[0].(Finish).Outcome
	if o.Kind != Failed || o.Rank != 1 || o.ExitCode != 137 || o.Reason != reason {
		t.Fatalf("outcome %+v", o)
	}
	wantF := []RankFailure{
		{Rank: 1, Local: 1, PID: 11, Code: 137, Signal: syscall.SIGKILL, At: t0},
		{Rank: 0, Local: 0, PID: 10, Code: 12, Error: "lost rank 1", At: t0.Add(200 * time.Millisecond)},
		{Rank: 2, Local: 2, PID: 12, Code: 137, Signal: syscall.SIGKILL, At: t0.Add(5100 * time.Millisecond), Stopped: true},
	}
	if !reflect.DeepEqual(o.Failures, wantF) {
		t.Fatalf("failures\n%+v\nwant\n%+v", o.Failures, wantF)
	}
}

// TestPolicyFailureGraceEndsWhenAllExit: when every other rank exits
// during the failure grace period, the attempt finishes without signalling
// anyone.
func TestPolicyFailureGraceEndsWhenAllExit(t *testing.T) {
	p := NewPolicy("node0", []int{0, 1, 2}, 3*time.Second, time.Second)
	p.Step(RankExited{Local: 2, Code: 7}, t0)
	if acts := p.Step(RankExited{Local: 0, Code: 0}, t0.Add(time.Second)); acts != nil {
		t.Fatalf("clean exit in the grace period: %v", acts)
	}
	acts := p.Step(RankExited{Local: 1, Code: 70, Err: "init failed"}, t0.Add(2*time.Second))
	if len(acts) != 2 {
		t.Fatalf("last exit: %v, want PublishDead and Finish", acts)
	}
	o := acts[1].(Finish).Outcome
	if o.Rank != 2 || o.ExitCode != 7 || len(o.Failures) != 2 || o.Failures[1].Stopped {
		t.Fatalf("outcome %+v", o)
	}
	if _, ok := p.Deadline(); ok {
		t.Fatal("a finished policy has a deadline")
	}
}

// TestPolicyZeroFailureGraceStopsAtOnce: failure grace 0 keeps the
// immediate SIGTERM.
func TestPolicyZeroFailureGraceStopsAtOnce(t *testing.T) {
	p := NewPolicy("node0", []int{0, 1}, 0, time.Second)
	acts := p.Step(RankExited{Local: 0, Code: 3}, t0)
	if len(acts) != 3 || acts[2] != (SignalRanks{syscall.SIGTERM}) {
		t.Fatalf("%v, want SIGTERM at once", acts)
	}
}

// TestPolicySignalDuringFailureGrace: Ctrl-C during the grace period
// forwards the signal at once and makes the failure final (never
// restarted), keeping the failing rank as the cause.
func TestPolicySignalDuringFailureGrace(t *testing.T) {
	p := NewPolicy("node0", []int{0, 1}, 3*time.Second, time.Second)
	p.Step(RankExited{Local: 0, Code: 5, Err: "boom"}, t0)
	acts := p.Step(SignalReceived{syscall.SIGINT}, t0.Add(time.Second))
	if len(acts) != 2 || acts[1] != (SignalRanks{syscall.SIGINT}) {
		t.Fatalf("signal in the grace period: %v", acts)
	}
	if a := acts[0].(PublishAbort).Abort; !a.Final || a.Rank != 0 || a.ExitCode != 5 || a.Error != "boom" {
		t.Fatalf("abort %+v", a)
	}
	acts = p.Step(RankExited{Local: 1, Code: 130}, t0.Add(time.Second))
	if o := acts[0].(Finish).Outcome; !o.Final || o.Rank != 0 || o.ExitCode != 5 || !o.Failures[1].Stopped {
		t.Fatalf("outcome %+v", o)
	}
}

// TestPolicyRemoteAbortFailureGrace: another runner's failure starts the
// grace period too; an interrupted runner's (final) abort stops at once,
// and one seen during the grace period makes the outcome final.
func TestPolicyRemoteAbortFailureGrace(t *testing.T) {
	p := NewPolicy("node0", []int{0}, 3*time.Second, time.Second)
	if acts := p.Step(AbortSeen{Abort{Runner: "node1", Rank: 1, ExitCode: 4, Error: "oom"}}, t0); acts != nil {
		t.Fatalf("remote failure: %v, want the grace period", acts)
	}
	p.Step(AbortSeen{Abort{Runner: "node2", Rank: -1, ExitCode: 130, Final: true}}, t0.Add(time.Second))
	acts := p.Step(RankExited{Local: 0, Code: 0}, t0.Add(time.Second))
	if o := acts[0].(Finish).Outcome; !o.Remote || !o.Final || o.Rank != 1 || o.Error != "oom" || len(o.Failures) != 0 {
		t.Fatalf("outcome %+v", o)
	}

	p = NewPolicy("node0", []int{0}, 3*time.Second, time.Second)
	acts = p.Step(AbortSeen{Abort{Runner: "node1", Rank: -1, ExitCode: 143, Final: true}}, t0)
	if !reflect.DeepEqual(acts, []Action{SignalRanks{syscall.SIGTERM}}) {
		t.Fatalf("final remote abort: %v, want SIGTERM at once", acts)
	}
}
