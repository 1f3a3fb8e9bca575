package natsstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/store"
)

// The add service. Revision-checked compare-and-swap makes Add atomic, but
// when a thousand ranks add to one counter at once (rendezvous, barriers)
// most attempts lose the race. As torchrun's agent hosts the TCPStore
// server, the process hosting NATS (rankrunner, via StartEmbedded) runs
// ServeAdds: it answers Add requests on a NATS subject and applies them
// through one Store, whose combining queue (add.go) turns N concurrent
// requests into one write. Clients use the service when one answers and
// fall back to their own compare-and-swap when none does. Each request
// carries an id; the service remembers answers for addDedupWindow, so a
// client retrying after a lost reply never adds twice.

const (
	addQueueGroup  = "ranktree-store-add"
	addDedupWindow = 2 * time.Minute
	noServiceRetry = 5 * time.Second // how long a client skips the service after "no responders"
)

// AddSubject is the NATS subject on which the add service of bucket listens.
func AddSubject(bucket string) string { return "ranktree.store." + bucket + ".add" }

type addRequest struct {
	ID    string `json:"id"`
	Key   string `json:"key"`
	Delta int64  `json:"delta"`
}

type addReply struct {
	Value       int64  `json:"value"`
	Error       string `json:"error,omitempty"`
	BadCounter  bool   `json:"bad_counter,omitempty"`
	Unavailable bool   `json:"unavailable,omitempty"`
}

// errNoService: no add service answered; nothing was applied.
var errNoService = errors.New("natsstore: no add service")

// remoteAdd sends Add to the add service. handled is false when no service
// answered the first attempt (the caller then does its own CAS).
func (s *Store) remoteAdd(ctx context.Context, key string, delta int64) (n int64, handled bool, err error) {
	s.mu.Lock()
	skip := time.Now().Before(s.noServiceUntil)
	s.mu.Unlock()
	if skip {
		return 0, false, nil
	}
	// Retries must land within the service's dedup memory.
	ctx, cancel := context.WithTimeout(ctx, addDedupWindow/2)
	defer cancel()
	req, _ := json.Marshal(addRequest{ID: nuidNext(), Key: key, Delta: delta})
	subj := AddSubject(s.bucket)
	sent := false
	var rep addReply
	err = s.retry(ctx, "add", key, func(actx context.Context) error {
		m, err := s.nc.RequestWithContext(actx, subj, req)
		if errors.Is(err, nats.ErrNoResponders) && !sent {
			return errNoService
		}
		if err != nil {
			sent = sent || transient(err)
			return err
		}
		sent = true
		rep = addReply{}
		if err := json.Unmarshal(m.Data, &rep); err != nil {
			return fmt.Errorf("natsstore: bad add service reply %q: %w", m.Data, err)
		}
		return nil
	})
	if errors.Is(err, errNoService) {
		s.mu.Lock()
		s.noServiceUntil = time.Now().Add(noServiceRetry)
		s.mu.Unlock()
		return 0, false, nil
	}
	if err != nil {
		return 0, true, err
	}
	switch {
	case rep.BadCounter:
		return 0, true, &store.CounterError{Key: key}
	case rep.Unavailable:
		return 0, true, &store.UnavailableError{Op: "add", Key: key, Err: errors.New(rep.Error)}
	case rep.Error != "":
		return 0, true, fmt.Errorf("natsstore: add of key %q: add service: %s", key, rep.Error)
	}
	return rep.Value, true, nil
}

// ServeAdds answers Add requests for every ranktree bucket on nc's server
// (queue group, so several instances share the load) until stop is called.
// StartEmbedded runs it; run it yourself next to an external NATS server to
// make large rendezvous fast. Without it, Add still works (by CAS).
func ServeAdds(nc *nats.Conn, log zerolog.Logger) (stop func(), err error) {
	ctx, cancel := context.WithCancel(context.Background())
	svc := &addService{nc: nc, log: log, ctx: ctx, buckets: map[string]*svcBucket{}, recent: map[string]*addCall{}}
	sub, err := nc.QueueSubscribe(AddSubject("*"), addQueueGroup, svc.handle)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("natsstore: add service: %w", err)
	}
	if err := nc.Flush(); err != nil {
		sub.Unsubscribe()
		cancel()
		return nil, fmt.Errorf("natsstore: add service: %w", err)
	}
	done := make(chan struct{})
	go svc.sweep(done)
	var once sync.Once
	return func() {
		once.Do(func() {
			sub.Unsubscribe()
			cancel()
			close(done)
			svc.mu.Lock()
			defer svc.mu.Unlock()
			for _, b := range svc.buckets {
				if b.st != nil {
					b.st.Close()
				}
			}
		})
	}, nil
}

type addService struct {
	nc  *nats.Conn
	log zerolog.Logger
	ctx context.Context

	mu      sync.Mutex
	buckets map[string]*svcBucket
	recent  map[string]*addCall // "<bucket> <request id>" → answer (dedup)
}

type svcBucket struct {
	ready chan struct{}
	st    *Store
	err   error
}

type addCall struct {
	done chan struct{}
	resp []byte
	at   time.Time
}

func (svc *addService) handle(m *nats.Msg) {
	tok := strings.Split(m.Subject, ".")
	var req addRequest
	if len(tok) != 4 || !strings.HasPrefix(tok[2], "ranktree-") || json.Unmarshal(m.Data, &req) != nil || req.ID == "" {
		b, _ := json.Marshal(addReply{Error: "malformed add request"})
		m.Respond(b)
		return
	}
	dedup := tok[2] + " " + req.ID // ids are unique per client; scope them to the bucket anyway
	svc.mu.Lock()
	if c := svc.recent[dedup]; c != nil { // a retry: answer with the first result
		svc.mu.Unlock()
		go func() {
			select {
			case <-c.done:
				m.Respond(c.resp)
			case <-svc.ctx.Done():
			}
		}()
		return
	}
	c := &addCall{done: make(chan struct{}), at: time.Now()}
	svc.recent[dedup] = c
	svc.mu.Unlock()
	go func() {
		var rep addReply
		st, err := svc.store(tok[2])
		if err == nil {
			rep.Value, err = st.Add(svc.ctx, req.Key, req.Delta)
		}
		if err != nil {
			rep.Error = err.Error()
			rep.BadCounter = errors.Is(err, store.ErrBadCounter)
			rep.Unavailable = !rep.BadCounter
		}
		c.resp, _ = json.Marshal(rep)
		close(c.done)
		m.Respond(c.resp)
	}()
}

// store opens the bucket once (concurrent requests wait for the first).
func (svc *addService) store(bucket string) (*Store, error) {
	svc.mu.Lock()
	b := svc.buckets[bucket]
	if b == nil {
		b = &svcBucket{ready: make(chan struct{})}
		svc.buckets[bucket] = b
		svc.mu.Unlock()
		b.st, b.err = openBucket(svc.ctx, svc.nc, "", bucket, store.DefaultTimeout, svc.log, false)
		if b.st != nil {
			b.st.directAdd = true // never call ourselves
		}
		close(b.ready)
		if b.err != nil {
			svc.mu.Lock()
			delete(svc.buckets, bucket)
			svc.mu.Unlock()
		}
		return b.st, b.err
	}
	svc.mu.Unlock()
	<-b.ready
	return b.st, b.err
}

// sweep forgets answers older than the dedup window.
func (svc *addService) sweep(done <-chan struct{}) {
	t := time.NewTicker(addDedupWindow / 4)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			cut := time.Now().Add(-addDedupWindow)
			svc.mu.Lock()
			for id, c := range svc.recent {
				select {
				case <-c.done:
					if c.at.Before(cut) {
						delete(svc.recent, id)
					}
				default:
				}
			}
			svc.mu.Unlock()
		case <-done:
			return
		}
	}
}
