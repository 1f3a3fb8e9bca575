package natsstore

import (
	"context"
	"errors"
	"strconv"

	"github.com/ranktree/ranktree/store"
)

// Add combining. Concurrent Adds to one key through one Store are combined:
// a runner goroutine (one per busy key) takes every queued delta, applies
// their sum with one revision-checked write, and hands each caller the
// running total in queue order. That is a valid serialization of the
// callers' Adds, and it turns N contending writers on one connection into
// one. Writers on different connections still race through the CAS retry.

type addWaiter struct {
	delta int64
	res   chan addResult // buffered 1
}

type addResult struct {
	n   int64
	err error
}

type addQueue struct {
	waiting []*addWaiter
}

// Add atomically adds delta to the decimal int64 counter at key (absent:
// 0) and returns the new value. Concurrent callers on this Store are
// combined; each batch is applied by the add service (service.go) when one
// runs, otherwise by a revision-based compare-and-swap with jittered retry.
// A non-integer value gives a *store.CounterError. If ctx ends after the
// caller's delta was sent, the outcome is unknown and the error wraps
// store.ErrUnavailable.
func (s *Store) Add(ctx context.Context, key string, delta int64) (int64, error) {
	if s.isClosed() {
		return 0, store.ErrClosed
	}
	w := &addWaiter{delta: delta, res: make(chan addResult, 1)}
	s.addMu.Lock()
	q := s.adds[key]
	if q == nil {
		q = &addQueue{}
		s.adds[key] = q
		go s.runAdds(key, q)
	}
	q.waiting = append(q.waiting, w)
	s.addMu.Unlock()

	select {
	case r := <-w.res:
		return r.n, r.err
	case <-ctx.Done():
	}
	s.addMu.Lock()
	for i, x := range q.waiting {
		if x == w { // not taken yet: withdraw, nothing was applied
			q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
			s.addMu.Unlock()
			return 0, &store.UnavailableError{Op: "add", Key: key, Err: ctx.Err()}
		}
	}
	s.addMu.Unlock()
	select {
	case r := <-w.res: // already done
		return r.n, r.err
	default:
	}
	return 0, &store.UnavailableError{Op: "add", Key: key, Err: errors.Join(ctx.Err(), errors.New("outcome unknown: the add was in flight"))}
}

// runAdds applies queued deltas of key in batches until the queue is empty.
func (s *Store) runAdds(key string, q *addQueue) {
	for {
		s.addMu.Lock()
		batch := q.waiting
		q.waiting = nil
		if len(batch) == 0 {
			delete(s.adds, key)
			s.addMu.Unlock()
			return
		}
		s.addMu.Unlock()

		var sum int64
		for _, w := range batch {
			sum += w.delta
		}
		cur, err := s.applyAdd(key, sum)
		if err != nil && s.isClosed() {
			err = store.ErrClosed
		}
		cur -= sum // the value before this batch
		for _, w := range batch {
			cur += w.delta
			if err != nil {
				w.res <- addResult{err: err}
			} else {
				w.res <- addResult{n: cur}
			}
		}
	}
}

// applyAdd adds sum to key once, through the add service when one answers,
// else by compare-and-swap, and returns the new value.
func (s *Store) applyAdd(key string, sum int64) (int64, error) {
	if !s.directAdd {
		if n, handled, err := s.remoteAdd(s.base, key, sum); handled {
			return n, err
		}
	}
	var cur int64
	_, err := s.cas(s.base, "add", key, func(e entry) ([]byte, bool, bool, error) {
		cur = 0
		if e.exists {
			v, err := strconv.ParseInt(string(e.value), 10, 64)
			if err != nil {
				return nil, false, false, &store.CounterError{Key: key, Value: e.value}
			}
			cur = v
		}
		return []byte(strconv.FormatInt(cur+sum, 10)), false, true, nil
	})
	if err != nil {
		return 0, err
	}
	return cur + sum, nil
}
