package supervisor

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store/natsstore"
)

func embeddedNATS(t *testing.T) *nats.Conn {
	t.Helper()
	url, shutdown, err := natsstore.StartEmbedded(natsstore.EmbeddedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(shutdown)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestDumpsOnRequest serves three ranks' recorders over NATS (rank 1 stuck
// before seq 3), collects their dumps with RequestDumps and merges them.
func TestDumpsOnRequest(t *testing.T) {
	nc := embeddedNATS(t)
	const world = 3
	for rank := 0; rank < world; rank++ {
		r := NewFlightRecorder(RecorderConfig{Job: "jd", Rank: rank, WorldSize: world})
		r.AddGroup("default_pg", 0, rank, []int{0, 1, 2})
		last := uint64(3)
		if rank == 1 {
			last = 2
		}
		for seq := uint64(1); seq <= last; seq++ {
			p := comm.NewPromise(comm.OpAllReduce)
			r.Record("default_pg", allreduceOp(seq, 4), p.Work(), time.Minute)
			if seq < 3 {
				p.MarkStarted()
				p.Complete(nil)
			}
		}
		rec := &recorder{}
		s, err := ServeDumps(nc, "jd", rank, r, rec, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
	}
	dumps, err := RequestDumps(context.Background(), nc, "jd", world, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(dumps) != world || dumps[0].Rank != 0 || dumps[2].Rank != 2 || dumps[1].Reason != "request" {
		t.Fatalf("got %d dumps: %+v", len(dumps), dumps)
	}
	if rep := MergeDumps(dumps); !slices.Equal(rep.Stuck, []int{1}) {
		t.Errorf("merged report:\n%s", rep)
	}
	// One rank's subject answers alone.
	m, err := nc.Request(DumpSubject("jd", 2), nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := ParseDump(m.Data); err != nil || d.Rank != 2 {
		t.Errorf("rank 2 reply: %+v, %v", d, err)
	}
	// A job nobody serves: no dumps, no error, bounded wait.
	start := time.Now()
	dumps, err = RequestDumps(context.Background(), nc, "other", 2, 200*time.Millisecond)
	if err != nil || len(dumps) != 0 || time.Since(start) > 5*time.Second {
		t.Errorf("unserved job: %d dumps, %v, after %v", len(dumps), err, time.Since(start))
	}
}
