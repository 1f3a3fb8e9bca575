package comm

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ranktree/ranktree/store"
)

// MonitoredBarrierGrace is how long past rank 0's deadline another member
// waits for rank 0's verdict before it decides for itself that rank 0
// failed (rank 0 arrived, then died or stalled before reporting).
const MonitoredBarrierGrace = 2 * time.Second

// MonitoredBarrier blocks until every member of the group has entered it,
// like Barrier, but with a report of who did not come (semantics of
// torch.distributed.monitored_barrier). Rank 0 collects the other members'
// arrivals for up to timeout (the group's timeout if timeout <= 0). If
// some have not arrived by then, every member fails with the same
// *MonitoredBarrierError (errors.Is ErrTimeout) naming the group ranks that
// did not arrive: all of them with waitAllRanks, else the lowest one, as
// torch's wait_all_ranks. A member that arrives after the verdict fails
// with it too (it is named in it); none returns nil while another fails.
//
// The arrivals and the verdict travel through the job's store, not the
// group's engine: each call uses the keys
// "mbarrier/<group>/<epoch>/<n>/{arrive/<rank>,result}" (n counts this
// group's MonitoredBarrier calls, so members must call it in the same order
// relative to each other, as any collective), leaves them in the store,
// and does not touch the communicator, which stays usable after a failure.
// It therefore works on every engine: on a device (NCCL) group it runs as
// on a host group (torch runs it over a Gloo group).
//
// If rank 0 itself has not arrived when another member's own timeout ends,
// that member decides: the verdict names rank 0 (and, with waitAllRanks,
// the others missing then). If rank 0 arrived but gives no verdict within
// MonitoredBarrierGrace past its deadline, the verdict names rank 0. The
// first verdict written wins (a store compare-and-set), so every member
// reports the same one.
//
// Errors: *MonitoredBarrierError; ErrClosed after Destroy; ErrUnsupported
// if the group has no store (GroupConfig.Store); ctx's error if ctx ends
// first; a store error. A non-member returns nil at once; a group of one
// returns nil.
func (pg *ProcessGroup) MonitoredBarrier(ctx context.Context, timeout time.Duration, waitAllRanks bool) error {
	if pg.closed.Load() {
		return fmt.Errorf("%w: MonitoredBarrier on group %q after Destroy", ErrClosed, pg.name)
	}
	if pg.rank < 0 {
		pg.log.Warn().Str("op", "MonitoredBarrier").Msg("op called on a process group this rank is not a member of; doing nothing")
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if pg.store == nil {
		return fmt.Errorf("%w: MonitoredBarrier on group %q: the group has no store (GroupConfig.Store)", ErrUnsupported, pg.name)
	}
	if timeout <= 0 {
		timeout = pg.Timeout()
	}
	n := pg.mbarriers.Add(1)
	if pg.size == 1 {
		return nil
	}
	mb := &monitoredBarrier{
		pg: pg, prefix: fmt.Sprintf("mbarrier/%s/%d/%d/", pg.name, pg.epoch, n),
		timeout: timeout, waitAll: waitAllRanks, arrived: make(map[int]time.Time, pg.size),
	}
	return mb.run(ctx)
}

// monitoredBarrier is one MonitoredBarrier call on one member.
type monitoredBarrier struct {
	pg      *ProcessGroup
	prefix  string
	timeout time.Duration
	waitAll bool
	arrived map[int]time.Time // group rank → its deadline, as it wrote it
}

func (mb *monitoredBarrier) run(ctx context.Context) error {
	pg := mb.pg
	st := pg.store
	deadline := time.Now().Add(mb.timeout)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events, err := st.Watch(wctx, mb.prefix, true)
	if err != nil {
		return fmt.Errorf("MonitoredBarrier on group %q: watching the store: %w", pg.name, err)
	}
	if err := st.Set(ctx, mb.prefix+"arrive/"+strconv.Itoa(pg.rank), []byte(strconv.FormatInt(deadline.UnixNano(), 10))); err != nil {
		return fmt.Errorf("MonitoredBarrier on group %q: recording the arrival of rank %d: %w", pg.name, pg.rank, err)
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				if err := ctx.Err(); err != nil {
					return err
				}
				return fmt.Errorf("MonitoredBarrier on group %q: %w: the store's watch ended", pg.name, store.ErrClosed)
			}
			if ev.Type != store.EventPut {
				continue
			}
			key := strings.TrimPrefix(ev.Key, mb.prefix)
			if key == "result" {
				return mb.verdict(ev.Value)
			}
			if r, ok := strings.CutPrefix(key, "arrive/"); ok {
				rank, err1 := strconv.Atoi(r)
				dl, err2 := strconv.ParseInt(string(ev.Value), 10, 64)
				if err1 == nil && err2 == nil && rank >= 0 && rank < pg.size {
					mb.arrived[rank] = time.Unix(0, dl)
				}
			}
			if pg.rank == 0 && len(mb.arrived) == pg.size {
				return mb.decide(ctx, nil)
			}
		case <-timer.C:
			if pg.rank != 0 {
				// Rank 0 decides while it is there: wait for its verdict
				// until its own deadline, and a grace, have passed.
				if d0, ok := mb.arrived[0]; ok {
					if left := time.Until(d0.Add(MonitoredBarrierGrace)); left > 0 {
						timer.Reset(left)
						continue
					}
					return mb.decide(ctx, []int{0})
				}
			}
			var missing []int
			for r := range pg.size {
				if _, ok := mb.arrived[r]; !ok {
					missing = append(missing, r)
				}
			}
			return mb.decide(ctx, missing)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// decide writes this member's verdict (missing == nil: every member
// arrived) unless one was written first, and returns the verdict that won.
func (mb *monitoredBarrier) decide(ctx context.Context, missing []int) error {
	v := "ok"
	if len(missing) > 0 {
		if !mb.waitAll {
			missing = missing[:1]
		}
		parts := make([]string, len(missing))
		for i, r := range missing {
			parts[i] = strconv.Itoa(r)
		}
		v = fmt.Sprintf("fail %d %d %s", mb.pg.rank, mb.timeout.Nanoseconds(), strings.Join(parts, ","))
	}
	// The verdict must be written even if ctx ended meanwhile: the other
	// members wait for it.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	got, err := mb.pg.store.CompareAndSet(wctx, mb.prefix+"result", nil, []byte(v))
	if err != nil {
		return fmt.Errorf("MonitoredBarrier on group %q: writing the verdict: %w", mb.pg.name, err)
	}
	return mb.verdict(got)
}

// verdict turns the stored verdict into MonitoredBarrier's result.
func (mb *monitoredBarrier) verdict(v []byte) error {
	s := string(v)
	if s == "ok" {
		return nil
	}
	e := &MonitoredBarrierError{Group: mb.pg.name, Rank: mb.pg.rank, Members: mb.pg.Ranks(), DecidedBy: -1}
	f := strings.Fields(s)
	if len(f) == 4 && f[0] == "fail" {
		e.DecidedBy, _ = strconv.Atoi(f[1])
		ns, _ := strconv.ParseInt(f[2], 10, 64)
		e.Timeout = time.Duration(ns)
		for _, p := range strings.Split(f[3], ",") {
			if r, err := strconv.Atoi(p); err == nil {
				e.Missing = append(e.Missing, r)
			}
		}
		mb.pg.log.Error().Ints("missing", e.Missing).Int("decided_by", e.DecidedBy).Dur("timeout", e.Timeout).
			Str("keys", mb.prefix).Msg("monitored barrier failed")
		return e
	}
	return fmt.Errorf("MonitoredBarrier on group %q: %w: unreadable verdict %q in the store", mb.pg.name, ErrMismatch, s)
}

// MonitoredBarrierError is MonitoredBarrier's failure: the same verdict on
// every member (and on a member that arrives late). It unwraps to
// ErrTimeout. Recoverable: the communicator is untouched; find out why the
// named ranks are late (stuck, dead, or desynchronized), e.g. from their
// flight recorders.
type MonitoredBarrierError struct {
	Group string
	Rank  int // the reporting member's group rank
	// Missing are the group ranks that did not arrive in time: every one
	// with waitAllRanks, else the lowest.
	Missing []int
	// Members maps group ranks to global ranks.
	Members []int
	// DecidedBy is the group rank that wrote the verdict: 0 unless rank 0
	// itself was late (or arrived and never reported).
	DecidedBy int
	Timeout   time.Duration // the decider's timeout
}

// Error implements error, in torch's words, e.g. `comm: monitored barrier
// on group "default_pg" failed (decided by rank 0, reported on rank 2):
// Ranks 1, 3 failed to pass monitoredBarrier in 500ms`.
func (e *MonitoredBarrierError) Error() string {
	parts := make([]string, len(e.Missing))
	for i, r := range e.Missing {
		parts[i] = strconv.Itoa(r)
		if r < len(e.Members) && e.Members[r] != r {
			parts[i] += fmt.Sprintf(" (global rank %d)", e.Members[r])
		}
	}
	who := "Rank "
	if len(parts) > 1 {
		who = "Ranks "
	}
	return fmt.Sprintf("comm: monitored barrier on group %q failed (decided by rank %d, reported on rank %d): %s%s failed to pass monitoredBarrier in %v",
		e.Group, e.DecidedBy, e.Rank, who, strings.Join(parts, ", "), e.Timeout)
}

// Unwrap returns ErrTimeout.
func (e *MonitoredBarrierError) Unwrap() error { return ErrTimeout }
