package comm

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ranktree/ranktree/store"
)

// WithLocalSynchronization makes NewGroup synchronize among the new
// group's members only (torch new_group(use_local_synchronization=True)):
// only the members call it, in any order relative to other groups'
// creation, and a caller not in ranks gets its Rank -1 view at once,
// without waiting for anyone. The members agree through the job's store
// (GroupConfig.Store), under keys of the parent, its epoch and the new
// group's name, so that groups created concurrently never meet each
// other's keys. Without WithGroupName the name is derived from the ranks
// (as torch hashes them): "<parent>.local-<r0>_<r1>_...[.<k>]", or a hash
// of them for more than 16 ranks, k counting earlier local groups of the
// same ranks from this parent (members create them in the same order).
//
// Errors: the members' calls differ (another rank list under the same
// explicit name): every member that sees it fails with an error wrapping
// ErrMismatch (*NewGroupMismatchError on the rank that found it, naming
// both calls), and a retry needs another name; members missing after the
// group's timeout: *NewGroupTimeoutError (ErrTimeout) naming them, and
// every member may call again with the same arguments; bad ranks: an
// error wrapping ErrInvalidArgument, the same on every caller; no store:
// ErrUnsupported.
func WithLocalSynchronization() GroupOption { return func(o *groupOptions) { o.local = true } }

// NewGroupTimeoutError is NewGroup's failure with WithLocalSynchronization
// when some members did not call it within the timeout (torch's store
// based barrier timeout, "Timed out initializing process group in store
// based barrier"). It unwraps to ErrTimeout. Recoverable: call NewGroup
// again on every member.
type NewGroupTimeoutError struct {
	Parent  string        // the parent group
	Name    string        // the new group
	Rank    int           // the reporting rank (global)
	Missing []int         // global ranks that never called
	Timeout time.Duration // how long the reporting rank waited
}

// Error implements error, naming the ranks that never came.
func (e *NewGroupTimeoutError) Error() string {
	return fmt.Sprintf("comm: NewGroup %q with local synchronization on group %q: timed out after %v on global rank %d; global ranks %v never called it",
		e.Name, e.Parent, e.Timeout, e.Rank, e.Missing)
}

// Unwrap returns ErrTimeout.
func (e *NewGroupTimeoutError) Unwrap() error { return ErrTimeout }

// checkRankList checks a list of global ranks for a new group of pg: not
// empty, no repeats, every one a member of pg. sorted is ranks sorted.
func (pg *ProcessGroup) checkRankList(call string, ranks, sorted []int) error {
	if len(ranks) == 0 {
		return fmt.Errorf("%w: %s on group %q: empty rank list", ErrInvalidArgument, call, pg.name)
	}
	for i, g := range sorted {
		if i > 0 && sorted[i-1] == g {
			return fmt.Errorf("%w: %s on group %q: rank %d appears twice in %v", ErrInvalidArgument, call, pg.name, g, ranks)
		}
		if _, ok := pg.toGroup[g]; !ok {
			return fmt.Errorf("%w: %s on group %q: global rank %d is not a member (members %v)", ErrInvalidArgument, call, pg.name, g, pg.global)
		}
	}
	return nil
}

// nextLocal adds delta to the count of local-synchronization groups
// created from pg with key (a rank list or a name) and returns the new
// count (1, 2, ... for delta 1).
func (pg *ProcessGroup) nextLocal(key string, delta int) int {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	if pg.locals == nil {
		pg.locals = map[string]int{}
	}
	pg.locals[key] += delta
	return pg.locals[key]
}

// ranksTag spells a sorted rank list for a group name: "0_2_3", or "h"
// and 12 hex digits of its SHA-1 for more than 16 ranks.
func ranksTag(sorted []int) string {
	parts := make([]string, len(sorted))
	for i, r := range sorted {
		parts[i] = strconv.Itoa(r)
	}
	s := strings.Join(parts, "_")
	if len(sorted) <= 16 {
		return s
	}
	h := sha1.Sum([]byte(s))
	return "h" + hex.EncodeToString(h[:6])
}

// newGroupLocal is NewGroup with WithLocalSynchronization.
func (pg *ProcessGroup) newGroupLocal(ctx context.Context, ranks []int, o groupOptions) (*ProcessGroup, error) {
	sorted := slices.Clone(ranks)
	slices.Sort(sorted)
	if pg.rank < 0 {
		name := o.name
		if name == "" {
			name = fmt.Sprintf("%s.local-%s", pg.name, ranksTag(sorted))
		}
		return pg.nonMember(name, sorted, o.timeout)
	}
	if err := pg.checkRankList("NewGroup", ranks, sorted); err != nil {
		return nil, err
	}
	me := pg.global[pg.rank]
	if !slices.Contains(sorted, me) {
		name := o.name
		if name == "" {
			name = fmt.Sprintf("%s.local-%s", pg.name, ranksTag(sorted))
		}
		pg.log.Debug().Str("new_group", name).Ints("ranks", sorted).Msg("not a member of the new group (local synchronization)")
		return pg.nonMember(name, sorted, o.timeout)
	}
	if pg.store == nil {
		return nil, fmt.Errorf("%w: NewGroup with local synchronization on group %q: the group has no store (GroupConfig.Store)", ErrUnsupported, pg.name)
	}
	name := o.name
	key := "name " + name
	if name == "" {
		key = "ranks " + ranksTag(sorted)
	}
	k := pg.nextLocal(key, 1)
	if o.name == "" {
		name = fmt.Sprintf("%s.local-%s", pg.name, ranksTag(sorted))
		if k > 1 {
			name += "." + strconv.Itoa(k)
		}
	}
	prefix := fmt.Sprintf("newgroup/%s/%d/%s/%d/", pg.name, pg.epoch, name, k)
	if err := pg.agreeLocal(ctx, prefix, name, sorted, o.timeout); err != nil {
		// A failed creation does not count: a retry by every member uses
		// the same keys (the earlier calls found there are the same).
		pg.nextLocal(key, -1)
		return nil, err
	}
	self := slices.Index(sorted, me)
	return pg.create(ctx, GroupSpec{Name: name, Parent: pg.name, GlobalRanks: sorted, Rank: self, Timeout: o.timeout})
}

// agreeLocal is the members-only agreement of a local-synchronization
// NewGroup, in two steps under prefix: each member writes its call
// ("call/<global rank>": the quoted name and sorted ranks), and once it has
// seen every member's call equal to its own, "ok/<global rank>"; it
// returns when every member has written ok. A member that sees a
// different call writes "fail/<global rank>" with its error and fails; the
// others fail when they see that key, so that no member goes on to connect
// a group its peers have given up on. A timeout writes nothing, so that
// every member may simply call again.
func (pg *ProcessGroup) agreeLocal(ctx context.Context, prefix, name string, sorted []int, timeout time.Duration) error {
	st := pg.store
	me := pg.global[pg.rank]
	mine := fmt.Sprintf("%q %v", name, sorted)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events, err := st.Watch(wctx, prefix, true)
	if err != nil {
		return fmt.Errorf("NewGroup %q on group %q: watching the store: %w", name, pg.name, err)
	}
	if err := st.Set(ctx, prefix+"call/"+strconv.Itoa(me), []byte(mine)); err != nil {
		return fmt.Errorf("NewGroup %q on group %q: recording the call of global rank %d: %w", name, pg.name, me, err)
	}
	calls := map[int]string{me: mine}
	oks := map[int]bool{}
	agreed := false
	fail := func(e error) error {
		fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer fcancel()
		_ = st.Set(fctx, prefix+"fail/"+strconv.Itoa(me), []byte(e.Error()))
		return e
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	start := time.Now()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				if err := ctx.Err(); err != nil {
					return err
				}
				return fmt.Errorf("NewGroup %q on group %q: %w: the store's watch ended", name, pg.name, store.ErrClosed)
			}
			if ev.Type != store.EventPut {
				continue
			}
			kind, who, _ := strings.Cut(strings.TrimPrefix(ev.Key, prefix), "/")
			rank, err := strconv.Atoi(who)
			if err != nil {
				continue
			}
			switch kind {
			case "call":
				calls[rank] = string(ev.Value)
				if string(ev.Value) != mine {
					return fail(pg.localMismatch(calls))
				}
			case "ok":
				oks[rank] = true
			case "fail":
				if rank == me {
					continue
				}
				return fmt.Errorf("%w: NewGroup %q with local synchronization on group %q: global rank %d gave up: %s", ErrMismatch, name, pg.name, rank, ev.Value)
			}
			if !agreed && len(calls) == len(sorted) {
				agreed = true
				if err := st.Set(ctx, prefix+"ok/"+strconv.Itoa(me), []byte("1")); err != nil {
					return fmt.Errorf("NewGroup %q on group %q: recording agreement: %w", name, pg.name, err)
				}
			}
			if len(oks) == len(sorted) {
				return nil
			}
		case <-timer.C:
			e := &NewGroupTimeoutError{Parent: pg.name, Name: name, Rank: me, Timeout: time.Since(start).Round(time.Millisecond)}
			for _, g := range sorted {
				if _, ok := calls[g]; !ok {
					e.Missing = append(e.Missing, g)
				} else if agreed && !oks[g] {
					e.Missing = append(e.Missing, g) // called, but never saw everyone
				}
			}
			pg.log.Error().Err(e).Msg("NewGroup with local synchronization timed out")
			return e
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// localMismatch builds the *NewGroupMismatchError of a local agreement
// from the calls seen so far (keyed by global rank).
func (pg *ProcessGroup) localMismatch(calls map[int]string) error {
	e := &NewGroupMismatchError{Group: pg.name}
	ranks := make([]int, 0, len(calls))
	for g := range calls {
		ranks = append(ranks, g)
	}
	slices.Sort(ranks)
	for _, g := range ranks {
		r := pg.toGroup[g]
		i := slices.IndexFunc(e.Calls, func(c NewGroupCall) bool { return c.Args == calls[g] })
		if i < 0 {
			e.Calls = append(e.Calls, NewGroupCall{Args: calls[g]})
			i = len(e.Calls) - 1
		}
		e.Calls[i].Ranks = append(e.Calls[i].Ranks, r)
	}
	return e
}

// NewSubgroups splits pg into groups of groupSize consecutive ranks (pg's
// group ranks i·groupSize to (i+1)·groupSize-1, as global ranks sorted) and
// returns the caller's subgroup and all of them, in order; the others are
// Rank -1 views (semantics of torch.distributed.new_subgroups, whose
// group_size defaults to the GPUs per node: here it is required). Every
// member of pg must call it, with the same groupSize, in the same order
// relative to its other NewGroup and Split calls; only the caller's own
// subgroup's communicator is created (each subgroup connects among its
// members). Subgroups are named "<parent>.<n>.s<i>", or "<name>.<i>" with
// WithGroupName; WithGroupTimeout sets their timeout.
//
// As NewGroup, the members first exchange their arguments over pg (on a
// host group): different groupSizes fail every member with a
// *NewGroupMismatchError. Then, the same on every member: groupSize <= 0
// or not dividing pg's size is an error wrapping ErrInvalidArgument
// naming both (torch: "The arg 'group_size' must be positive", "The world
// size must be divisible by 'group_size'"); WithLocalSynchronization is
// refused the same way. A non-member of pg gets a Rank -1 view and nil.
func (pg *ProcessGroup) NewSubgroups(ctx context.Context, groupSize int, opts ...GroupOption) (*ProcessGroup, []*ProcessGroup, error) {
	var lists [][]int
	if groupSize > 0 && pg.size > 0 && pg.size%groupSize == 0 {
		for lo := 0; lo < pg.size; lo += groupSize {
			lists = append(lists, pg.global[lo:lo+groupSize])
		}
	}
	check := func() error {
		if groupSize <= 0 {
			return fmt.Errorf("%w: NewSubgroups on group %q: group_size %d must be positive", ErrInvalidArgument, pg.name, groupSize)
		}
		if pg.size%groupSize != 0 {
			return fmt.Errorf("%w: NewSubgroups on group %q: the group size %d is not divisible by group_size %d", ErrInvalidArgument, pg.name, pg.size, groupSize)
		}
		return nil
	}
	return pg.subgroups(ctx, "NewSubgroups", fmt.Sprintf("group_size=%d", groupSize), lists, check, opts)
}

// NewSubgroupsByEnumeration creates one group per list of global ranks in
// ranksPerSubgroup and returns the caller's subgroup and all of them, in
// order; the others are Rank -1 views (semantics of
// torch.distributed.new_subgroups_by_enumeration). Ranks within a list are
// sorted, as NewGroup. As torch, the lists need not cover pg: a caller in
// none gets a Rank -1 view (named "<parent>.<n>.none") as its subgroup.
// Every member of pg must call it with the same lists, in the same order
// relative to its other NewGroup and Split calls; only the caller's own
// subgroup's communicator is created. Names and options as NewSubgroups.
//
// As NewGroup, the members first exchange their arguments over pg (on a
// host group): different lists fail every member with a
// *NewGroupMismatchError. Then, the same on every member, an error
// wrapping ErrInvalidArgument names what is wrong: an empty
// ranksPerSubgroup or an empty list, a rank that is not a member of pg, a
// rank in two lists (torch: "Rank 1 has appeared in both subgroup [0 1]
// and [1 2]") or twice in one; WithLocalSynchronization is refused.
func (pg *ProcessGroup) NewSubgroupsByEnumeration(ctx context.Context, ranksPerSubgroup [][]int, opts ...GroupOption) (*ProcessGroup, []*ProcessGroup, error) {
	lists := make([][]int, len(ranksPerSubgroup))
	for i, l := range ranksPerSubgroup {
		lists[i] = slices.Clone(l)
		slices.Sort(lists[i])
	}
	check := func() error {
		if len(lists) == 0 {
			return fmt.Errorf("%w: NewSubgroupsByEnumeration on group %q: the list of subgroups (ranks_per_subgroup_list) cannot be empty", ErrInvalidArgument, pg.name)
		}
		owner := map[int]int{}
		for i, l := range lists {
			if len(l) == 0 {
				return fmt.Errorf("%w: NewSubgroupsByEnumeration on group %q: subgroup %d is an empty rank list", ErrInvalidArgument, pg.name, i)
			}
			for j, g := range l {
				if _, ok := pg.toGroup[g]; !ok {
					return fmt.Errorf("%w: NewSubgroupsByEnumeration on group %q: subgroup %d %v lists global rank %d, which is not a member (members %v)", ErrInvalidArgument, pg.name, i, ranksPerSubgroup[i], g, pg.global)
				}
				if j > 0 && l[j-1] == g {
					return fmt.Errorf("%w: NewSubgroupsByEnumeration on group %q: rank %d appears twice in subgroup %d %v", ErrInvalidArgument, pg.name, g, i, ranksPerSubgroup[i])
				}
				if o, ok := owner[g]; ok {
					return fmt.Errorf("%w: NewSubgroupsByEnumeration on group %q: Rank %d has appeared in both subgroup %d %v and subgroup %d %v", ErrInvalidArgument, pg.name, g, o, ranksPerSubgroup[o], i, ranksPerSubgroup[i])
				}
				owner[g] = i
			}
		}
		return nil
	}
	return pg.subgroups(ctx, "NewSubgroupsByEnumeration", fmt.Sprint(lists), lists, check, opts)
}

// subgroups is NewSubgroups and NewSubgroupsByEnumeration after their
// arguments: agree on args over pg, check, create the caller's subgroup.
func (pg *ProcessGroup) subgroups(ctx context.Context, call, args string, lists [][]int, check func() error, opts []GroupOption) (*ProcessGroup, []*ProcessGroup, error) {
	if pg.closed.Load() {
		return nil, nil, fmt.Errorf("%w: %s on group %q after Destroy", ErrClosed, call, pg.name)
	}
	o := groupOptions{timeout: pg.Timeout()}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	n := pg.nextChild()
	base := o.name
	if base == "" {
		base = fmt.Sprintf("%s.%d.s", pg.name, n)
	} else {
		base += "."
	}
	if pg.rank < 0 {
		v, err := pg.nonMember(fmt.Sprintf("%s.%d.none", pg.name, n), nil, o.timeout)
		return v, nil, err
	}
	what := fmt.Sprintf("%s(%s", call, args)
	if o.name != "" {
		what += fmt.Sprintf(", name %q", o.name)
	}
	if o.local {
		what += ", local synchronization"
	}
	what += ")"
	if err := pg.agreeArgs(ctx, call, what); err != nil {
		return nil, nil, err
	}
	if err := check(); err != nil {
		return nil, nil, err
	}
	if o.local {
		return nil, nil, fmt.Errorf("%w: %s on group %q: WithLocalSynchronization does not apply (every member of the parent calls %s)", ErrInvalidArgument, call, pg.name, call)
	}
	me := pg.global[pg.rank]
	all := make([]*ProcessGroup, len(lists))
	mine := -1
	for i, l := range lists {
		sorted := slices.Clone(l)
		slices.Sort(sorted)
		name := base + strconv.Itoa(i)
		if self := slices.Index(sorted, me); self >= 0 {
			mine = i
			g, err := pg.create(ctx, GroupSpec{Name: name, Parent: pg.name, GlobalRanks: sorted, Rank: self, Timeout: o.timeout})
			if err != nil {
				return nil, nil, err
			}
			all[i] = g
			continue
		}
		v, err := pg.nonMember(name, sorted, o.timeout)
		if err != nil {
			if mine >= 0 {
				_ = all[mine].Destroy(ctx)
			}
			return nil, nil, err
		}
		all[i] = v
	}
	if mine < 0 {
		v, err := pg.nonMember(fmt.Sprintf("%s.%d.none", pg.name, n), nil, o.timeout)
		return v, all, err
	}
	return all[mine], all, nil
}
