package supervisor

import (
	"slices"
	"strings"
	"testing"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
)

// synthDump builds rank's dump for group default_pg of world ranks: seqs
// 1..completed completed, then launched-but-incomplete seqs up to launched,
// the first of them in state atNext.
func synthDump(rank, world int, completed, launched uint64, atNext string) Dump {
	members := make([]int, world)
	for i := range members {
		members[i] = i
	}
	d := Dump{Version: DumpVersion, Job: "j", Rank: rank, WorldSize: world}
	st := GroupStatus{Group: "default_pg", GroupRank: rank, Ranks: members, LastEnqueued: launched, LastCompleted: completed}
	for seq := uint64(1); seq <= launched; seq++ {
		e := Entry{RecordID: seq, Group: "default_pg", Seq: seq, Op: "ALLREDUCE", DType: "float32", Count: 1024, Root: -1,
			RedOp: "sum", TimeCreatedNS: int64(seq) * 10}
		switch {
		case seq <= completed:
			e.State, e.TimeStartedNS, e.TimeCompletedNS = actors.StateCompleted, int64(seq)*10+1, int64(seq)*10+2
		case seq == completed+1:
			e.State = atNext
			if atNext == actors.StateStarted {
				e.TimeStartedNS = int64(seq)*10 + 1
			}
		default:
			e.State = actors.StateScheduled
		}
		if e.TimeStartedNS != 0 {
			st.LastStarted = seq
		}
		d.Entries = append(d.Entries, e)
	}
	d.Groups = []GroupStatus{st}
	return d
}

func TestMergeRankNeverReachedSeq5(t *testing.T) {
	// 4 ranks; rank 1 is stuck in compute after seq 4; the others launched
	// seq 5 (started, waiting on rank 1) and seq 6.
	dumps := []Dump{
		synthDump(0, 4, 4, 6, actors.StateStarted),
		synthDump(1, 4, 4, 4, ""),
		synthDump(2, 4, 4, 6, actors.StateStarted),
		synthDump(3, 4, 4, 5, actors.StateStarted),
	}
	rep := MergeDumps(dumps)
	g := rep.Groups[0]
	if g.FirstBadSeq != 5 || g.Problem != ProblemMissing || !slices.Equal(g.Missing, []int{1}) {
		t.Errorf("first bad %d %q missing %v; want 5 missing [1]", g.FirstBadSeq, g.Problem, g.Missing)
	}
	if g.StuckSeq != 5 || !slices.Equal(g.Stuck, []int{1}) || !slices.Equal(rep.Stuck, []int{1}) {
		t.Errorf("stuck %v at %d (report %v), want [1] at 5", g.Stuck, g.StuckSeq, rep.Stuck)
	}
	s := rep.String()
	for _, want := range []string{"first bad seq 5 (missing)", "rank 1: not reached", "stuck at seq 5: ranks [1]", "stuck ranks: [1]"} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
}

func TestMergeRankHungInsideSeq5(t *testing.T) {
	// Rank 1 launched seq 5 but its engine never started it (an injected
	// hang); the others started it and wait.
	dumps := []Dump{
		synthDump(0, 4, 4, 5, actors.StateStarted),
		synthDump(1, 4, 4, 5, actors.StateScheduled),
		synthDump(2, 4, 4, 5, actors.StateStarted),
		synthDump(3, 4, 4, 5, actors.StateStarted),
	}
	rep := MergeDumps(dumps)
	g := rep.Groups[0]
	if g.FirstBadSeq != 0 {
		t.Errorf("no disagreement expected, got seq %d: %s", g.FirstBadSeq, g.Detail)
	}
	if g.StuckSeq != 5 || !slices.Equal(g.Stuck, []int{1}) || !strings.Contains(g.StuckReason, "never started") {
		t.Errorf("stuck %v at %d (%s), want [1] at 5", g.Stuck, g.StuckSeq, g.StuckReason)
	}
}

func TestMergeSomeCompletedOthersNot(t *testing.T) {
	dumps := []Dump{
		synthDump(0, 3, 5, 5, ""),
		synthDump(1, 3, 4, 5, actors.StateStarted),
		synthDump(2, 3, 5, 5, ""),
	}
	g := MergeDumps(dumps).Groups[0]
	if g.StuckSeq != 5 || !slices.Equal(g.Stuck, []int{1}) {
		t.Errorf("stuck %v at %d, want [1] at 5", g.Stuck, g.StuckSeq)
	}
}

func TestMergeAllStartedNoneCompleted(t *testing.T) {
	dumps := []Dump{synthDump(0, 2, 2, 3, actors.StateStarted), synthDump(1, 2, 2, 3, actors.StateStarted)}
	g := MergeDumps(dumps).Groups[0]
	if g.StuckSeq != 3 || !slices.Equal(g.Stuck, []int{0, 1}) || !strings.Contains(g.StuckReason, "none completed") {
		t.Errorf("stuck %v at %d (%s)", g.Stuck, g.StuckSeq, g.StuckReason)
	}
}

func TestMergeMismatchedOp(t *testing.T) {
	dumps := []Dump{
		synthDump(0, 3, 6, 7, actors.StateStarted),
		synthDump(1, 3, 6, 7, actors.StateStarted),
		synthDump(2, 3, 6, 7, actors.StateStarted),
	}
	// Rank 2 launched a broadcast at seq 7 where the others all-reduce.
	e := &dumps[2].Entries[6]
	e.Op, e.Root, e.RedOp = "BROADCAST", 0, ""
	g := MergeDumps(dumps).Groups[0]
	if g.FirstBadSeq != 7 || g.Problem != ProblemMismatch {
		t.Fatalf("first bad %d %q, want 7 mismatch", g.FirstBadSeq, g.Problem)
	}
	if !strings.Contains(g.Detail, "rank 2: BROADCAST(float32×1024, root 0)") || !strings.Contains(g.Detail, "rank 0: ALLREDUCE(float32×1024, sum)") {
		t.Errorf("detail %q", g.Detail)
	}
	// An all-to-all (no count in its fingerprint) reads by its split sizes.
	e.Op, e.Root, e.Count = "ALLTOALL", -1, 0
	g = MergeDumps(dumps).Groups[0]
	if !strings.Contains(g.Detail, "rank 2: ALLTOALL(float32, split sizes per rank)") || strings.Contains(g.Detail, "×0") {
		t.Errorf("all-to-all detail %q", g.Detail)
	}
	// A dtype or count difference is a mismatch too.
	dumps[2].Entries[6] = dumps[0].Entries[6]
	dumps[1].Entries[2].DType = "bfloat16"
	if g := MergeDumps(dumps).Groups[0]; g.FirstBadSeq != 3 || g.Problem != ProblemMismatch {
		t.Errorf("dtype mismatch: first bad %d %q, want 3", g.FirstBadSeq, g.Problem)
	}
}

func TestMergeMissingRankDump(t *testing.T) {
	// Rank 3 died (SIGKILL): no dump at all.
	dumps := []Dump{
		synthDump(0, 4, 8, 9, actors.StateStarted),
		synthDump(2, 4, 8, 9, actors.StateStarted),
		synthDump(1, 4, 8, 9, actors.StateStarted),
	}
	rep := MergeDumps(dumps)
	if !slices.Equal(rep.MissingDumps, []int{3}) || !slices.Equal(rep.Ranks, []int{0, 1, 2}) {
		t.Errorf("missing %v ranks %v", rep.MissingDumps, rep.Ranks)
	}
	if !slices.Contains(rep.Stuck, 3) || !slices.Contains(rep.Groups[0].Stuck, 3) {
		t.Errorf("stuck %v / %v should contain the dead rank 3", rep.Stuck, rep.Groups[0].Stuck)
	}
	if s := rep.String(); !strings.Contains(s, "NO DUMP from ranks [3]") || !strings.Contains(s, "rank 3: no dump") {
		t.Errorf("report:\n%s", s)
	}
}

func TestMergeHealthyJob(t *testing.T) {
	dumps := []Dump{synthDump(0, 2, 9, 9, ""), synthDump(1, 2, 9, 9, "")}
	rep := MergeDumps(dumps)
	g := rep.Groups[0]
	if g.FirstBadSeq != 0 || len(g.Stuck) != 0 || g.StuckSeq != 0 || len(rep.Stuck) != 0 {
		t.Errorf("healthy job reported problems: %+v", rep)
	}
	if s := rep.String(); !strings.Contains(s, "stuck ranks: none") || strings.Contains(s, "at seq 0") {
		t.Errorf("report:\n%s", s)
	}
}

func TestMergeIgnoresOlderEpochAndEvictedEntries(t *testing.T) {
	d0 := synthDump(0, 2, 10, 10, "")
	d1 := synthDump(1, 2, 10, 10, "")
	// Rank 1's ring lost seqs 1-5; rank 0 still has an old epoch's
	// different op at seq 3.
	d1.Entries = d1.Entries[5:]
	for _, d := range []Dump{d0, d1} {
		for i := range d.Entries {
			d.Entries[i].Epoch = 1
		}
	}
	d0.Groups[0].Epoch, d1.Groups[0].Epoch = 1, 1
	d0.Entries = append(d0.Entries, Entry{RecordID: 99, Group: "default_pg", Epoch: 0, Seq: 3, Op: "BARRIER"})
	g := MergeDumps([]Dump{d0, d1}).Groups[0]
	if g.Epoch != 1 || g.FirstBadSeq != 0 || len(g.Stuck) != 0 {
		t.Errorf("epoch %d first bad %d (%s) stuck %v", g.Epoch, g.FirstBadSeq, g.Detail, g.Stuck)
	}
}

// TestMergeRecorderDumps runs the merge on dumps produced by real
// FlightRecorders with Works: rank 1 records seqs 1-4 only.
func TestMergeRecorderDumps(t *testing.T) {
	var dumps []Dump
	for rank := 0; rank < 3; rank++ {
		r := NewFlightRecorder(RecorderConfig{Job: "j", Rank: rank, WorldSize: 3})
		r.AddGroup("default_pg", 0, rank, []int{0, 1, 2})
		last := uint64(5)
		if rank == 1 {
			last = 4
		}
		for seq := uint64(1); seq <= last; seq++ {
			p := comm.NewPromise(comm.OpAllReduce)
			r.Record("default_pg", allreduceOp(seq, 8), p.Work(), 0)
			if seq <= 4 {
				p.MarkStarted()
				p.Complete(nil)
			}
		}
		dumps = append(dumps, r.Dump("timeout"))
	}
	rep := MergeDumps(dumps)
	if !slices.Equal(rep.Stuck, []int{1}) || rep.Groups[0].FirstBadSeq != 5 {
		t.Errorf("report:\n%s", rep)
	}
}

// FuzzMergeDumps feeds arbitrary JSON through ParseDump and MergeDumps:
// neither may panic, and every stuck rank must be a member or a rank
// without a dump.
func FuzzMergeDumps(f *testing.F) {
	f.Add([]byte(`{"version":"ranktree-fr/1","rank":0,"world_size":2,"pg_status":[{"name":"g","ranks":[0,1],"last_enqueued_collective":3,"last_completed_collective":2}],"entries":[{"process_group":"g","collective_seq_id":3,"op":"ALLREDUCE"}]}`),
		[]byte(`{"version":"ranktree-fr/1","rank":1,"world_size":2,"pg_status":[{"name":"g","ranks":[0,1],"last_enqueued_collective":2,"last_completed_collective":2}]}`))
	f.Add([]byte(`{"version":"ranktree-fr/1","rank":5}`), []byte(`{"version":"ranktree-fr/1","rank":0,"pg_status":[{"name":"x","ranks":[9,-1]}]}`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		var dumps []Dump
		for _, raw := range [][]byte{a, b} {
			if d, err := ParseDump(raw); err == nil && d.Rank >= 0 && d.Rank < 1024 && d.WorldSize < 1024 {
				dumps = append(dumps, d)
			}
		}
		rep := MergeDumps(dumps)
		_ = rep.String()
		for _, g := range rep.Groups {
			for _, r := range g.Stuck {
				if !slices.Contains(g.Members, r) {
					t.Fatalf("stuck rank %d is not a member of %v", r, g.Members)
				}
			}
		}
	})
}
