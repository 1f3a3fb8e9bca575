package store

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MemStore is an in-process Store for single-process jobs and tests: the
// counterpart of c10d's HashStore (Gloo's rendezvous/hash_store). All
// methods are safe for concurrent use; values are copied in and out.
type MemStore struct {
	timeout time.Duration

	mu       sync.Mutex
	data     map[string][]byte
	changed  chan struct{} // closed and replaced on every change (wakes waiters)
	watchers map[*memWatcher]struct{}
	closed   bool
	closeCh  chan struct{}
}

var _ Store = (*MemStore)(nil)

// MemOption configures NewMemStore.
type MemOption func(*MemStore)

// WithMemTimeout sets the MemStore's default timeout for Get and Wait. A
// non-positive d keeps DefaultTimeout (5 min, c10d's default).
func WithMemTimeout(d time.Duration) MemOption {
	return func(s *MemStore) {
		if d > 0 {
			s.timeout = d
		}
	}
}

// NewMemStore returns an empty in-memory store.
func NewMemStore(opts ...MemOption) *MemStore {
	s := &MemStore{
		timeout:  DefaultTimeout,
		data:     make(map[string][]byte),
		changed:  make(chan struct{}),
		watchers: make(map[*memWatcher]struct{}),
		closeCh:  make(chan struct{}),
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Timeout returns the store's default timeout for Get and Wait.
func (s *MemStore) Timeout() time.Duration { return s.timeout }

// notifyLocked wakes waiters and queues ev for matching watchers. s.mu held.
func (s *MemStore) notifyLocked(ev Event) {
	close(s.changed)
	s.changed = make(chan struct{})
	for w := range s.watchers {
		if strings.HasPrefix(ev.Key, w.prefix) {
			w.push(ev)
		}
	}
}

func (s *MemStore) setLocked(key string, value []byte) {
	v := bytes.Clone(value)
	if v == nil {
		v = []byte{}
	}
	s.data[key] = v
	s.notifyLocked(Event{Type: EventPut, Key: key, Value: bytes.Clone(v)})
}

// Set stores a copy of value under key.
func (s *MemStore) Set(ctx context.Context, key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.setLocked(key, value)
	return nil
}

// Get returns a copy of key's value, waiting up to the store timeout (or
// ctx) for it to be set. A timeout returns a *TimeoutError (ErrTimeout).
func (s *MemStore) Get(ctx context.Context, key string) ([]byte, error) {
	return s.wait(ctx, "get", []string{key}, s.timeout)
}

// Add adds delta to the decimal int64 counter at key (absent: 0) and
// returns the new value. A non-integer value gives a *CounterError.
func (s *MemStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	var cur int64
	if v, ok := s.data[key]; ok {
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return 0, &CounterError{Key: key, Value: bytes.Clone(v)}
		}
		cur = n
	}
	cur += delta
	s.setLocked(key, []byte(strconv.FormatInt(cur, 10)))
	return cur, nil
}

// CompareAndSet implements c10d compare_set; see Store. For an absent key
// and a non-empty expected it stores nothing and returns nil.
func (s *MemStore) CompareAndSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	cur, ok := s.data[key]
	switch {
	case !ok && len(expected) == 0:
		s.setLocked(key, desired)
		return bytes.Clone(s.data[key]), nil
	case !ok:
		return nil, nil
	case len(expected) > 0 && bytes.Equal(cur, expected):
		s.setLocked(key, desired)
		return bytes.Clone(s.data[key]), nil
	default:
		return bytes.Clone(cur), nil
	}
}

// Delete removes key and reports whether it existed.
func (s *MemStore) Delete(ctx context.Context, key string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false, ErrClosed
	}
	if _, ok := s.data[key]; !ok {
		return false, nil
	}
	delete(s.data, key)
	s.notifyLocked(Event{Type: EventDelete, Key: key})
	return true, nil
}

// Check reports whether every key exists.
func (s *MemStore) Check(ctx context.Context, keys []string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false, ErrClosed
	}
	for _, k := range keys {
		if _, ok := s.data[k]; !ok {
			return false, nil
		}
	}
	return true, nil
}

// Wait blocks until every key exists; timeout 0 means the store timeout.
func (s *MemStore) Wait(ctx context.Context, keys []string, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = s.timeout
	}
	_, err := s.wait(ctx, "wait", keys, timeout)
	return err
}

// wait blocks until all keys exist and returns a copy of the first key's
// value, read under the same lock that saw them all present.
func (s *MemStore) wait(ctx context.Context, op string, keys []string, timeout time.Duration) ([]byte, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, ErrClosed
		}
		var missing []string
		for _, k := range keys {
			if _, ok := s.data[k]; !ok {
				missing = append(missing, k)
			}
		}
		if len(missing) == 0 {
			var v []byte
			if len(keys) > 0 {
				v = bytes.Clone(s.data[keys[0]])
			}
			s.mu.Unlock()
			return v, nil
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			return nil, &TimeoutError{Op: op, Keys: missing, Timeout: timeout}
		case <-ctx.Done():
			return nil, ctxError(ctx, op, missing, timeout)
		case <-s.closeCh:
			return nil, ErrClosed
		}
	}
}

// ctxError turns a finished ctx into the store's error: a deadline is a
// *TimeoutError, a cancellation wraps ctx.Err().
func ctxError(ctx context.Context, op string, keys []string, timeout time.Duration) error {
	if ctx.Err() == context.DeadlineExceeded {
		if dl, ok := ctx.Deadline(); ok && timeout <= 0 {
			timeout = time.Until(dl)
		}
		return &TimeoutError{Op: op, Keys: keys, Timeout: timeout}
	}
	return fmt.Errorf("store: %s of keys %q: %w", op, keys, ctx.Err())
}

// NumKeys returns the number of keys stored.
func (s *MemStore) NumKeys(ctx context.Context) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	return int64(len(s.data)), nil
}

// Watch pushes changes of keys starting with prefix; see Store.Watch. Each
// watcher has its own unbounded queue, so a slow reader never blocks writers.
func (s *MemStore) Watch(ctx context.Context, prefix string, replay bool) (<-chan Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	w := &memWatcher{prefix: prefix, signal: make(chan struct{}, 1), out: make(chan Event)}
	if replay { // in key order, so replays are deterministic
		keys := make([]string, 0, len(s.data))
		for k := range s.data {
			if strings.HasPrefix(k, prefix) {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			w.push(Event{Type: EventPut, Key: k, Value: bytes.Clone(s.data[k])})
		}
	}
	s.watchers[w] = struct{}{}
	go w.run(ctx, s.closeCh, func() {
		s.mu.Lock()
		delete(s.watchers, w)
		s.mu.Unlock()
	})
	return w.out, nil
}

// Close releases waiters and watchers; later calls return ErrClosed.
func (s *MemStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.closeCh)
	}
	return nil
}

// memWatcher is one Watch subscription: an unbounded queue drained by its
// own goroutine into out.
type memWatcher struct {
	prefix string
	signal chan struct{}
	out    chan Event

	mu    sync.Mutex
	queue []Event
}

func (w *memWatcher) push(ev Event) {
	w.mu.Lock()
	w.queue = append(w.queue, ev)
	w.mu.Unlock()
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

func (w *memWatcher) run(ctx context.Context, closed <-chan struct{}, remove func()) {
	defer close(w.out)
	defer remove()
	for {
		w.mu.Lock()
		q := w.queue
		w.queue = nil
		w.mu.Unlock()
		for _, ev := range q {
			select {
			case w.out <- ev:
			case <-ctx.Done():
				return
			case <-closed:
				return
			}
		}
		select {
		case <-w.signal:
		case <-ctx.Done():
			return
		case <-closed:
			return
		}
	}
}
