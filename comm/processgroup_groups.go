package comm

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// GroupOption sets an option of NewGroup.
type GroupOption func(*groupOptions)

type groupOptions struct {
	name    string
	timeout time.Duration
	local   bool // WithLocalSynchronization
}

// WithGroupName names the new group (torch new_group's group_desc); it must
// be the same on every member and unique in the job. Without it the name is
// "<parent>.<n>", n counting the groups created from the parent.
func WithGroupName(name string) GroupOption { return func(o *groupOptions) { o.name = name } }

// WithGroupTimeout sets the new group's op timeout (torch new_group's
// timeout); without it the new group inherits the parent's.
func WithGroupTimeout(d time.Duration) GroupOption { return func(o *groupOptions) { o.timeout = d } }

// nextChild returns the next subgroup index (1, 2, ...). Every member
// creates subgroups in the same order, so indexes agree across ranks.
func (pg *ProcessGroup) nextChild() int {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	pg.children++
	return pg.children
}

// nonMember builds the Rank -1 view of a group this process is not in.
func (pg *ProcessGroup) nonMember(name string, global []int, timeout time.Duration) (*ProcessGroup, error) {
	return NewProcessGroup(GroupConfig{
		Name: name, Epoch: pg.epoch, Rank: -1, Size: -1, GlobalRanks: global,
		Timeout: timeout, Log: pg.log,
	})
}

// NewGroup creates a process group of the given global ranks, which must
// all be members of pg; group ranks follow the sorted global ranks (torch
// new_group). Every member of pg must call NewGroup, with the same ranks,
// in the same order relative to its other NewGroup and Split calls. A
// caller not in ranks gets a group with Rank -1 and Size -1 whose ops do
// nothing. The communicator is created by the GroupFactory; this blocks
// until every new member has connected.
//
// Before anything else the members of pg exchange their (name, ranks)
// over pg (two small all-gathers; torch new_group's store barrier plays
// that part): if any two differ, every member fails with a
// *NewGroupMismatchError (errors.Is ErrMismatch) naming the lists and who
// passed them; if they agree, bad ranks give every member the same error
// wrapping ErrInvalidArgument. A member that never calls NewGroup makes
// the others fail at the timeout (a *TimeoutError naming it). On a device
// (NCCL) parent the exchange is not built yet and is skipped.
//
// With WithLocalSynchronization only the new group's members call it and
// agree among themselves through the store (see that option).
func (pg *ProcessGroup) NewGroup(ctx context.Context, ranks []int, opts ...GroupOption) (*ProcessGroup, error) {
	if pg.closed.Load() {
		return nil, fmt.Errorf("%w: NewGroup on group %q after Destroy", ErrClosed, pg.name)
	}
	o := groupOptions{timeout: pg.Timeout()}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.local {
		return pg.newGroupLocal(ctx, ranks, o)
	}
	n := pg.nextChild()
	sorted := slices.Clone(ranks)
	slices.Sort(sorted)
	name := o.name
	if name == "" {
		name = fmt.Sprintf("%s.%d", pg.name, n)
	}
	if pg.rank >= 0 {
		// Every member checks every other's call before anything is
		// validated or connected, so that differing lists (or one bad
		// list) fail every member alike instead of handing some of them
		// a group whose peers never come.
		if err := pg.agreeNewGroup(ctx, name, sorted); err != nil {
			return nil, err
		}
	}
	if len(ranks) == 0 {
		return nil, fmt.Errorf("%w: NewGroup on group %q: empty rank list", ErrInvalidArgument, pg.name)
	}
	for i, g := range sorted {
		if i > 0 && sorted[i-1] == g {
			return nil, fmt.Errorf("%w: NewGroup on group %q: rank %d appears twice in %v", ErrInvalidArgument, pg.name, g, ranks)
		}
		if _, ok := pg.toGroup[g]; !ok {
			return nil, fmt.Errorf("%w: NewGroup on group %q: global rank %d is not a member (members %v)", ErrInvalidArgument, pg.name, g, pg.global)
		}
	}
	if pg.rank < 0 {
		return pg.nonMember(name, sorted, o.timeout)
	}
	self := slices.Index(sorted, pg.global[pg.rank])
	if self < 0 {
		pg.log.Debug().Str("new_group", name).Ints("ranks", sorted).Msg("not a member of the new group")
		return pg.nonMember(name, sorted, o.timeout)
	}
	return pg.create(ctx, GroupSpec{Name: name, Parent: pg.name, GlobalRanks: sorted, Rank: self, Timeout: o.timeout})
}

func (pg *ProcessGroup) create(ctx context.Context, spec GroupSpec) (*ProcessGroup, error) {
	if pg.factory == nil {
		return nil, fmt.Errorf("%w: group %q has no GroupFactory; cannot create group %q", ErrUnsupported, pg.name, spec.Name)
	}
	child, err := pg.factory.CreateGroup(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("creating group %q (global ranks %v) from %q: %w", spec.Name, spec.GlobalRanks, pg.name, err)
	}
	return child, nil
}

// Split partitions pg by color (ncclCommSplit, torch split_group): the
// members that pass the same color >= 0 form a new group, ordered by key
// and then by their rank in pg. A member passing a negative color joins no
// group and gets a group with Rank -1 and Size -1. Every member of pg must
// call Split (it all-gathers the colors and keys over pg, using one
// collective sequence number). Groups are named "<parent>.<n>.c<color>".
func (pg *ProcessGroup) Split(ctx context.Context, color, key int) (*ProcessGroup, error) {
	if pg.closed.Load() {
		return nil, fmt.Errorf("%w: Split on group %q after Destroy", ErrClosed, pg.name)
	}
	n := pg.nextChild()
	if pg.rank < 0 {
		return pg.nonMember(fmt.Sprintf("%s.%d.none", pg.name, n), nil, pg.Timeout())
	}
	all := make([]int64, 2*pg.size)
	mine := []int64{int64(color), int64(key)}
	if err := pg.AllGatherInto(ctx, HostBuffer(all), HostBuffer(mine)).Wait(ctx); err != nil {
		return nil, fmt.Errorf("split of group %q: exchanging colors: %w", pg.name, err)
	}
	if color < 0 {
		return pg.nonMember(fmt.Sprintf("%s.%d.none", pg.name, n), nil, pg.Timeout())
	}
	type member struct{ key, rank int }
	var members []member
	for r := 0; r < pg.size; r++ {
		if int(all[2*r]) == color {
			members = append(members, member{int(all[2*r+1]), r})
		}
	}
	slices.SortFunc(members, func(a, b member) int {
		if a.key != b.key {
			return a.key - b.key
		}
		return a.rank - b.rank
	})
	global := make([]int, len(members))
	self := -1
	for i, m := range members {
		global[i] = pg.global[m.rank]
		if m.rank == pg.rank {
			self = i
		}
	}
	spec := GroupSpec{Name: fmt.Sprintf("%s.%d.c%d", pg.name, n, color), Parent: pg.name, GlobalRanks: global, Rank: self, Timeout: pg.Timeout()}
	return pg.create(ctx, spec)
}

// agreeNewGroup exchanges this member's (name, sorted ranks) for NewGroup
// with every member of pg and fails, identically on every member, if they
// differ. Device (NCCL) parents have no host collectives; there it checks
// nothing.
func (pg *ProcessGroup) agreeNewGroup(ctx context.Context, name string, sorted []int) error {
	return pg.agreeArgs(ctx, fmt.Sprintf("NewGroup %q", name), fmt.Sprintf("%q %v", name, sorted))
}

// agreeArgs exchanges mine, the arguments of a group-creating call, with
// every member of pg and fails, identically on every member, with a
// *NewGroupMismatchError if they differ. On a device parent it checks
// nothing.
func (pg *ProcessGroup) agreeArgs(ctx context.Context, call, mine string) error {
	if pg.device {
		return nil
	}
	all, err := pg.AllGatherBytes(ctx, []byte(mine))
	if err != nil {
		return fmt.Errorf("%s on group %q: exchanging arguments: %w", call, pg.name, err)
	}
	same := true
	for _, b := range all {
		same = same && string(b) == mine
	}
	if same {
		return nil
	}
	e := &NewGroupMismatchError{Group: pg.name}
	for r, b := range all {
		i := slices.IndexFunc(e.Calls, func(c NewGroupCall) bool { return c.Args == string(b) })
		if i < 0 {
			e.Calls = append(e.Calls, NewGroupCall{Args: string(b)})
			i = len(e.Calls) - 1
		}
		e.Calls[i].Ranks = append(e.Calls[i].Ranks, r)
	}
	return e
}

// NewGroupMismatchError is returned by NewGroup, on every member of the
// parent group, when the members passed different rank lists or group
// names. It unwraps to ErrMismatch. Recoverable: call NewGroup again with
// one list everywhere.
type NewGroupMismatchError struct {
	Group string         // the parent group
	Calls []NewGroupCall // the distinct calls, in order of the lowest rank that made each
}

// NewGroupCall is one distinct NewGroup call seen by NewGroupMismatchError.
type NewGroupCall struct {
	Ranks []int  // the parent group ranks that made this call
	Args  string // the group name (quoted) and the sorted rank list passed
}

// Error implements error, naming every list and who passed it, e.g.
// `comm: NewGroup mismatch on group "default_pg": ranks [0] passed "x" [0 1]; ranks [1 2] passed "x" [0 1 2]`.
func (e *NewGroupMismatchError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "comm: NewGroup mismatch on group %q: ", e.Group)
	for i, c := range e.Calls {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "ranks %v passed %s", c.Ranks, c.Args)
	}
	return b.String()
}

// Unwrap returns ErrMismatch.
func (e *NewGroupMismatchError) Unwrap() error { return ErrMismatch }
