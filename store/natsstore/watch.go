package natsstore

import (
	"context"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ranktree/ranktree/store"
)

// Watch pushes puts and deletes of keys starting with prefix (see
// store.Store.Watch). It rides on a KV watch whose subject filter covers
// prefix's complete '/'-segments; the rest of the prefix is matched on the
// decoded key. After a reconnect the KV watch is re-created from the last
// revision delivered, so no change is delivered twice. A key changed more
// than kvHistory (8) times before the watcher caught up (a slow reader, an
// outage) shows only its latest revisions.
func (s *Store) Watch(ctx context.Context, prefix string, replay bool) (<-chan store.Event, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.base, cancel)
	var from uint64 // deliver revisions > from after a re-creation
	if !replay {
		err := s.retry(wctx, "watch", prefix, func(actx context.Context) error {
			info, err := s.stream.Info(actx)
			if err != nil {
				return err
			}
			from = info.State.LastSeq
			return nil
		})
		if err != nil {
			stop()
			cancel()
			return nil, err
		}
	}
	w, err := s.startWatch(wctx, prefix, replay, from)
	if err != nil {
		stop()
		cancel()
		return nil, err
	}
	out := make(chan store.Event)
	go func() {
		defer close(out)
		defer stop()
		defer cancel()
		s.pumpWatch(wctx, prefix, w, from, out)
	}()
	return out, nil
}

// startWatch creates the KV watch: initial values when replaying, else
// only revisions after from.
func (s *Store) startWatch(ctx context.Context, prefix string, replay bool, from uint64) (jetstream.KeyWatcher, error) {
	var w jetstream.KeyWatcher
	err := s.retry(ctx, "watch", prefix, func(actx context.Context) error {
		var opts []jetstream.WatchOpt
		switch {
		case replay && from == 0:
		case from == 0:
			opts = append(opts, jetstream.UpdatesOnly())
		default:
			opts = append(opts, jetstream.IncludeHistory(), jetstream.ResumeFromRevision(from+1))
		}
		// The watch lives on ctx, not on the attempt's context.
		var err error
		w, err = s.kv.Watch(ctx, watchFilter(prefix), opts...)
		return err
	})
	return w, err
}

// pumpWatch forwards KV entries as store events until ctx ends, re-creating
// the KV watch after reconnects or when it is lost.
func (s *Store) pumpWatch(ctx context.Context, prefix string, w jetstream.KeyWatcher, from uint64, out chan<- store.Event) {
	for {
		reconn := s.reconnected()
		lost := false
		for !lost {
			select {
			case ent, ok := <-w.Updates():
				if !ok {
					lost = true
					break
				}
				if ent == nil || ent.Revision() <= from {
					continue
				}
				from = ent.Revision()
				key, err := DecodeKey(ent.Key())
				if err != nil || !strings.HasPrefix(key, prefix) {
					continue
				}
				ev := store.Event{Type: store.EventPut, Key: key, Value: ent.Value()}
				if ent.Operation() != jetstream.KeyValuePut {
					ev = store.Event{Type: store.EventDelete, Key: key}
				} else if ev.Value == nil {
					ev.Value = []byte{}
				}
				select {
				case out <- ev:
				case <-ctx.Done():
					_ = w.Stop()
					return
				}
			case <-reconn:
				lost = true
			case <-ctx.Done():
				_ = w.Stop()
				return
			}
		}
		_ = w.Stop()
		var err error
		for {
			if ctx.Err() != nil {
				return
			}
			// replay=false with from=0 can only mean nothing was seen since
			// an empty bucket: resume from the start.
			w, err = s.startWatch(ctx, prefix, true, from)
			if err == nil {
				break
			}
			s.log.Warn().Err(err).Str("prefix", prefix).Msg("re-creating store watch")
			if !s.sleep(ctx, backoff(3, 50*time.Millisecond, time.Second)) {
				return
			}
		}
	}
}
