package envcontract

import (
	"errors"
	"testing"

	"github.com/ranktree/ranktree/supervisor"
)

func lookup(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
}

// TestReadParsesOnce: the identity, store, engine and supervision
// variables land in typed fields; a malformed one is a *VarError naming
// it; SupervisionWith replaces one supervision variable without reading
// the environment again.
func TestReadParsesOnce(t *testing.T) {
	e, err := Read(lookup(map[string]string{Rank: "2", WorldSize: "4", StoreTimeout: "90s", Backend: "nccl",
		Transport: "tcp", FlatThreshold: "-1", Fault: "hang@rank=1,seq=5", supervisor.EnvActorPanic: "escalate"}))
	if err != nil {
		t.Fatal(err)
	}
	if e.Rank != (Int{Value: 2, Set: true}) || e.LocalRank.Set || e.StoreTimeout.Seconds() != 90 || e.Backend != "nccl" ||
		e.CPU.Transport != "tcp" || e.CPU.FlatThreshold != -1 || len(e.Faults) != 1 {
		t.Errorf("parsed %+v", e)
	}
	sup, err := e.SupervisionWith(supervisor.EnvActorPanic, "restart")
	if err != nil || sup.ActorPanic != supervisor.PanicRestart || e.Supervision.ActorPanic != supervisor.PanicEscalate {
		t.Errorf("SupervisionWith(restart): %v, %v (read: %v)", sup.ActorPanic, err, e.Supervision.ActorPanic)
	}
	for k, v := range map[string]string{Rank: "two", StoreWait: "maybe", FlatThreshold: "-2", supervisor.EnvActorPanic: "sometimes"} {
		_, err := Read(lookup(map[string]string{k: v}))
		var ve *VarError
		if !errors.As(err, &ve) || ve.Var != k || ve.Value != v || ve.Msg == "" {
			t.Errorf("%s=%q: %v, want a *VarError naming it", k, v, err)
		}
	}
}
