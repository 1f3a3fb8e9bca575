package diagnose

import (
	"bytes"
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/supervisor"
)

func TestFetchAndReport(t *testing.T) {
	st := store.NewMemStore()
	ctx := context.Background()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(st.Set(ctx, "trace/0", []byte(`{"rank":0,"entries":[]}`)))
	must(st.Set(ctx, "restart/1/trace/2", []byte(`{"rank":2}`)))
	must(st.Set(ctx, "restart/1/trace/0", []byte(`{"rank":0,"latest":true}`)))
	must(st.Set(ctx, "restart/1/other", []byte(`x`)))
	must(st.Set(ctx, "restart/0/trace/3", []byte(`{"rank":3}`))) // another attempt: ignored
	dumps, err := Fetch(ctx, st, []string{"", "restart/1/"}, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(dumps) != 2 || dumps[0].Rank != 0 || dumps[1].Rank != 2 || !strings.Contains(string(dumps[0].Raw), "latest") {
		t.Fatalf("dumps %+v", dumps)
	}
	if m := Missing(dumps, 4); !reflect.DeepEqual(m, []int{1, 3}) {
		t.Fatalf("missing %v", m)
	}
	var b bytes.Buffer
	ListDumps(&b, dumps, 4)
	if !strings.Contains(b.String(), "missing ranks (no dump): [1 3]") {
		t.Fatalf("report:\n%s", b.String())
	}
	if _, err := Merge(dumps, 4); err == nil || !strings.Contains(err.Error(), "trace/0") {
		t.Fatalf("Merge of non-dumps: %v, want an error naming the key", err)
	}
}

// TestMergeNamesStuckRanks: rank 1 never launched seq 5 that ranks 0 and 2
// started; rank 3 (of --world-size 4) left no dump.
func TestMergeNamesStuckRanks(t *testing.T) {
	st := store.NewMemStore()
	ctx := context.Background()
	for r := 0; r < 3; r++ {
		last := uint64(5)
		if r == 1 {
			last = 4
		}
		d := supervisor.Dump{Version: supervisor.DumpVersion, Job: "j", Rank: r, WorldSize: 3,
			Groups: []supervisor.GroupStatus{{Group: "world", GroupRank: r, Ranks: []int{0, 1, 2},
				LastEnqueued: last, LastStarted: last, LastCompleted: 4}}}
		for seq := uint64(1); seq <= last; seq++ {
			state, started := actors.StateCompleted, int64(seq)
			if seq == 5 {
				state = actors.StateStarted
			}
			d.Entries = append(d.Entries, supervisor.Entry{RecordID: seq, Group: "world", Seq: seq, Op: "ALLREDUCE",
				DType: "float32", Count: 8, Root: -1, State: state, TimeStartedNS: started})
		}
		if err := supervisor.WriteDump(ctx, d, "", store.WithPrefix(st, "restart/0/")); err != nil {
			t.Fatal(err)
		}
	}
	dumps, err := Fetch(ctx, st, []string{"", "restart/0/"}, 100*time.Millisecond)
	if err != nil || len(dumps) != 3 {
		t.Fatalf("fetch: %d dumps, %v", len(dumps), err)
	}
	rep, err := Merge(dumps, 4)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rep.Stuck, []int{1, 3}) || !reflect.DeepEqual(rep.MissingDumps, []int{3}) {
		t.Fatalf("stuck %v, missing %v; want [1 3], [3]\n%s", rep.Stuck, rep.MissingDumps, rep)
	}
	if len(rep.Groups) != 1 || rep.Groups[0].StuckSeq != 5 || rep.Groups[0].FirstBadSeq != 5 {
		t.Fatalf("group report %+v", rep.Groups)
	}
}

func TestFetchRejectsInvalidJSON(t *testing.T) {
	st := store.NewMemStore()
	if err := st.Set(context.Background(), "trace/1", []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	if _, err := Fetch(context.Background(), st, []string{""}, 100*time.Millisecond); err == nil || !strings.Contains(err.Error(), "trace/1") {
		t.Fatalf("err %v, want one naming trace/1", err)
	}
}
