package natsstore

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/ranktree/ranktree/store"
)

func TestKeyEncodingRoundTrip(t *testing.T) {
	for _, k := range []string{"", "a", "NCCLABORTEDCOMM:deadbeef", "1:3", "restart/0/abort/x", "/", "//", "a/", "/a", "with space", "ünï/日本語", "a.b", "*", ">", "=", "=41", "\x00\xff"} {
		enc := EncodeKey(k)
		if enc == "" || strings.Contains(enc, "..") || strings.HasPrefix(enc, ".") || strings.HasSuffix(enc, ".") {
			t.Errorf("EncodeKey(%q) = %q: not a legal NATS KV key", k, enc)
		}
		for _, c := range []byte(enc) {
			if !(keepByte(c) || c == '=' || c == '.') {
				t.Errorf("EncodeKey(%q) = %q has byte %q", k, enc, c)
			}
		}
		dec, err := DecodeKey(enc)
		if err != nil || dec != k {
			t.Errorf("DecodeKey(EncodeKey(%q)) = %q, %v", k, dec, err)
		}
	}
	if got := EncodeKey("restart/0/abort/c:1"); got != "restart.0.abort.c=3A1" {
		t.Errorf("EncodeKey = %q", got)
	}
	for _, bad := range []string{"a..b", "=4", "=ZZ", "a b", ".a"} {
		if _, err := DecodeKey(bad); err == nil {
			t.Errorf("DecodeKey(%q) accepted", bad)
		}
	}
}

func FuzzKeyRoundTrip(f *testing.F) {
	for _, s := range []string{"", "a/b", "x:y", "ü", "=", "/."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, k string) {
		enc := EncodeKey(k)
		if !validKey(enc) {
			t.Fatalf("EncodeKey(%q) = %q is not a legal KV key", k, enc)
		}
		if dec, err := DecodeKey(enc); err != nil || dec != k {
			t.Fatalf("round trip of %q: %q, %v", k, dec, err)
		}
		// prefix watches: the filter must cover every key with the prefix
		for i := 0; i <= len(k); i++ {
			if !subjectMatches(watchFilter(k[:i]), enc) {
				t.Fatalf("filter %q for prefix %q misses key %q (%q)", watchFilter(k[:i]), k[:i], k, enc)
			}
		}
	})
}

func validKey(enc string) bool {
	if enc == "" || enc[0] == '.' || enc[len(enc)-1] == '.' || strings.Contains(enc, "..") {
		return false
	}
	for _, c := range []byte(enc) {
		if !(keepByte(c) || c == '=' || c == '.') {
			return false
		}
	}
	return true
}

// subjectMatches is NATS subject matching for literal subjects and filters
// whose only wildcard is a trailing ">".
func subjectMatches(filter, subj string) bool {
	if filter == ">" {
		return true
	}
	lit := strings.TrimSuffix(filter, ">")
	return strings.HasPrefix(subj, lit) && len(subj) > len(lit)
}

func TestBucketForJob(t *testing.T) {
	cases := map[string]string{"mnist": "ranktree-mnist", "a.b": "ranktree-a_2Eb", "a_b": "ranktree-a_5Fb", "Job-1": "ranktree-Job-1"}
	for job, want := range cases {
		if got := BucketForJob(job); got != want {
			t.Errorf("BucketForJob(%q) = %q, want %q", job, got, want)
		}
	}
}

func TestConnectValidation(t *testing.T) {
	ctx := context.Background()
	for _, o := range []Options{{Job: "j"}, {URL: "nats://x"}, {URL: "nats://x", Job: "j", Credentials: Credentials{TLSCert: "c"}}, {URL: "nats://x", Job: "j", Credentials: Credentials{Password: "p"}}, {URL: "nats://x", Job: "j", Timeout: -1}} {
		if _, err := Connect(ctx, o); err == nil {
			t.Errorf("Connect(%+v) accepted", o)
		}
	}
	_, err := Connect(ctx, Options{URL: "nats://user:secret@127.0.0.1:1", Job: "j"})
	if !errors.Is(err, store.ErrUnavailable) || strings.Contains(err.Error(), "secret") {
		t.Errorf("Connect to a closed port: %v (want ErrUnavailable, password redacted)", err)
	}
}

func TestEmbeddedAuth(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, stop, err := StartEmbedded(EmbeddedOptions{Token: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if _, err := Connect(ctx, Options{URL: u, Job: "auth"}); err == nil {
		t.Fatal("Connect without the token succeeded")
	}
	s, err := Connect(ctx, Options{URL: u, Job: "auth", Credentials: Credentials{Token: "s3cret"}})
	if err != nil {
		t.Fatalf("Connect with token: %v", err)
	}
	defer s.Close()
	must(t, s.Set(ctx, "k", []byte("v")))

	u2, stop2, err := StartEmbedded(EmbeddedOptions{User: "rank", Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	defer stop2()
	if _, err := Connect(ctx, Options{URL: u2, Job: "auth", Credentials: Credentials{User: "rank", Password: "bad"}}); err == nil {
		t.Fatal("Connect with a wrong password succeeded")
	}
	s2, err := Connect(ctx, Options{URL: u2, Job: "auth", Credentials: Credentials{User: "rank", Password: "pw"}})
	if err != nil {
		t.Fatalf("Connect with user/password: %v", err)
	}
	s2.Close()
}

func TestNewFromConnSharesConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := nats.Connect(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	job := uniqueJob(t)
	s, err := NewFromConn(ctx, nc, job, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s.Conn() != nc || s.Timeout() != store.DefaultTimeout || s.Bucket() != BucketForJob(job) {
		t.Fatalf("NewFromConn: conn/timeout/bucket = %p/%v/%q", s.Conn(), s.Timeout(), s.Bucket())
	}
	must(t, s.Set(ctx, "k", []byte("v")))
	s.Close()
	if nc.IsClosed() {
		t.Fatal("Store.Close closed a connection it does not own")
	}
	s2, err := NewFromConn(ctx, nc, job, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	v, err := s2.Get(ctx, "k")
	if err != nil || string(v) != "v" {
		t.Fatalf("second store on the same bucket: %q, %v", v, err)
	}
}

// TestRestart stops the NATS server (file storage) and starts it again on
// the same port and directory: values written before are read back after,
// and a Get blocked across the restart returns once the key is set.
func TestRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a NATS server")
	}
	dir := t.TempDir()
	u, stop, err := StartEmbedded(EmbeddedOptions{StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	pu, _ := url.Parse(u)
	port, _ := strconv.Atoi(pu.Port())
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s, err := Connect(ctx, Options{URL: u, Job: "restart", Timeout: 60 * time.Second})
	if err != nil {
		stop()
		t.Fatal(err)
	}
	defer s.Close()
	must(t, s.Set(ctx, "before", []byte("kept")))
	if _, err := s.Add(ctx, "ctr", 41); err != nil {
		t.Fatal(err)
	}

	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	events, err := s.Watch(wctx, "w/", false)
	if err != nil {
		t.Fatal(err)
	}
	type res struct {
		v   []byte
		err error
	}
	blocked := make(chan res, 1)
	go func() {
		v, err := s.Get(ctx, "after")
		blocked <- res{v, err}
	}()
	time.Sleep(300 * time.Millisecond) // let the Get reach its watch
	stop()
	select {
	case r := <-blocked:
		t.Fatalf("Get returned during the outage: %q, %v", r.v, r.err)
	case <-time.After(500 * time.Millisecond):
	}
	// A write issued during the outage completes after the reconnect.
	during := make(chan error, 1)
	go func() { during <- s.Set(ctx, "during", []byte("outage")) }()
	time.Sleep(300 * time.Millisecond)
	_, stop2, err := StartEmbedded(EmbeddedOptions{StoreDir: dir, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer stop2()
	if err := <-during; err != nil {
		t.Fatalf("Set issued during the outage: %v", err)
	}
	if v, err := s.Get(ctx, "during"); err != nil || string(v) != "outage" {
		t.Fatalf("value set during the outage: %q, %v", v, err)
	}

	v, err := s.Get(ctx, "before")
	if err != nil || string(v) != "kept" {
		t.Fatalf("value written before the restart: %q, %v", v, err)
	}
	n, err := s.Add(ctx, "ctr", 1)
	if err != nil || n != 42 {
		t.Fatalf("counter after restart = %d, %v; want 42", n, err)
	}
	// A second connection sets the key the blocked Get waits for.
	s2, err := Connect(ctx, Options{URL: u, Job: "restart"})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	must(t, s2.Set(ctx, "after", []byte("set later")))
	select {
	case r := <-blocked:
		if r.err != nil || string(r.v) != "set later" {
			t.Fatalf("blocked Get returned %q, %v", r.v, r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Get blocked across the restart did not return 30 s after the key was set")
	}
	// The watch opened before the restart sees a change made after it.
	must(t, s2.Set(ctx, "w/x", []byte("1")))
	expectEvents(t, events, []store.Event{{Type: store.EventPut, Key: "w/x", Value: []byte("1")}})
}

// TestAddServiceDedup: a retried add request (same id) is answered with the
// first result and applied once; a store without the service falls back to
// compare-and-swap.
func TestAddServiceDedup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := newNATSStore(t, 10*time.Second)
	must(t, s.Set(ctx, "prime", nil)) // bucket exists
	req := []byte(`{"id":"fixed-id","key":"c","delta":5}`)
	var vals []string
	for range 2 {
		m, err := s.Conn().RequestWithContext(ctx, AddSubject(s.Bucket()), req)
		if err != nil {
			t.Fatal(err)
		}
		vals = append(vals, string(m.Data))
	}
	if vals[0] != vals[1] || !strings.Contains(vals[0], `"value":5`) {
		t.Fatalf("replies %q", vals)
	}
	n, err := s.Add(ctx, "c", 1)
	if err != nil || n != 6 {
		t.Fatalf("counter after a duplicated request = %d, %v; want 6", n, err)
	}
	must(t, s.Set(ctx, "text", []byte("x")))
	if _, err := s.Add(ctx, "text", 1); !errors.Is(err, store.ErrBadCounter) {
		t.Fatalf("Add on text via the service: %v", err)
	}

	// A plain JetStream server without the add service: Add falls back to
	// compare-and-swap after "no responders".
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("plain server not ready")
	}
	d, err := Connect(ctx, Options{URL: srv.ClientURL(), Job: "no-service"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for i := range 3 {
		if n, err := d.Add(ctx, "c", 2); err != nil || n != int64(2*(i+1)) {
			t.Fatalf("direct Add = %d, %v", n, err)
		}
	}
}

// TestOutageBounded: with the server gone for good, operations return a
// typed error within the store timeout instead of hanging.
func TestOutageBounded(t *testing.T) {
	u, stop, err := StartEmbedded(EmbeddedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := Connect(ctx, Options{URL: u, Job: "outage", Timeout: 2 * time.Second})
	if err != nil {
		stop()
		t.Fatal(err)
	}
	defer s.Close()
	must(t, s.Set(ctx, "k", []byte("v")))
	stop()
	start := time.Now()
	if err := s.Set(ctx, "k", []byte("w")); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Set during outage: %v, want ErrUnavailable", err)
	}
	if _, err := s.Add(ctx, "n", 1); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Add during outage: %v, want ErrUnavailable", err)
	}
	if _, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrTimeout) && !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Get during outage: %v, want ErrTimeout/ErrUnavailable", err)
	}
	if el := time.Since(start); el > 30*time.Second {
		t.Errorf("three ops took %v with a 2 s store timeout", el)
	}
}

// TestWaitIgnoresRejectedWrite: a write JetStream rejects still reaches
// subscribers of the key's subject; a waiting Get must not report it.
func TestWaitIgnoresRejectedWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	job := uniqueJob(t)
	waiter, err := Connect(ctx, Options{URL: testURL(t), Job: job})
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	writer, err := Connect(ctx, Options{URL: testURL(t), Job: job})
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	got := make(chan string, 1)
	go func() {
		v, err := waiter.Get(ctx, "k")
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		got <- string(v)
	}()
	time.Sleep(300 * time.Millisecond)
	bad := uint64(999)
	if _, err := writer.write(ctx, "set", "k", []byte("rejected"), false, &bad); !errors.Is(err, errConflict) {
		t.Fatalf("conditional write on an absent key: %v, want a conflict", err)
	}
	select {
	case v := <-got:
		t.Fatalf("Get returned %q after a rejected write", v)
	case <-time.After(500 * time.Millisecond):
	}
	must(t, writer.Set(ctx, "k", []byte("real")))
	select {
	case v := <-got:
		if v != "real" {
			t.Fatalf("Get = %q, want real", v)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Get did not return after the key was set")
	}
}
