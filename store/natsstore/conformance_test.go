package natsstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ranktree/ranktree/store"
)

// sharedServer is one embedded NATS server for the package's tests; each
// test gets its own job (bucket).
var (
	serverOnce sync.Once
	serverURL  string
	serverErr  error
)

func testURL(t testing.TB) string {
	t.Helper()
	serverOnce.Do(func() {
		serverURL, _, serverErr = StartEmbedded(EmbeddedOptions{})
	})
	if serverErr != nil {
		t.Fatalf("StartEmbedded: %v", serverErr)
	}
	return serverURL
}

var jobSeq struct {
	sync.Mutex
	n int
}

func uniqueJob(t testing.TB) string {
	jobSeq.Lock()
	defer jobSeq.Unlock()
	jobSeq.n++
	return fmt.Sprintf("%s-%d-%d", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano(), jobSeq.n)
}

func newNATSStore(t testing.TB, timeout time.Duration) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Connect(ctx, Options{URL: testURL(t), Job: uniqueJob(t), Timeout: timeout})
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// impls is the table of Store implementations every conformance case runs
// against. open returns stores sharing one key space (n "ranks").
type impl struct {
	name string
	open func(t *testing.T, timeout time.Duration, n int) []store.Store
}

var impls = []impl{
	{"mem", func(t *testing.T, timeout time.Duration, n int) []store.Store {
		s := store.NewMemStore(store.WithMemTimeout(timeout))
		t.Cleanup(func() { s.Close() })
		out := make([]store.Store, n)
		for i := range out {
			out[i] = s
		}
		return out
	}},
	{"nats", openNATS(false)},
	// nats-cas: every Add is a compare-and-swap from the client (no add
	// service), so the concurrency cases race revisions across connections.
	{"nats-cas", openNATS(true)},
}

func openNATS(direct bool) func(t *testing.T, timeout time.Duration, n int) []store.Store {
	return func(t *testing.T, timeout time.Duration, n int) []store.Store {
		job := uniqueJob(t)
		out := make([]store.Store, n)
		for i := range out {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			s, err := Connect(ctx, Options{URL: testURL(t), Job: job, Timeout: timeout, DirectAdd: direct})
			cancel()
			if err != nil {
				t.Fatalf("Connect: %v", err)
			}
			t.Cleanup(func() { s.Close() })
			out[i] = s
		}
		return out
	}
}

type storeCase struct {
	name    string
	timeout time.Duration // store timeout (0: 30 s)
	ranks   int           // stores opened on one key space (0: 1)
	run     func(t *testing.T, ctx context.Context, s []store.Store)
}

func TestStoreConformance(t *testing.T) {
	for _, im := range impls {
		for _, c := range conformanceCases {
			t.Run(im.name+"/"+c.name, func(t *testing.T) {
				timeout := c.timeout
				if timeout == 0 {
					timeout = 30 * time.Second
				}
				n := max(c.ranks, 1)
				ss := im.open(t, timeout, n)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				c.run(t, ctx, ss)
			})
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

var conformanceCases = []storeCase{
	{name: "SetGet", run: func(t *testing.T, ctx context.Context, s []store.Store) {
		must(t, s[0].Set(ctx, "k", []byte("v1")))
		must(t, s[0].Set(ctx, "k", []byte("v2")))
		v, err := s[0].Get(ctx, "k")
		must(t, err)
		if string(v) != "v2" {
			t.Fatalf("Get = %q, want v2", v)
		}
		must(t, s[0].Set(ctx, "empty", nil))
		v, err = s[0].Get(ctx, "empty")
		must(t, err)
		if v == nil || len(v) != 0 {
			t.Fatalf("Get of empty value = %#v, want non-nil empty", v)
		}
	}},
	{name: "GetBlocksUntilSet", ranks: 2, run: func(t *testing.T, ctx context.Context, s []store.Store) {
		go func() {
			time.Sleep(200 * time.Millisecond)
			s[1].Set(ctx, "late", []byte("here"))
		}()
		start := time.Now()
		v, err := s[0].Get(ctx, "late")
		must(t, err)
		if string(v) != "here" || time.Since(start) < 150*time.Millisecond {
			t.Fatalf("Get = %q after %v", v, time.Since(start))
		}
	}},
	{name: "GetTimeout", timeout: time.Second, run: func(t *testing.T, ctx context.Context, s []store.Store) {
		start := time.Now()
		_, err := s[0].Get(ctx, "missing/key")
		el := time.Since(start)
		if err == nil || !regexp.MustCompile(`(?i)timeout`).MatchString(err.Error()) || !errors.Is(err, store.ErrTimeout) {
			t.Fatalf("Get of missing key: err = %v, want a timeout", err)
		}
		if !strings.Contains(err.Error(), "missing/key") {
			t.Errorf("timeout error %q does not name the key", err)
		}
		if el < time.Second || el > 3*time.Second {
			t.Fatalf("Get timed out after %v, want between 1 s and 3 s", el)
		}
	}},
	{name: "GetCtxCancel", run: func(t *testing.T, ctx context.Context, s []store.Store) {
		cctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(100*time.Millisecond, cancel)
		_, err := s[0].Get(cctx, "never")
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Get with cancelled ctx: %v", err)
		}
	}},
	{name: "Add", run: func(t *testing.T, ctx context.Context, s []store.Store) {
		for _, step := range []struct{ d, want int64 }{{5, 5}, {-2, 3}, {0, 3}, {1 << 40, 1<<40 + 3}} {
			n, err := s[0].Add(ctx, "ctr", step.d)
			must(t, err)
			if n != step.want {
				t.Fatalf("Add(%d) = %d, want %d", step.d, n, step.want)
			}
		}
		v, err := s[0].Get(ctx, "ctr")
		must(t, err)
		if string(v) != fmt.Sprint(int64(1<<40+3)) {
			t.Fatalf("counter text %q", v)
		}
		must(t, s[0].Set(ctx, "notnum", []byte("abc")))
		if _, err := s[0].Add(ctx, "notnum", 1); !errors.Is(err, store.ErrBadCounter) {
			t.Fatalf("Add on text value: %v, want ErrBadCounter", err)
		}
	}},
	{name: "CompareAndSet", run: func(t *testing.T, ctx context.Context, s []store.Store) {
		v, err := s[0].CompareAndSet(ctx, "c", nil, []byte("a"))
		must(t, err)
		if string(v) != "a" {
			t.Fatalf("create-if-absent = %q, want a", v)
		}
		v, err = s[0].CompareAndSet(ctx, "c", nil, []byte("b"))
		must(t, err)
		if string(v) != "a" {
			t.Fatalf("create on existing = %q, want current a", v)
		}
		v, err = s[0].CompareAndSet(ctx, "c", []byte("x"), []byte("b"))
		must(t, err)
		if string(v) != "a" {
			t.Fatalf("wrong expected = %q, want current a", v)
		}
		v, err = s[0].CompareAndSet(ctx, "c", []byte("a"), []byte("b"))
		must(t, err)
		if string(v) != "b" {
			t.Fatalf("swap = %q, want b", v)
		}
		v, err = s[0].CompareAndSet(ctx, "absent", []byte("a"), []byte("b"))
		must(t, err)
		if v != nil {
			t.Fatalf("compare on absent key = %q, want nil", v)
		}
		if ok, _ := s[0].Check(ctx, []string{"absent"}); ok {
			t.Fatal("compare on absent key created it")
		}
	}},
	{name: "DeleteCheck", run: func(t *testing.T, ctx context.Context, s []store.Store) {
		must(t, s[0].Set(ctx, "d1", []byte("1")))
		must(t, s[0].Set(ctx, "d2", []byte("2")))
		ok, err := s[0].Check(ctx, []string{"d1", "d2"})
		must(t, err)
		if !ok {
			t.Fatal("Check(d1,d2) = false")
		}
		existed, err := s[0].Delete(ctx, "d1")
		must(t, err)
		if !existed {
			t.Fatal("Delete of existing key reported false")
		}
		existed, err = s[0].Delete(ctx, "d1")
		must(t, err)
		if existed {
			t.Fatal("second Delete reported true")
		}
		if ok, _ := s[0].Check(ctx, []string{"d1", "d2"}); ok {
			t.Fatal("Check true after delete")
		}
		if ok, _ := s[0].Check(ctx, []string{"d2"}); !ok {
			t.Fatal("Check(d2) false")
		}
		// A deleted key can be re-created by create-if-absent and Add.
		v, err := s[0].CompareAndSet(ctx, "d1", nil, []byte("again"))
		must(t, err)
		if string(v) != "again" {
			t.Fatalf("create after delete = %q", v)
		}
	}},
	{name: "Wait", timeout: 10 * time.Second, ranks: 2, run: func(t *testing.T, ctx context.Context, s []store.Store) {
		go func() {
			time.Sleep(100 * time.Millisecond)
			s[1].Set(ctx, "w1", []byte("1"))
			s[1].Set(ctx, "w2", []byte("2"))
		}()
		must(t, s[0].Wait(ctx, []string{"w1", "w2"}, 0))
		start := time.Now()
		err := s[0].Wait(ctx, []string{"w1", "w3"}, 500*time.Millisecond)
		if !errors.Is(err, store.ErrTimeout) || !strings.Contains(err.Error(), "w3") || strings.Contains(err.Error(), `"w1"`) {
			t.Fatalf("Wait for w3: %v (want timeout naming only w3)", err)
		}
		if el := time.Since(start); el < 500*time.Millisecond || el > 5*time.Second {
			t.Fatalf("Wait timed out after %v", el)
		}
	}},
	{name: "Watch", ranks: 2, run: func(t *testing.T, ctx context.Context, s []store.Store) {
		must(t, s[1].Set(ctx, "ab/old", []byte("0")))
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		live, err := s[0].Watch(wctx, "ab/", false)
		must(t, err)
		partial, err := s[0].Watch(wctx, "ab/x", false)
		must(t, err)
		must(t, s[1].Set(ctx, "ab/x1", []byte("1")))
		must(t, s[1].Set(ctx, "zz/x", []byte("no")))
		must(t, s[1].Set(ctx, "ab/y", []byte("2")))
		if _, err := s[1].Delete(ctx, "ab/x1"); err != nil {
			t.Fatal(err)
		}
		want := []store.Event{{Type: store.EventPut, Key: "ab/x1", Value: []byte("1")}, {Type: store.EventPut, Key: "ab/y", Value: []byte("2")}, {Type: store.EventDelete, Key: "ab/x1", Value: nil}}
		expectEvents(t, live, want)
		expectEvents(t, partial, []store.Event{want[0], want[2]})
		replay, err := s[0].Watch(wctx, "ab/", true)
		must(t, err)
		expectEvents(t, replay, []store.Event{{Type: store.EventPut, Key: "ab/old", Value: []byte("0")}, {Type: store.EventPut, Key: "ab/y", Value: []byte("2")}})
		cancel()
		select {
		case _, ok := <-live:
			for ok {
				_, ok = <-live
			}
		case <-time.After(5 * time.Second):
			t.Fatal("watch channel not closed after ctx cancel")
		}
	}},
	{name: "PrefixStoreWatch", run: func(t *testing.T, ctx context.Context, s []store.Store) {
		p := store.WithPrefix(s[0], "restart/3/")
		ch, err := p.Watch(ctx, "abort/", false)
		must(t, err)
		must(t, p.Set(ctx, "abort/comm1", []byte(`{"rank":1}`)))
		expectEvents(t, ch, []store.Event{{Type: store.EventPut, Key: "abort/comm1", Value: []byte(`{"rank":1}`)}})
		v, err := s[0].Get(ctx, "restart/3/abort/comm1")
		must(t, err)
		if string(v) != `{"rank":1}` {
			t.Fatalf("inner key holds %q", v)
		}
	}},
	{name: "NumKeys", run: func(t *testing.T, ctx context.Context, s []store.Store) {
		for i := range 5 {
			must(t, s[0].Set(ctx, fmt.Sprintf("n/%d", i), []byte("x")))
		}
		s[0].Delete(ctx, "n/0")
		n, err := s[0].NumKeys(ctx)
		must(t, err)
		if n != 4 {
			t.Fatalf("NumKeys = %d, want 4", n)
		}
	}},
	{name: "OddKeysAndBigValue", run: func(t *testing.T, ctx context.Context, s []store.Store) {
		keys := []string{"NCCLABORTEDCOMM:0af3", "1:3", "a/b/c", "/lead", "trail/", "a//b", "with space", "ünïcødé/日本", "dots.and*wild>", "=3D", "", "%$#@!"}
		for i, k := range keys {
			must(t, s[0].Set(ctx, k, []byte(fmt.Sprint(i))))
		}
		for i, k := range keys {
			v, err := s[0].Get(ctx, k)
			must(t, err)
			if string(v) != fmt.Sprint(i) {
				t.Fatalf("key %q read %q, want %d", k, v, i)
			}
		}
		big := make([]byte, 1<<20)
		for i := range big {
			big[i] = byte(i*7 + i>>9)
		}
		must(t, s[0].Set(ctx, "big", big))
		v, err := s[0].Get(ctx, "big")
		must(t, err)
		if !bytes.Equal(v, big) {
			t.Fatalf("1 MiB value did not round-trip (got %d bytes)", len(v))
		}
	}},
	{name: "ConcurrentAdd", ranks: 4, run: func(t *testing.T, ctx context.Context, s []store.Store) {
		// 64 goroutines over 4 connections: combining within a connection,
		// compare-and-swap races between connections.
		const G, N = 64, 1000
		var wg sync.WaitGroup
		errs := make(chan error, G)
		for g := range G {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range N {
					if _, err := s[g%len(s)].Add(ctx, "hot", 1); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		n, err := s[0].Add(ctx, "hot", 0)
		must(t, err)
		if n != G*N {
			t.Fatalf("64×1000 Add = %d, want %d", n, G*N)
		}
	}},
	{name: "RacingCreate", ranks: 4, run: func(t *testing.T, ctx context.Context, s []store.Store) {
		const G = 32
		var wg sync.WaitGroup
		wins := make(chan int, G)
		for g := range G {
			wg.Add(1)
			go func() {
				defer wg.Done()
				mine := []byte(fmt.Sprint("g", g))
				v, err := s[g%len(s)].CompareAndSet(ctx, "leader", nil, mine)
				if err != nil {
					t.Error(err)
					return
				}
				if bytes.Equal(v, mine) {
					wins <- g
				}
			}()
		}
		wg.Wait()
		close(wins)
		var w []int
		for g := range wins {
			w = append(w, g)
		}
		if len(w) != 1 {
			t.Fatalf("create-if-absent winners = %v, want exactly one", w)
		}
		v, _ := s[0].Get(ctx, "leader")
		if string(v) != fmt.Sprint("g", w[0]) {
			t.Fatalf("stored %q, winner g%d", v, w[0])
		}
	}},
	{name: "Barrier", ranks: 4, run: func(t *testing.T, ctx context.Context, s []store.Store) {
		errs := make([]error, 4)
		var wg sync.WaitGroup
		for r := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[r] = store.Barrier(ctx, s[r], "b", r, 4, 10*time.Second)
			}()
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Errorf("rank %d: %v", r, err)
			}
		}
	}},
	{name: "BarrierAbsentRank", ranks: 4, run: func(t *testing.T, ctx context.Context, s []store.Store) {
		errs := make([]error, 3)
		var wg sync.WaitGroup
		start := time.Now()
		for r := range 3 { // rank 3 never comes
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[r] = store.Barrier(ctx, s[r], "init", r, 4, 3*time.Second)
			}()
		}
		wg.Wait()
		if el := time.Since(start); el < 3*time.Second || el > 20*time.Second {
			t.Errorf("barrier timed out after %v, want about 3 s", el)
		}
		for r, err := range errs {
			var be *store.BarrierError
			if !errors.As(err, &be) || !errors.Is(err, store.ErrTimeout) {
				t.Fatalf("rank %d: %v, want *store.BarrierError", r, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, "Timed out") || !strings.Contains(msg, "store based barrier") || !strings.Contains(msg, "ranks [3] missing") || !strings.Contains(msg, "ranks [0 1 2] arrived") {
				t.Fatalf("rank %d: barrier error %q", r, msg)
			}
		}
	}},
	{name: "Close", run: func(t *testing.T, ctx context.Context, s []store.Store) {
		ch, err := s[0].Watch(ctx, "", false)
		must(t, err)
		done := make(chan error, 1)
		go func() { _, err := s[0].Get(ctx, "never"); done <- err }()
		time.Sleep(100 * time.Millisecond)
		must(t, s[0].Close())
		must(t, s[0].Close())
		select {
		case err := <-done:
			if !errors.Is(err, store.ErrClosed) {
				t.Fatalf("Get blocked at Close: %v, want ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Get still blocked 5 s after Close")
		}
		select {
		case _, ok := <-ch:
			if ok {
				t.Fatal("event after Close")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("watch not closed by Close")
		}
		if err := s[0].Set(ctx, "k", nil); !errors.Is(err, store.ErrClosed) {
			t.Fatalf("Set after Close: %v", err)
		}
		if _, err := s[0].Add(ctx, "k", 1); !errors.Is(err, store.ErrClosed) {
			t.Fatalf("Add after Close: %v", err)
		}
	}},
}

func expectEvents(t *testing.T, ch <-chan store.Event, want []store.Event) {
	t.Helper()
	for i, w := range want {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("watch closed after %d events, want %v", i, want)
			}
			if ev.Type != w.Type || ev.Key != w.Key || !bytes.Equal(ev.Value, w.Value) {
				t.Fatalf("event %d = {%v %q %q}, want {%v %q %q}", i, ev.Type, ev.Key, ev.Value, w.Type, w.Key, w.Value)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no event %d after 10 s, want %+v", i, w)
		}
	}
}
