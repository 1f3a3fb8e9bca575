package supervisor

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ranktree/ranktree/comm"
)

// Problems MergeDumps reports at a group's first bad seq.
const (
	// ProblemMismatch: two ranks recorded different collectives (op, dtype,
	// count, root or reduction) at the same seq.
	ProblemMismatch = "mismatch"
	// ProblemMissing: some ranks recorded the seq and others never reached it.
	ProblemMissing = "missing"
)

// RankProgress is one rank's progress in one group, from its dump.
type RankProgress struct {
	Rank          int    // global rank
	HasDump       bool   // false: no dump from this rank (dead, or never dumped)
	LastEnqueued  uint64 // last collective seq launched
	LastStarted   uint64
	LastCompleted uint64
	// AtStuckSeq is the rank's entry state at the group's StuckSeq
	// (actors.State*), "not reached", "unknown" (evicted) or "" (no dump).
	AtStuckSeq string
}

// GroupReport is MergeDumps' finding for one process group (at its latest epoch).
type GroupReport struct {
	Group   string
	Epoch   uint32
	Members []int // global ranks, by group rank
	// FirstBadSeq is the first collective seq where ranks disagree or some
	// rank is missing (0: none); Problem is ProblemMismatch or ProblemMissing
	// and Detail describes each rank's op there.
	FirstBadSeq uint64
	Problem     string
	Detail      string
	// Missing lists the ranks that had not reached FirstBadSeq.
	Missing []int
	// StuckSeq is the first seq not completed by every member (0: all
	// members completed everything they launched); Stuck the ranks holding
	// it up and StuckReason why they were chosen.
	StuckSeq    uint64
	Stuck       []int
	StuckReason string
	Progress    []RankProgress
}

// Report is the merge of all ranks' flight-recorder dumps: what `rankrunner
// diagnose` prints.
type Report struct {
	Job          string
	WorldSize    int
	Ranks        []int // ranks that produced a dump
	MissingDumps []int // ranks in [0, WorldSize) without one
	Groups       []GroupReport
	Stuck        []int // union of the groups' stuck ranks and MissingDumps
}

type fpKey struct {
	op, dtype, redop string
	count            int64
	root             int32
}

// String reads like "ALLREDUCE(float32×1024, sum)"; an all-to-all, whose
// fingerprint carries no count (per-rank totals differ), reads
// "ALLTOALL(float32, split sizes per rank)".
func (k fpKey) String() string {
	s := fmt.Sprintf("%s(%s×%d", k.op, k.dtype, k.count)
	if k.op == comm.OpAllToAll.String() && k.count == 0 {
		s = fmt.Sprintf("%s(%s, split sizes per rank", k.op, k.dtype)
	}
	if k.root >= 0 {
		s += fmt.Sprintf(", root %d", k.root)
	}
	if k.redop != "" {
		s += ", " + k.redop
	}
	return s + ")"
}

// MergeDumps merges one dump per rank (any order; a later dump of the same
// rank replaces an earlier one) and names, per group, the first seq where
// ranks disagree or one is missing, and the stuck ranks: the ranks that
// never reached the first incomplete seq; failing that, those that reached
// but never started it while others did; failing that, those that did not
// complete it while others did. Ranks without a dump count as stuck.
func MergeDumps(dumps []Dump) Report {
	byRank := map[int]Dump{}
	var rep Report
	for _, d := range dumps {
		byRank[d.Rank] = d
		rep.WorldSize = max(rep.WorldSize, d.WorldSize, d.Rank+1)
		if rep.Job == "" {
			rep.Job = d.Job
		}
	}
	for r := 0; r < rep.WorldSize; r++ {
		if _, ok := byRank[r]; ok {
			rep.Ranks = append(rep.Ranks, r)
		} else {
			rep.MissingDumps = append(rep.MissingDumps, r)
		}
	}
	var names []string
	for _, d := range byRank {
		for _, g := range d.Groups {
			if !slices.Contains(names, g.Group) {
				names = append(names, g.Group)
			}
		}
	}
	slices.Sort(names)
	stuck := slices.Clone(rep.MissingDumps)
	for _, name := range names {
		gr := mergeGroup(name, byRank, rep.WorldSize)
		rep.Groups = append(rep.Groups, gr)
		stuck = append(stuck, gr.Stuck...)
	}
	slices.Sort(stuck)
	rep.Stuck = slices.Compact(stuck)
	return rep
}

// rankView is one rank's data for one group.
type rankView struct {
	has     bool
	status  GroupStatus
	entries map[uint64]Entry // collective seq → entry (current epoch)
	oldest  uint64           // lowest seq still in the ring (0: none)
}

func mergeGroup(name string, byRank map[int]Dump, world int) GroupReport {
	gr := GroupReport{Group: name}
	// Latest epoch and membership.
	for _, d := range byRank {
		for _, g := range d.Groups {
			if g.Group == name && g.Epoch >= gr.Epoch {
				gr.Epoch = g.Epoch
				if len(g.Ranks) > 0 {
					gr.Members = slices.Clone(g.Ranks)
				}
			}
		}
	}
	if gr.Members == nil { // unknown membership: every rank of the world
		for r := 0; r < world; r++ {
			gr.Members = append(gr.Members, r)
		}
	}
	views := map[int]*rankView{}
	var seqs []uint64
	for _, r := range gr.Members {
		v := &rankView{entries: map[uint64]Entry{}}
		views[r] = v
		d, ok := byRank[r]
		if !ok {
			continue
		}
		v.has = true
		for _, g := range d.Groups {
			if g.Group == name && g.Epoch == gr.Epoch {
				v.status = g
			}
		}
		for _, e := range d.Entries {
			if e.Group != name || e.Epoch != gr.Epoch || e.IsP2P || e.Seq == 0 {
				continue
			}
			v.entries[e.Seq] = e
			if v.oldest == 0 || e.Seq < v.oldest {
				v.oldest = e.Seq
			}
			if !slices.Contains(seqs, e.Seq) {
				seqs = append(seqs, e.Seq)
			}
		}
	}
	slices.Sort(seqs)
	findFirstBad(&gr, views, seqs)
	findStuck(&gr, views)
	return gr
}

// findFirstBad scans seqs in order for a mismatch or a rank that never reached one.
func findFirstBad(gr *GroupReport, views map[int]*rankView, seqs []uint64) {
	for _, s := range seqs {
		var parts []string
		var missing []int
		kinds := map[fpKey]bool{}
		for _, r := range gr.Members {
			v := views[r]
			if !v.has {
				continue
			}
			e, ok := v.entries[s]
			switch {
			case ok:
				k := fpKey{op: e.Op, dtype: e.DType, count: e.Count, root: e.Root, redop: e.RedOp}
				kinds[k] = true
				parts = append(parts, fmt.Sprintf("rank %d: %v", r, k))
			case v.status.LastEnqueued < s:
				missing = append(missing, r)
				parts = append(parts, fmt.Sprintf("rank %d: not reached (last launched seq %d)", r, v.status.LastEnqueued))
			default:
				parts = append(parts, fmt.Sprintf("rank %d: evicted from its ring", r))
			}
		}
		if len(kinds) > 1 || len(missing) > 0 {
			gr.FirstBadSeq, gr.Missing = s, missing
			gr.Problem = ProblemMissing
			if len(kinds) > 1 {
				gr.Problem = ProblemMismatch
			}
			gr.Detail = strings.Join(parts, "; ")
			return
		}
	}
}

func findStuck(gr *GroupReport, views map[int]*rankView) {
	var minDone, maxEnq uint64
	first := true
	for _, r := range gr.Members {
		v := views[r]
		if !v.has {
			continue
		}
		if first || v.status.LastCompleted < minDone {
			minDone = v.status.LastCompleted
		}
		first = false
		maxEnq = max(maxEnq, v.status.LastEnqueued)
	}
	s := minDone + 1
	var noDump, notReached, notStarted, notDone, all []int
	for _, r := range gr.Members {
		v := views[r]
		p := RankProgress{Rank: r, HasDump: v.has, LastEnqueued: v.status.LastEnqueued,
			LastStarted: v.status.LastStarted, LastCompleted: v.status.LastCompleted}
		if !v.has {
			noDump = append(noDump, r)
			gr.Progress = append(gr.Progress, p)
			continue
		}
		all = append(all, r)
		e, ok := v.entries[s]
		switch {
		case v.status.LastEnqueued < s:
			p.AtStuckSeq = "not reached"
			notReached = append(notReached, r)
		case !ok:
			p.AtStuckSeq = "unknown"
		default:
			p.AtStuckSeq = e.State
			if e.TimeStartedNS == 0 {
				notStarted = append(notStarted, r)
			}
		}
		if v.status.LastCompleted < s {
			notDone = append(notDone, r)
		}
		gr.Progress = append(gr.Progress, p)
	}
	if len(all) == 0 || s > maxEnq {
		// Every rank with a dump completed all it launched.
		for i := range gr.Progress {
			gr.Progress[i].AtStuckSeq = ""
		}
		gr.Stuck = noDump
		if len(noDump) > 0 {
			gr.StuckReason = fmt.Sprintf("ranks %v left no dump", noDump)
		}
		return
	}
	gr.StuckSeq = s
	switch {
	case len(notReached) > 0:
		gr.Stuck, gr.StuckReason = notReached, fmt.Sprintf("ranks %v never reached seq %d, which the other ranks launched", notReached, s)
	case len(notStarted) > 0 && len(notStarted) < len(all):
		gr.Stuck, gr.StuckReason = notStarted, fmt.Sprintf("ranks %v launched seq %d but never started it, while the other ranks did", notStarted, s)
	case len(notDone) < len(all):
		gr.Stuck, gr.StuckReason = notDone, fmt.Sprintf("ranks %v did not complete seq %d, which other ranks completed", notDone, s)
	default:
		gr.Stuck, gr.StuckReason = all, fmt.Sprintf("ranks %v all started seq %d and none completed it (transport or engine hang)", all, s)
	}
	if len(noDump) > 0 {
		gr.Stuck = append(slices.Clone(gr.Stuck), noDump...)
		slices.Sort(gr.Stuck)
		gr.StuckReason += fmt.Sprintf("; ranks %v left no dump", noDump)
	}
}

// String renders the report for humans, e.g.
//
//	job j: 4 ranks, dumps from [0 1 2 3]
//	group "default_pg" (epoch 0, ranks [0 1 2 3]):
//	  first bad seq 5 (missing): rank 0: ALLREDUCE(float32×1024, sum); rank 1: not reached (last launched seq 4); ...
//	  stuck at seq 5: ranks [1] never reached seq 5, which the other ranks launched
//	  rank 0: launched 5, started 5, completed 4 (at seq 5: started)
//	stuck ranks: [1]
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "job %s: %d ranks, dumps from %v", r.Job, r.WorldSize, r.Ranks)
	if len(r.MissingDumps) > 0 {
		fmt.Fprintf(&b, "; NO DUMP from ranks %v", r.MissingDumps)
	}
	b.WriteByte('\n')
	for _, g := range r.Groups {
		fmt.Fprintf(&b, "group %q (epoch %d, ranks %v):\n", g.Group, g.Epoch, g.Members)
		if g.FirstBadSeq != 0 {
			fmt.Fprintf(&b, "  first bad seq %d (%s): %s\n", g.FirstBadSeq, g.Problem, g.Detail)
		} else {
			b.WriteString("  all recorded seqs agree across ranks\n")
		}
		if len(g.Stuck) > 0 {
			if g.StuckSeq != 0 {
				fmt.Fprintf(&b, "  stuck at seq %d: %s\n", g.StuckSeq, g.StuckReason)
			} else {
				fmt.Fprintf(&b, "  stuck: %s\n", g.StuckReason)
			}
		} else {
			b.WriteString("  no stuck rank: every rank completed what it launched\n")
		}
		for _, p := range g.Progress {
			if !p.HasDump {
				fmt.Fprintf(&b, "  rank %d: no dump\n", p.Rank)
				continue
			}
			fmt.Fprintf(&b, "  rank %d: launched %d, started %d, completed %d", p.Rank, p.LastEnqueued, p.LastStarted, p.LastCompleted)
			if p.AtStuckSeq != "" {
				fmt.Fprintf(&b, " (at seq %d: %s)", g.StuckSeq, p.AtStuckSeq)
			}
			b.WriteByte('\n')
		}
	}
	if len(r.Stuck) > 0 {
		fmt.Fprintf(&b, "stuck ranks: %v\n", r.Stuck)
	} else {
		b.WriteString("stuck ranks: none\n")
	}
	return b.String()
}
