package bootstrap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/internal/envcontract"
	"github.com/ranktree/ranktree/store"
)

// This file makes Init fail fast and by name when another rank of the
// attempt dies: the launcher (rankrunner watches its children) records the
// dead rank under the attempt's "dead/" prefix, and Init, which watches
// that prefix while it waits for the other ranks, stops waiting at once.

// DeadRankPrefix is the store prefix, under the attempt's prefix
// "restart/<RANKTREE_RESTART_COUNT>/", where the launcher records ranks
// whose process exited non-zero or was killed: key DeadRankKey(rank),
// value the JSON of a DeadRank. rankrunner writes it; a custom launcher
// may too.
const DeadRankPrefix = "dead/"

// DeadRankKey is the key of rank's DeadRank under the attempt's prefix.
func DeadRankKey(rank int) string { return DeadRankPrefix + strconv.Itoa(rank) }

// DeadRank is the launcher's record of a rank process that ended with a
// failure: its exit code (128+signal for a signal death), its status as
// os/exec words it ("exit code 7", "signal: killed (SIGKILL)") and the
// error it reported, if the launcher knows one.
type DeadRank struct {
	Rank     int    `json:"rank"`
	ExitCode int    `json:"exit_code"`
	Status   string `json:"status"`
	Error    string `json:"error,omitempty"`
}

// String is "rank 1 (signal: killed (SIGKILL))".
func (d DeadRank) String() string {
	if d.Status == "" {
		return fmt.Sprintf("rank %d (exit code %d)", d.Rank, d.ExitCode)
	}
	return fmt.Sprintf("rank %d (%s)", d.Rank, d.Status)
}

// ErrRankDead is returned by Init (as *InitError, with the dead ranks in
// Dead) when the launcher reported that another rank of the attempt died
// before Init finished. It is recoverable by relaunching the job
// (rankrunner --max-restarts does).
var ErrRankDead = errors.New("ranktree: a rank of the job died during Init")

// InitError is Init failing while it waited for the other ranks of the
// attempt (the init barrier, or creating the default process group). It
// names the ranks concerned: Dead, those the launcher reported dead
// (sorted by rank); Missing, those that had not reached the init barrier
// when it timed out (from *store.BarrierError). It unwraps to Err and, when
// Dead is not empty, to ErrRankDead.
type InitError struct {
	Rank    int    // this rank
	Stage   string // "init barrier" or "creating the default process group"
	Dead    []DeadRank
	Missing []int
	Err     error
}

// Error implements error: "ranktree: rank 0: init barrier: rank 1 died
// (signal: killed (SIGKILL)): <cause>".
func (e *InitError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ranktree: rank %d: %s", e.Rank, e.Stage)
	if len(e.Dead) > 0 {
		names := make([]string, len(e.Dead))
		for i, d := range e.Dead {
			names[i] = d.String()
		}
		fmt.Fprintf(&b, ": %s died", strings.Join(names, ", "))
	}
	if len(e.Missing) > 0 {
		fmt.Fprintf(&b, ": ranks %v never arrived", e.Missing)
	}
	switch {
	case e.Err == nil:
	case len(e.Dead) > 0 && errors.Is(e.Err, context.Canceled):
		fmt.Fprintf(&b, "; stopped waiting (%v)", e.Err)
	default:
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

// Unwrap returns Err and, with dead ranks, ErrRankDead.
func (e *InitError) Unwrap() []error {
	if len(e.Dead) > 0 {
		return []error{e.Err, ErrRankDead}
	}
	return []error{e.Err}
}

// deadWatch follows the attempt's dead-rank records while Init waits for
// the other ranks; its goroutine owns the list.
type deadWatch struct {
	mu   sync.Mutex
	dead []DeadRank
	wg   sync.WaitGroup
}

// watchDeadRanks watches st's DeadRankPrefix (replaying records already
// there) and calls cancel as soon as a rank other than self is reported
// dead. Without a watch (the store refused it) Init falls back to its
// timeouts. Stop it by ending ctx, then call wait.
func watchDeadRanks(ctx context.Context, st store.Store, self int, cancel context.CancelCauseFunc, log zerolog.Logger) *deadWatch {
	w := &deadWatch{}
	ch, err := st.Watch(ctx, DeadRankPrefix, true)
	if err != nil {
		log.Debug().Err(err).Msg("cannot watch dead-rank records; Init relies on its timeout")
		return w
	}
	w.wg.Go(func() {
		for ev := range ch {
			if ev.Type != store.EventPut {
				continue
			}
			var d DeadRank
			if err := json.Unmarshal(ev.Value, &d); err != nil {
				n, aerr := strconv.Atoi(strings.TrimPrefix(ev.Key, DeadRankPrefix))
				if aerr != nil {
					continue
				}
				d = DeadRank{Rank: n, Status: string(ev.Value)}
			}
			if d.Rank == self {
				continue
			}
			log.Error().Int("dead_rank", d.Rank).Int("exit_code", d.ExitCode).Str("status", d.Status).Msg("a rank died while this rank was in Init")
			w.mu.Lock()
			w.dead = append(w.dead, d)
			w.mu.Unlock()
			cancel(ErrRankDead)
		}
	})
	return w
}

// wait waits for the watch goroutine (after ctx ended).
func (w *deadWatch) wait() { w.wg.Wait() }

// snapshot returns the dead ranks seen so far, sorted by rank, one each.
func (w *deadWatch) snapshot() []DeadRank {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := slices.Clone(w.dead)
	slices.SortStableFunc(out, func(a, b DeadRank) int { return a.Rank - b.Rank })
	return slices.CompactFunc(out, func(a, b DeadRank) bool { return a.Rank == b.Rank })
}

// initError wraps an error of Init's waiting stages as an *InitError
// naming the ranks concerned.
func initError(rank int, stage string, dead []DeadRank, err error) error {
	e := &InitError{Rank: rank, Stage: stage, Dead: dead, Err: err}
	var be *store.BarrierError
	if errors.As(err, &be) {
		e.Missing = be.Missing
	}
	return e
}

// recordError writes err to $RANKTREE_ERROR_FILE unless the file already
// holds an earlier error. Best effort: the error is returned to the
// caller anyway.
func recordError(err error) {
	path := os.Getenv(envcontract.ErrorFile)
	if path == "" || err == nil {
		return
	}
	f, oerr := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if oerr != nil {
		return
	}
	_, _ = f.WriteString(strings.ReplaceAll(err.Error(), "\n", " ") + "\n")
	_ = f.Close()
}
