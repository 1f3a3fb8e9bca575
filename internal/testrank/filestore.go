package testrank

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ranktree/ranktree/store"
)

// FileStore is a store.Store over a directory shared by the rank processes
// of a multi-process test (each key one file; read-modify-write operations
// under a lock directory). It polls, so it is for tests only.
type FileStore struct {
	dir     string
	timeout time.Duration

	mu     sync.Mutex
	closed bool
}

// NewFileStore opens (creating) a FileStore in dir with the given default
// timeout for Get and Wait.
func NewFileStore(dir string, timeout time.Duration) (*FileStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &FileStore{dir: dir, timeout: timeout}, nil
}

const poll = 2 * time.Millisecond

func (s *FileStore) path(key string) string {
	return filepath.Join(s.dir, "k"+hex.EncodeToString([]byte(key)))
}

func (s *FileStore) check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.ErrClosed
	}
	return nil
}

// lock takes the store-wide lock (a directory), for ctx's lifetime at most.
func (s *FileStore) lock(ctx context.Context) (func(), error) {
	l := filepath.Join(s.dir, "lock")
	for {
		if err := os.Mkdir(l, 0o700); err == nil {
			return func() { os.Remove(l) }, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(poll / 2):
		}
	}
}

func (s *FileStore) write(key string, value []byte) error {
	tmp := s.path(key) + ".tmp" + strconv.Itoa(os.Getpid())
	if err := os.WriteFile(tmp, value, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, s.path(key))
}

func (s *FileStore) read(key string) ([]byte, bool) {
	b, err := os.ReadFile(s.path(key))
	if err != nil {
		return nil, false
	}
	return b, true
}

// Set implements store.Store.
func (s *FileStore) Set(_ context.Context, key string, value []byte) error {
	if err := s.check(); err != nil {
		return err
	}
	return s.write(key, value)
}

// Get implements store.Store.
func (s *FileStore) Get(ctx context.Context, key string) ([]byte, error) {
	if err := s.Wait(ctx, []string{key}, 0); err != nil {
		return nil, err
	}
	b, _ := s.read(key)
	return b, nil
}

// Add implements store.Store.
func (s *FileStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	unlock, err := s.lock(ctx)
	if err != nil {
		return 0, err
	}
	defer unlock()
	var v int64
	if b, ok := s.read(key); ok {
		if v, err = strconv.ParseInt(string(b), 10, 64); err != nil {
			return 0, fmt.Errorf("FileStore.Add: key %q holds %q, not a counter", key, b)
		}
	}
	v += delta
	return v, s.write(key, []byte(strconv.FormatInt(v, 10)))
}

// CompareAndSet implements store.Store.
func (s *FileStore) CompareAndSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	unlock, err := s.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	cur, ok := s.read(key)
	if (len(expected) == 0 && !ok) || (ok && len(expected) != 0 && bytes.Equal(cur, expected)) {
		return desired, s.write(key, desired)
	}
	return cur, nil
}

// Delete implements store.Store.
func (s *FileStore) Delete(_ context.Context, key string) (bool, error) {
	if err := s.check(); err != nil {
		return false, err
	}
	err := os.Remove(s.path(key))
	return err == nil, nil
}

// Check implements store.Store.
func (s *FileStore) Check(_ context.Context, keys []string) (bool, error) {
	if err := s.check(); err != nil {
		return false, err
	}
	for _, k := range keys {
		if _, err := os.Stat(s.path(k)); err != nil {
			return false, nil
		}
	}
	return true, nil
}

// Wait implements store.Store.
func (s *FileStore) Wait(ctx context.Context, keys []string, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = s.timeout
	}
	deadline := time.Now().Add(timeout)
	for {
		ok, err := s.Check(ctx, keys)
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: waiting %v for keys %q", store.ErrTimeout, timeout, keys)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(poll):
		}
	}
}

// Watch implements store.Store by polling the directory.
func (s *FileStore) Watch(ctx context.Context, prefix string, replay bool) (<-chan store.Event, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	ch := make(chan store.Event, 64)
	snap := s.snapshot(prefix)
	go func() {
		defer close(ch)
		prev := map[string][]byte{}
		if !replay {
			prev = snap
		}
		for {
			cur := s.snapshot(prefix)
			for k, v := range cur {
				if old, ok := prev[k]; !ok || !bytes.Equal(old, v) {
					select {
					case ch <- store.Event{Type: store.EventPut, Key: k, Value: v}:
					case <-ctx.Done():
						return
					}
				}
			}
			for k := range prev {
				if _, ok := cur[k]; !ok {
					select {
					case ch <- store.Event{Type: store.EventDelete, Key: k}:
					case <-ctx.Done():
						return
					}
				}
			}
			prev = cur
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * poll):
			}
			if s.check() != nil {
				return
			}
		}
	}()
	return ch, nil
}

func (s *FileStore) snapshot(prefix string) map[string][]byte {
	out := map[string][]byte{}
	ents, _ := os.ReadDir(s.dir)
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, "k") || strings.Contains(name, ".tmp") {
			continue
		}
		kb, err := hex.DecodeString(name[1:])
		if err != nil || !strings.HasPrefix(string(kb), prefix) {
			continue
		}
		if v, ok := s.read(string(kb)); ok {
			out[string(kb)] = v
		}
	}
	return out
}

// NumKeys implements store.Store.
func (s *FileStore) NumKeys(context.Context) (int64, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	return int64(len(s.snapshot(""))), nil
}

// Timeout implements store.Store.
func (s *FileStore) Timeout() time.Duration { return s.timeout }

// Close implements store.Store.
func (s *FileStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

var _ store.Store = (*FileStore)(nil)
