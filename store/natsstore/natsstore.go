package natsstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/store"
)

// kvHistory is the bucket's per-key history. Only the latest revision is
// read; the older ones let a lagging watcher still see every change of a
// key that changes up to kvHistory times before it catches up.
const kvHistory = 8

// attemptTimeout bounds one request to the server; an operation retries
// attempts until its own bound (the store timeout or ctx).
const attemptTimeout = 5 * time.Second

// Store is a store.Store over one JetStream KV bucket per job (History 8,
// file storage). Keys are encoded with EncodeKey. It is safe for concurrent
// use and survives NATS restarts: during an outage each call either
// succeeds after the reconnect or returns a typed error
// (store.ErrUnavailable, store.ErrTimeout), never a wrong value.
type Store struct {
	nc      *nats.Conn
	ownConn bool
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	stream  jetstream.Stream
	job     string
	bucket  string
	subjPre string // "$KV.<bucket>."
	timeout time.Duration
	log     zerolog.Logger

	status chan nats.Status // connection status listener (CONNECTED events)

	mu      sync.Mutex
	reconn  chan struct{} // closed and replaced on every reconnect
	closed  bool
	closeCh chan struct{}
	base    context.Context // cancelled by Close
	cancel  context.CancelFunc

	directAdd      bool      // Add never uses the add service (service.go)
	noServiceUntil time.Time // guarded by mu: skip the add service until then

	addMu sync.Mutex
	adds  map[string]*addQueue // per-key combining queues (add.go)
}

var _ store.Store = (*Store)(nil)

func newStore(ctx context.Context, nc *nats.Conn, job string, timeout time.Duration, log zerolog.Logger, own bool) (*Store, error) {
	return openBucket(ctx, nc, job, BucketForJob(job), timeout, log, own)
}

// openBucket opens (creating if absent) bucket; job only labels it.
func openBucket(ctx context.Context, nc *nats.Conn, job, bucket string, timeout time.Duration, log zerolog.Logger, own bool) (*Store, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("natsstore: jetstream: %w", err)
	}
	s := &Store{
		nc: nc, ownConn: own, js: js, job: job, bucket: bucket,
		subjPre: "$KV." + bucket + ".",
		timeout: timeout,
		log:     log.With().Str("job", job).Str("bucket", bucket).Logger(),
		reconn:  make(chan struct{}),
		closeCh: make(chan struct{}),
		adds:    make(map[string]*addQueue),
	}
	s.base, s.cancel = context.WithCancel(context.Background())
	err = s.retry(ctx, "open", "", func(actx context.Context) error {
		kv, err := js.KeyValue(actx, bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			kv, err = js.CreateKeyValue(actx, jetstream.KeyValueConfig{
				Bucket:      bucket,
				Description: "ranktree store of job " + job,
				History:     kvHistory,
				Storage:     jetstream.FileStorage,
			})
			if errors.Is(err, jetstream.ErrBucketExists) {
				kv, err = js.KeyValue(actx, bucket)
			}
		}
		if err != nil {
			return err
		}
		st, err := js.Stream(actx, "KV_"+bucket)
		if err != nil {
			return err
		}
		s.kv, s.stream = kv, st
		return nil
	})
	if err != nil {
		s.cancel()
		return nil, err
	}
	s.status = nc.StatusChanged(nats.CONNECTED)
	go s.watchStatus(s.status)
	return s, nil
}

// watchStatus turns reconnects into a broadcast: waiters and watchers
// re-create their KV watches, whose server-side consumers a restarted
// server has lost.
func (s *Store) watchStatus(ch chan nats.Status) {
	for st := range ch {
		if st != nats.CONNECTED {
			continue
		}
		s.mu.Lock()
		close(s.reconn)
		s.reconn = make(chan struct{})
		s.mu.Unlock()
	}
}

// reconnected returns a channel closed at the next reconnect.
func (s *Store) reconnected() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reconn
}

// Conn returns the NATS connection (for event publishing by others).
func (s *Store) Conn() *nats.Conn { return s.nc }

// Bucket returns the KV bucket name (BucketForJob of the job).
func (s *Store) Bucket() string { return s.bucket }

// Job returns the job name.
func (s *Store) Job() string { return s.job }

// Timeout returns the store timeout for Get and Wait.
func (s *Store) Timeout() time.Duration { return s.timeout }

func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Close stops waiters and watchers and, if Connect opened the connection,
// closes it (after flushing). Idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closeCh)
	s.mu.Unlock()
	s.cancel()
	s.nc.RemoveStatusListener(s.status)
	if s.ownConn {
		_ = s.nc.FlushTimeout(time.Second)
		s.nc.Close()
	}
	return nil
}

func (s *Store) subject(key string) string { return s.subjPre + EncodeKey(key) }

// opContext bounds a non-waiting operation by the store timeout and ctx,
// and ends it when the store closes.
func (s *Store) opContext(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, d)
	stop := context.AfterFunc(s.base, cancel)
	return ctx, func() { stop(); cancel() }
}

// transient reports whether err may go away by retrying (outage, restart,
// JetStream not ready yet, request timeout).
func transient(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, nats.ErrJetStreamNotEnabled) ||
		errors.Is(err, jetstream.ErrServerShutdown) || errors.Is(err, nats.ErrNoServers) ||
		errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, nats.ErrConsumerNotActive) {
		return true
	}
	var api *jetstream.APIError
	if errors.As(err, &api) && (api.Code == 503 || api.ErrorCode == errCodeMaxConsumers) {
		return true // JetStream not ready; or consumers will free up as waits end
	}
	return false
}

// errCodeMaxConsumers is JetStream's "maximum consumers limit reached"
// (a server without lifted limits allows 1000 consumers per stream).
const errCodeMaxConsumers = 10026

// retry runs attempt (each bounded by attemptTimeout) until it succeeds,
// fails permanently, or the operation bound passes (→ *store.UnavailableError).
func (s *Store) retry(ctx context.Context, op, key string, attempt func(actx context.Context) error) error {
	octx, cancel := s.opContext(ctx, s.timeout)
	defer cancel()
	var last error
	for i := 0; ; i++ {
		if s.isClosed() {
			return store.ErrClosed
		}
		actx, acancel := context.WithTimeout(octx, attemptTimeout)
		err := attempt(actx)
		acancel()
		if err == nil {
			return nil
		}
		if !transient(err) || octx.Err() != nil {
			if s.isClosed() {
				return store.ErrClosed
			}
			if transient(err) || errors.Is(err, nats.ErrConnectionClosed) {
				return &store.UnavailableError{Op: op, Key: key, Err: err}
			}
			return fmt.Errorf("natsstore: %s of key %q: %w", op, key, err)
		}
		last = err
		s.log.Debug().Err(last).Str("op", op).Str("key", key).Int("attempt", i).Msg("store op retrying")
		if !s.sleep(octx, backoff(i, 20*time.Millisecond, time.Second)) {
			if s.isClosed() {
				return store.ErrClosed
			}
			return &store.UnavailableError{Op: op, Key: key, Err: last}
		}
	}
}

// backoff is a full-jitter exponential delay: uniform in [0, min(max, base·2^i)].
func backoff(i int, base, max time.Duration) time.Duration {
	d := base << min(i, 20)
	if d > max || d <= 0 {
		d = max
	}
	return time.Duration(rand.Int64N(int64(d) + 1))
}

// sleep waits d; false if ctx ended or the store closed first.
func (s *Store) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-s.closeCh:
		return false
	}
}

// entry is the last message of a key's subject.
type entry struct {
	value  []byte
	seq    uint64 // stream sequence of the last message (0: never written)
	exists bool   // false when absent or the last message is a delete marker
	msgID  string // Nats-Msg-Id of the last write
}

const (
	kvOpHeader = "KV-Operation"
	kvOpDel    = "DEL"
	kvOpPurge  = "PURGE"
)

// last reads the key's latest message with one direct get.
func (s *Store) last(actx context.Context, key string) (entry, error) {
	m, err := s.stream.GetLastMsgForSubject(actx, s.subject(key))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return entry{}, nil
	}
	if err != nil {
		return entry{}, err
	}
	e := entry{value: m.Data, seq: m.Sequence, exists: true}
	if m.Header != nil {
		switch m.Header.Get(kvOpHeader) {
		case kvOpDel, kvOpPurge:
			e.exists, e.value = false, nil
		}
		e.msgID = m.Header.Get(jetstream.MsgIDHeader)
	}
	if e.exists && e.value == nil {
		e.value = []byte{}
	}
	return e, nil
}

func isWrongLastSeq(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) &&
		(api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// errConflict reports a lost compare-and-swap race (the key changed since it
// was read); the caller re-reads and tries again.
var errConflict = errors.New("natsstore: revision conflict")

// write publishes value (or a delete marker) to key with a unique message
// id, optionally only if the key's last sequence is expect. Attempts whose
// outcome is unknown (timeouts during an outage) are retried with the same
// id: JetStream de-duplicates a plain write, and a conditional write is
// recognised as ours by reading the key's last message id. It returns the
// new sequence, errConflict, or an error.
func (s *Store) write(ctx context.Context, op, key string, value []byte, del bool, expect *uint64) (uint64, error) {
	id := nuidNext()
	msg := &nats.Msg{Subject: s.subject(key), Data: value, Header: nats.Header{}}
	if del {
		msg.Header.Set(kvOpHeader, kvOpDel)
	}
	popts := []jetstream.PublishOpt{jetstream.WithMsgID(id)}
	if expect != nil {
		popts = append(popts, jetstream.WithExpectLastSequencePerSubject(*expect))
	}
	var seq uint64
	uncertain := false
	err := s.retry(ctx, op, key, func(actx context.Context) error {
		ack, err := s.js.PublishMsg(actx, msg, popts...)
		if err == nil {
			seq = ack.Sequence
			return nil
		}
		if transient(err) {
			uncertain = true
			return err
		}
		if isWrongLastSeq(err) {
			if !uncertain {
				return errConflict
			}
			e, lerr := s.last(actx, key)
			if lerr != nil {
				return lerr
			}
			if e.msgID == id {
				seq = e.seq
				return nil
			}
			if e.seq > *expect {
				// Someone wrote after our expected revision: that may have
				// been our lost attempt, overwritten since. Unknowable.
				return &store.UnavailableError{Op: op, Key: key, Err: errors.New("outcome of a write interrupted by a NATS outage is unknown")}
			}
			return errConflict
		}
		return err
	})
	return seq, err
}

// Set stores value under key (a KV put; retried idempotently).
func (s *Store) Set(ctx context.Context, key string, value []byte) error {
	if s.isClosed() {
		return store.ErrClosed
	}
	_, err := s.write(ctx, "set", key, value, false, nil)
	return err
}

// cas repeatedly reads key and applies decide until a conditional write
// succeeds or decide declines (write=false).
func (s *Store) cas(ctx context.Context, op, key string, decide func(e entry) (val []byte, del, write bool, err error)) (entry, error) {
	deadline := time.Now().Add(s.timeout)
	for i := 0; ; i++ {
		if time.Now().After(deadline) {
			return entry{}, &store.UnavailableError{Op: op, Key: key, Err: fmt.Errorf("compare-and-swap kept losing races for %v (store timeout)", s.timeout)}
		}
		if s.isClosed() {
			return entry{}, store.ErrClosed
		}
		var e entry
		err := s.retry(ctx, op, key, func(actx context.Context) error {
			var err error
			e, err = s.last(actx, key)
			return err
		})
		if err != nil {
			return entry{}, err
		}
		val, del, write, err := decide(e)
		if err != nil || !write {
			return e, err
		}
		expect := e.seq
		_, err = s.write(ctx, op, key, val, del, &expect)
		if err == nil {
			return entry{value: val, exists: !del}, nil
		}
		if !errors.Is(err, errConflict) {
			return entry{}, err
		}
		if ctx.Err() != nil {
			return entry{}, &store.UnavailableError{Op: op, Key: key, Err: ctx.Err()}
		}
		time.Sleep(backoff(i, time.Millisecond, time.Second))
	}
}

// CompareAndSet is c10d compare_set (see store.Store). For an absent key and
// a non-empty expected it stores nothing and returns nil.
func (s *Store) CompareAndSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	if desired == nil {
		desired = []byte{}
	}
	e, err := s.cas(ctx, "compare_set", key, func(e entry) ([]byte, bool, bool, error) {
		switch {
		case !e.exists && len(expected) == 0:
			return desired, false, true, nil
		case e.exists && len(expected) > 0 && string(e.value) == string(expected):
			return desired, false, true, nil
		}
		return nil, false, false, nil
	})
	if err != nil {
		return nil, err
	}
	if !e.exists {
		return nil, nil
	}
	return e.value, nil
}

// Delete removes key (a KV delete marker) and reports whether it existed.
func (s *Store) Delete(ctx context.Context, key string) (bool, error) {
	existed := false
	_, err := s.cas(ctx, "delete", key, func(e entry) ([]byte, bool, bool, error) {
		existed = e.exists
		return nil, true, e.exists, nil
	})
	return existed, err
}

// Check reports whether every key exists (one direct get per key).
func (s *Store) Check(ctx context.Context, keys []string) (bool, error) {
	if s.isClosed() {
		return false, store.ErrClosed
	}
	for _, k := range keys {
		var e entry
		err := s.retry(ctx, "check", k, func(actx context.Context) error {
			var err error
			e, err = s.last(actx, k)
			return err
		})
		if err != nil {
			return false, err
		}
		if !e.exists {
			return false, nil
		}
	}
	return true, nil
}

// NumKeys counts the bucket's live keys (c10d num_keys).
func (s *Store) NumKeys(ctx context.Context) (int64, error) {
	if s.isClosed() {
		return 0, store.ErrClosed
	}
	var n int64
	err := s.retry(ctx, "num_keys", "", func(actx context.Context) error {
		n = 0
		l, err := s.kv.ListKeys(actx)
		if err != nil {
			if errors.Is(err, jetstream.ErrNoKeysFound) {
				return nil
			}
			return err
		}
		defer l.Stop()
		for range l.Keys() {
			n++
		}
		return actx.Err()
	})
	return n, err
}
