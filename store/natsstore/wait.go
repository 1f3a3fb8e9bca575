package natsstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ranktree/ranktree/store"
)

// Get returns key's value, waiting up to the store timeout (or ctx) for it
// to be set. It reads the key once and, if absent, waits for a push from
// the server (a subscription to the key's KV subject, backed by a KV watch;
// never polling); after a reconnect the wait is re-armed, so a Get blocked
// across a NATS restart returns when the key is set afterwards. A timeout
// is a *store.TimeoutError.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	wctx, cancel := s.opContext(ctx, s.timeout)
	defer cancel()
	v, err := s.waitKey(wctx, key)
	if err != nil {
		return nil, s.waitError(ctx, wctx, "get", []string{key}, s.timeout, err)
	}
	return v, nil
}

// Wait blocks until every key exists, timeout passes (0: the store
// timeout) or ctx ends; see Get for how it waits.
func (s *Store) Wait(ctx context.Context, keys []string, timeout time.Duration) error {
	if s.isClosed() {
		return store.ErrClosed
	}
	if timeout <= 0 {
		timeout = s.timeout
	}
	wctx, cancel := s.opContext(ctx, timeout)
	defer cancel()
	for i, k := range keys {
		if _, err := s.waitKey(wctx, k); err != nil {
			return s.waitError(ctx, wctx, "wait", keys[i:], timeout, err)
		}
	}
	return nil
}

// waitError maps a failed wait to the store's errors: closed store, the
// caller's cancellation, or a *store.TimeoutError naming the missing keys.
func (s *Store) waitError(ctx, wctx context.Context, op string, keys []string, timeout time.Duration, err error) error {
	if s.isClosed() {
		return store.ErrClosed
	}
	if wctx.Err() == nil {
		return err // a permanent failure from the server
	}
	if ctx.Err() == context.Canceled {
		return fmt.Errorf("natsstore: %s of keys %q: %w", op, keys, ctx.Err())
	}
	if len(keys) > 1 { // name only the keys still missing
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), attemptTimeout)
		defer cancel()
		var missing []string
		for _, k := range keys {
			if e, lerr := s.last(cctx, k); lerr != nil || !e.exists {
				missing = append(missing, k)
			}
		}
		if len(missing) > 0 {
			keys = missing
		}
	}
	return &store.TimeoutError{Op: op, Keys: keys, Timeout: timeout}
}

// waitKey returns key's value once it exists, or an error when ctx ends.
//
// It subscribes to the key's KV subject (every write of the key is a
// message on it), passes a sync probe (syncProbe) and reads the key. A
// message on the subscription is only a wake-up: after another probe the
// value is read back from the stream, so a write that JetStream rejected is
// never reported. As a backstop, a JetStream KV watch of the key (one
// consumer per waiter, race-free) is opened if nothing arrived within
// safetyWatchAfter. Without the subscription, a thousand ranks waiting at
// once would each create a consumer.
func (s *Store) waitKey(ctx context.Context, key string) ([]byte, error) {
	for i := 0; ; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		reconn := s.reconnected()
		v, done, err := s.waitOnce(ctx, key, reconn)
		if done {
			return v, err
		}
		if err != nil && !transient(err) {
			return nil, err
		}
		// Outage or lost watch: wait for the reconnect (or a short backoff
		// while JetStream recovers) and try again.
		select {
		case <-reconn:
		case <-time.After(backoff(i, 50*time.Millisecond, time.Second)):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// safetyWatchAfter is how long waitKey relies on the subscription alone
// before also opening the KV watch. The sync probe closes the race between
// a write, the subscription and the first read for all practical purposes;
// the KV watch (race-free, but one consumer per waiter) is the backstop.
// Waiters open it after 1.5–3 s (jittered).
const safetyWatchAfter = 1500 * time.Millisecond

// waitOnce is one round of waitKey; done=false asks for another round.
func (s *Store) waitOnce(ctx context.Context, key string, reconn <-chan struct{}) ([]byte, bool, error) {
	wake := make(chan struct{}, 1)
	sub, err := s.nc.Subscribe(s.subject(key), func(*nats.Msg) {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return nil, false, err
	}
	defer sub.Unsubscribe()
	actx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	// The probe is sent after the SUB on the same connection, so the
	// subscription is in place; its answer means every write the server
	// received before it is stored, so the read below cannot miss a write
	// whose wake-up went out before the subscription existed.
	if err := s.syncProbe(actx); err != nil {
		return nil, false, err
	}
	e, err := s.last(actx, key)
	if err != nil {
		return nil, false, err
	}
	if e.exists {
		return e.value, true, nil
	}
	safety := time.NewTimer(safetyWatchAfter + rand.N(safetyWatchAfter)) // jitter spreads consumer creation
	defer safety.Stop()
	for {
		select {
		case <-wake:
			// The wake-up may overtake its own storage: probe first, so the
			// read sees the write (or the write was rejected: keep waiting).
			actx, cancel := context.WithTimeout(ctx, attemptTimeout)
			err := s.syncProbe(actx)
			var e entry
			if err == nil {
				e, err = s.last(actx, key)
			}
			cancel()
			if err != nil {
				return nil, false, err
			}
			if e.exists {
				return e.value, true, nil
			}
		case <-safety.C:
			return s.watchKey(ctx, key, reconn)
		case <-reconn:
			return nil, false, nil
		case <-ctx.Done():
			return nil, true, ctx.Err()
		}
	}
}

// watchKey waits on a KV watch of key. done reports a final answer (value,
// or ctx's end); !done means the watch was lost (reconnect, consumer gone)
// and the caller should re-create it.
func (s *Store) watchKey(ctx context.Context, key string, reconn <-chan struct{}) ([]byte, bool, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := s.kv.Watch(wctx, EncodeKey(key))
	if err != nil {
		if ctx.Err() != nil {
			return nil, true, ctx.Err()
		}
		return nil, false, err
	}
	defer w.Stop()
	for {
		select {
		case ent, ok := <-w.Updates():
			if !ok {
				return nil, false, nil
			}
			if ent == nil || ent.Operation() != jetstream.KeyValuePut {
				continue // end of initial values, or a delete marker
			}
			v := ent.Value()
			if v == nil {
				v = []byte{}
			}
			return v, true, nil
		case <-reconn:
			return nil, false, nil
		case <-ctx.Done():
			return nil, true, ctx.Err()
		}
	}
}

// syncToken is the KV subject token of the sync probe: EncodeKey never
// produces it ('=' is always followed by two hex digits or stands alone).
const syncToken = "=sync"

// syncProbe returns once the stream has processed every message it
// received before the probe. It publishes, in the stream's ingest order, a
// message whose expected last sequence can never match, so the stream
// answers with a rejection and stores nothing.
func (s *Store) syncProbe(ctx context.Context) error {
	m := nats.NewMsg(s.subjPre + syncToken)
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "18446744073709551615")
	_, err := s.js.PublishMsg(ctx, m)
	switch {
	case isWrongLastSeq(err):
		return nil
	case err == nil:
		return errors.New("natsstore: sync probe was stored")
	}
	return err
}
