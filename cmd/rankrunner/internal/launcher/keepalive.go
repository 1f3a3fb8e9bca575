package launcher

import (
	"context"
	"strconv"
	"time"
)

// Runner heartbeats (torchrun's rendezvous keep-alive): in a job of several
// runners, each writes its job-level key alive/<id> every RunnerHeartbeat,
// and each attempt watches the others'. A runner whose key has not changed
// for RunnerTimeout, counted on the watcher's own clock from the attempt's
// start or the key's last change, is lost: the watcher aborts the attempt.
// Without it a runner that vanished (its host powered off, or its network
// cut) would be noticed only through the ranks' collective timeouts, and a
// runner whose ranks had all succeeded would wait at the exit barrier for
// ever. Runners that never wrote a key are not watched (a node still
// building its program, or one that never came up: the ranks' init barrier
// times out on that).

// alivePrefix starts every runner's heartbeat key.
const alivePrefix = "alive/"

// aliveKey is runner id's heartbeat key.
func aliveKey(id string) string { return alivePrefix + id }

// heartbeat writes aliveKey(r.id) (an increasing counter) every
// RunnerHeartbeat until ctx ends. A failed write is logged at debug level
// and retried at the next beat: losing the store shows elsewhere.
func (r *runner) heartbeat(ctx context.Context) {
	t := time.NewTicker(r.cfg.RunnerHeartbeat)
	defer t.Stop()
	for n := 1; ; n++ {
		wctx, cancel := context.WithTimeout(ctx, r.cfg.RunnerHeartbeat)
		if err := r.st.Set(wctx, aliveKey(r.id), []byte(strconv.Itoa(n))); err != nil && ctx.Err() == nil {
			r.log.Debug().Err(err).Msg("heartbeat write failed")
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// liveness is one attempt's view of the other runners' heartbeats. The
// attempt loop owns it.
type liveness struct {
	self    string
	timeout time.Duration
	start   time.Time
	seen    map[string]time.Time // last change of each runner's key, on our clock
	lost    map[string]bool      // reported already
}

func newLiveness(self string, timeout time.Duration, start time.Time) *liveness {
	return &liveness{self: self, timeout: timeout, start: start, seen: map[string]time.Time{}, lost: map[string]bool{}}
}

// beat records that runner id's key changed (or was found) at now. A key
// found when the watch starts counts from the attempt's start.
func (l *liveness) beat(id string, now time.Time) {
	if id == l.self {
		return
	}
	l.seen[id] = now
}

// check returns a runner whose key has not changed for the timeout, and for
// how long, skipping runners for which skip is true (those whose ranks
// already succeeded) and runners reported before.
func (l *liveness) check(now time.Time, skip func(id string) bool) (id string, silent time.Duration, ok bool) {
	for r, t := range l.seen {
		if l.lost[r] || skip(r) {
			continue
		}
		if t.Before(l.start) {
			t = l.start
		}
		if d := now.Sub(t); d >= l.timeout {
			l.lost[r] = true
			return r, d, true
		}
	}
	return "", 0, false
}
