package store

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestPrefixNestingAndClose(t *testing.T) {
	ctx := context.Background()
	m := NewMemStore()
	p := WithPrefix(WithPrefix(m, "a/"), "b/")
	if err := p.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if ok, _ := m.Check(ctx, []string{"a/b/k"}); !ok {
		t.Fatal("nested prefix did not write a/b/k")
	}
	ch, err := p.Watch(ctx, "", false)
	if err != nil {
		t.Fatal(err)
	}
	m.Set(ctx, "a/b/x", []byte("1"))
	m.Set(ctx, "a/c", []byte("no"))
	m.Set(ctx, "a/b/y", []byte("2"))
	for _, want := range []string{"x", "y"} {
		select {
		case ev := <-ch:
			if ev.Key != want {
				t.Fatalf("event key %q, want %q (prefix stripped)", ev.Key, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no event")
		}
	}
	p.Close()
	if _, ok := <-ch; ok {
		t.Fatal("watch open after the view closed")
	}
	if err := p.Set(ctx, "k", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Set on closed view: %v", err)
	}
	if v, err := m.Get(ctx, "a/b/k"); err != nil || string(v) != "v" {
		t.Fatalf("closing the view closed the inner store: %q, %v", v, err)
	}
}

func TestMemTimeoutOption(t *testing.T) {
	if d := NewMemStore().Timeout(); d != DefaultTimeout {
		t.Fatalf("default timeout %v", d)
	}
	if d := NewMemStore(WithMemTimeout(-1)).Timeout(); d != DefaultTimeout {
		t.Fatalf("non-positive timeout kept: %v", d)
	}
	s := NewMemStore(WithMemTimeout(50 * time.Millisecond))
	start := time.Now()
	_, err := s.Get(context.Background(), "nope")
	var te *TimeoutError
	if !errors.As(err, &te) || te.Keys[0] != "nope" || time.Since(start) < 50*time.Millisecond {
		t.Fatalf("Get: %v after %v", err, time.Since(start))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := NewMemStore().Get(ctx, "nope"); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Get past ctx deadline: %v, want ErrTimeout", err)
	}
}

func TestBarrierArgsAndReuse(t *testing.T) {
	ctx := context.Background()
	s := NewMemStore()
	for _, c := range []struct{ rank, ws int }{{-1, 2}, {2, 2}, {0, 0}} {
		if err := Barrier(ctx, s, "b", c.rank, c.ws, time.Second); err == nil {
			t.Errorf("Barrier(rank %d, world %d) accepted", c.rank, c.ws)
		}
	}
	if err := Barrier(ctx, s, "one", 0, 1, time.Second); err != nil {
		t.Fatalf("world of one: %v", err)
	}
	if err := Barrier(ctx, s, "one", 0, 1, time.Second); err == nil || !strings.Contains(err.Error(), "reused") {
		t.Fatalf("reused key: %v", err)
	}
}

func TestMemWatchSlowReader(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := NewMemStore()
	ch, _ := s.Watch(ctx, "k", false)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // writers never block on a watcher that is not reading
		defer wg.Done()
		for i := range 1000 {
			s.Add(ctx, "k", int64(i%3))
		}
	}()
	wg.Wait()
	n := 0
	for range 1000 {
		<-ch
		n++
	}
	if n != 1000 {
		t.Fatalf("%d events", n)
	}
}
