package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/internal/eventschema"
	"github.com/ranktree/ranktree/store"
)

// TestRankWiring starts a rank's whole supervision over a store and NATS,
// lets one op time out, and checks the Work's error, the engine abort, the
// events on NATS, the dump in the store, a dump on request, and a bounded Close.
func TestRankWiring(t *testing.T) {
	nc := embeddedNATS(t)
	sub, err := nc.SubscribeSync(actors.EventWildcard("rk"))
	if err != nil {
		t.Fatal(err)
	}
	st := store.NewMemStore()
	defer st.Close()
	ex := &recorder{}
	r, err := StartRank(newSystem(), RankConfig{Job: "rk", Rank: 0, WorldSize: 2, Store: st, NATS: nc, Exit: ex.Exit,
		Cfg: Config{ErrorHandling: CleanupOnly, Timeout: 200 * time.Millisecond, WatchdogInterval: 5 * time.Millisecond},
		Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	eng := &fakeEngine{}
	obs := r.AttachGroup(GroupSpec{Name: "default_pg", Engine: "cpu", Members: []int{0, 1}}, 0, eng)
	p := comm.NewPromise(comm.OpAllReduce)
	obs.Scheduled(allreduceOp(1, 8), p)
	p.MarkStarted()
	err = waitWork(t, p.Work(), 10*time.Second)
	var te *comm.TimeoutError
	if !errors.As(err, &te) || te.Timeout != 200*time.Millisecond || len(te.NotReached) != 1 || te.NotReached[0] != 1 {
		t.Fatalf("work error %v", err)
	}
	eventually(t, "engine abort", func() bool { return errors.Is(eng.abortReason(), comm.ErrTimeout) })
	eventually(t, "dump in the store", func() bool {
		ok, _ := st.Check(context.Background(), []string{TraceKey(0)})
		return ok
	})
	dumps, err := RequestDumps(context.Background(), nc, "rk", 1, 10*time.Second)
	if err != nil || len(dumps) != 1 || dumps[0].Entries[0].TimeoutMS != 200 || dumps[0].Entries[0].State != actors.StateFailed {
		t.Errorf("dump on request: %+v, %v", dumps, err)
	}
	start := time.Now()
	if err := r.Close(2 * time.Second); err != nil {
		t.Errorf("Close: %v", err)
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("Close took %v", d)
	}
	if err := r.Close(time.Second); err != nil {
		t.Errorf("second Close: %v", err)
	}
	seen := map[string]bool{}
	schema, err := eventschema.Load("..")
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := sub.NextMsg(time.Second)
		if err != nil {
			break
		}
		if err := schema.Validate(m.Data); err != nil {
			t.Errorf("event on %s breaks docs/events.schema.json: %v", m.Subject, err)
		}
		var ev actors.Event
		if json.Unmarshal(m.Data, &ev) == nil {
			seen[ev.Kind+"/"+ev.State+ev.Action] = true
		}
	}
	for _, k := range []string{"comm_init/", "work/scheduled", "work/failed", "watchdog/timeout", "comm_abort/abort", "watchdog/dump"} {
		if !seen[k] {
			t.Errorf("no %s event on NATS (saw %v)", k, seen)
		}
	}
	if ex.exited.Load() != 0 {
		t.Error("CleanupOnly rank exited")
	}
}

func TestStartRankRejectsBadConfig(t *testing.T) {
	if _, err := StartRank(newSystem(), RankConfig{Cfg: Config{Timeout: -1}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("bad config: %v", err)
	}
}
