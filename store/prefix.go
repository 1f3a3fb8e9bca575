package store

import (
	"context"
	"strings"
	"sync"
	"time"
)

// PrefixStore is a view of another Store in which every key is prefixed
// (c10d PrefixStore, Gloo rendezvous/prefix_store). Watch events come back
// with the prefix stripped, so callers only ever see their own spelling.
type PrefixStore struct {
	inner  Store
	prefix string

	mu      sync.Mutex
	closed  bool
	closeCh chan struct{}
}

var _ Store = (*PrefixStore)(nil)

// WithPrefix returns a view of s whose keys are prefix+key. Prefixes nest:
// WithPrefix(WithPrefix(s, "a/"), "b/") uses "a/b/". Closing the view does
// not close s (the owner of s closes it).
func WithPrefix(s Store, prefix string) *PrefixStore {
	return &PrefixStore{inner: s, prefix: prefix, closeCh: make(chan struct{})}
}

// Prefix returns the view's key prefix.
func (p *PrefixStore) Prefix() string { return p.prefix }

// Inner returns the wrapped store.
func (p *PrefixStore) Inner() Store { return p.inner }

func (p *PrefixStore) k(key string) string { return p.prefix + key }

func (p *PrefixStore) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Set stores value under prefix+key.
func (p *PrefixStore) Set(ctx context.Context, key string, value []byte) error {
	if p.isClosed() {
		return ErrClosed
	}
	return p.inner.Set(ctx, p.k(key), value)
}

// Get waits for and returns prefix+key's value.
func (p *PrefixStore) Get(ctx context.Context, key string) ([]byte, error) {
	if p.isClosed() {
		return nil, ErrClosed
	}
	return p.inner.Get(ctx, p.k(key))
}

// Add adds delta to the counter at prefix+key.
func (p *PrefixStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	if p.isClosed() {
		return 0, ErrClosed
	}
	return p.inner.Add(ctx, p.k(key), delta)
}

// CompareAndSet is c10d compare_set on prefix+key.
func (p *PrefixStore) CompareAndSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	if p.isClosed() {
		return nil, ErrClosed
	}
	return p.inner.CompareAndSet(ctx, p.k(key), expected, desired)
}

// Delete removes prefix+key.
func (p *PrefixStore) Delete(ctx context.Context, key string) (bool, error) {
	if p.isClosed() {
		return false, ErrClosed
	}
	return p.inner.Delete(ctx, p.k(key))
}

// Check reports whether every prefixed key exists.
func (p *PrefixStore) Check(ctx context.Context, keys []string) (bool, error) {
	if p.isClosed() {
		return false, ErrClosed
	}
	return p.inner.Check(ctx, p.all(keys))
}

// Wait waits for every prefixed key.
func (p *PrefixStore) Wait(ctx context.Context, keys []string, timeout time.Duration) error {
	if p.isClosed() {
		return ErrClosed
	}
	return p.inner.Wait(ctx, p.all(keys), timeout)
}

func (p *PrefixStore) all(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = p.k(k)
	}
	return out
}

// Watch watches prefix+watchPrefix on the inner store and delivers events
// with the view's prefix stripped. The channel closes when ctx ends, the
// inner store closes or this view is closed.
func (p *PrefixStore) Watch(ctx context.Context, prefix string, replay bool) (<-chan Event, error) {
	if p.isClosed() {
		return nil, ErrClosed
	}
	ctx, cancel := context.WithCancel(ctx)
	in, err := p.inner.Watch(ctx, p.k(prefix), replay)
	if err != nil {
		cancel()
		return nil, err
	}
	out := make(chan Event)
	go func() {
		defer close(out)
		defer cancel()
		for {
			select {
			case ev, ok := <-in:
				if !ok {
					return
				}
				ev.Key = strings.TrimPrefix(ev.Key, p.prefix)
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				case <-p.closeCh:
					return
				}
			case <-ctx.Done():
				return
			case <-p.closeCh:
				return
			}
		}
	}()
	return out, nil
}

// NumKeys returns the inner store's key count (as c10d's PrefixStore does,
// it is not limited to the prefix).
func (p *PrefixStore) NumKeys(ctx context.Context) (int64, error) {
	if p.isClosed() {
		return 0, ErrClosed
	}
	return p.inner.NumKeys(ctx)
}

// Timeout returns the inner store's timeout.
func (p *PrefixStore) Timeout() time.Duration { return p.inner.Timeout() }

// Close closes this view only (its watchers end; the inner store stays open).
func (p *PrefixStore) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.closed = true
		close(p.closeCh)
	}
	return nil
}
