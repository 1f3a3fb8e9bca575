package natsstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/store"
)

// lockedBuf is a bytes.Buffer safe for a logger and a reader.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// closedPort returns a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	return port
}

// TestDialRefusedFailsFast: a URL that refuses connections ends Dial after
// the refused grace, long before the store timeout, with a *DialError
// naming the URL and the refused connection; the first failure is logged
// at once with "retrying for up to".
func TestDialRefusedFailsFast(t *testing.T) {
	url := fmt.Sprintf("nats://127.0.0.1:%d", closedPort(t))
	var logs lockedBuf
	start := time.Now()
	_, err := Dial(context.Background(), Options{URL: url, Job: "dial", Timeout: time.Minute, Log: zerolog.New(&logs)},
		DialPolicy{RefusedGrace: 500 * time.Millisecond})
	took := time.Since(start)
	var de *DialError
	if !errors.As(err, &de) {
		t.Fatalf("err = %v (%T), want *DialError", err, err)
	}
	if !de.Refused || de.URL != url || !Refused(err) || !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("DialError %+v: want Refused, URL %s, unwrapping to ECONNREFUSED and store.ErrUnavailable", de, url)
	}
	if !strings.Contains(err.Error(), url) || !strings.Contains(err.Error(), "refused") {
		t.Errorf("message %q does not name the URL and the refusal", err)
	}
	if took > 10*time.Second {
		t.Errorf("took %v, want about the 500ms grace", took)
	}
	if l := logs.String(); !strings.Contains(l, "retrying for up to 500ms") || !strings.Contains(l, url) {
		t.Errorf("first failure not logged with URL and retry bound: %q", l)
	}
}

// TestDialWaitWhenRefused: with WaitWhenRefused, Dial keeps retrying for
// WaitFor, warns periodically, and connects to a server that starts late.
func TestDialWaitWhenRefused(t *testing.T) {
	port := closedPort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	var logs lockedBuf
	// Nothing ever listens: fails after WaitFor, not after the grace.
	start := time.Now()
	_, err := Dial(context.Background(), Options{URL: url, Job: "dial", Timeout: time.Minute, Log: zerolog.New(&logs)},
		DialPolicy{WaitFor: 1500 * time.Millisecond, WaitWhenRefused: true, RefusedGrace: 100 * time.Millisecond, LogEvery: 300 * time.Millisecond})
	var de *DialError
	if !errors.As(err, &de) || de.Refused || de.Attempts < 2 {
		t.Fatalf("err = %v, want a *DialError after several attempts, not a refused give-up", err)
	}
	if took := time.Since(start); took < 1400*time.Millisecond {
		t.Errorf("gave up after %v, want the 1.5s WaitFor", took)
	}
	if n := strings.Count(logs.String(), "store still not reachable"); n < 1 {
		t.Errorf("no periodic warning in %q", logs.String())
	}
	// A server that starts while Dial waits is reached.
	go func() {
		time.Sleep(700 * time.Millisecond)
		_, stop, err := StartEmbedded(EmbeddedOptions{Port: port, StoreDir: t.TempDir()})
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(stop)
	}()
	st, err := Dial(context.Background(), Options{URL: url, Job: "dial", Timeout: time.Minute, Log: zerolog.New(&logs)},
		DialPolicy{WaitFor: 30 * time.Second, WaitWhenRefused: true})
	if err != nil {
		t.Fatalf("Dial to a late server: %v", err)
	}
	_ = st.Close()
}
