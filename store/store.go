// Package store is ranktree's key-value store: rendezvous, the NCCL unique
// ID, counters, barriers and abort signals, with the semantics of c10d's
// Store (TCPStore, HashStore, PrefixStore).
package store

import (
	"context"
	"errors"
	"time"
)

// Errors returned by Store implementations.
var (
	// ErrTimeout is returned (wrapped, with the key in the text) by Get and
	// Wait when the keys do not appear before the store timeout or deadline.
	ErrTimeout = errors.New("store: timeout")
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("store: closed")
	// ErrNotFound is returned by Delete-like lookups of a missing key where
	// the method does not block (never by Get, which waits).
	ErrNotFound = errors.New("store: key not found")
	// ErrUnavailable is returned when the backing service (NATS) cannot be
	// reached within the operation's bound; the value stored is unknown to
	// the caller but never wrongly reported.
	ErrUnavailable = errors.New("store: unavailable")
)

// EventType tells a watcher what happened to a key.
type EventType uint8

// Watch event kinds.
const (
	EventPut EventType = iota + 1
	EventDelete
)

// Event is one change seen by Watch. Key is the key as the caller spelled
// it (without the watcher's prefix stripped: the full key under the store
// the watcher was created on).
type Event struct {
	Type  EventType
	Key   string
	Value []byte // nil for deletes
}

// Store is a c10d-style key-value store shared by all ranks of a job.
// Keys are arbitrary strings; values arbitrary bytes (at least 1 MiB).
// Implementations are safe for concurrent use.
type Store interface {
	// Set stores value under key, replacing any value.
	Set(ctx context.Context, key string, value []byte) error
	// Get returns key's value, blocking until the key exists, the store
	// timeout passes or ctx ends. A timeout returns an error wrapping
	// ErrTimeout whose text contains "timeout" and the key.
	Get(ctx context.Context, key string) ([]byte, error)
	// Add atomically adds delta to the int64 counter at key (created at 0)
	// and returns the new value. The counter is stored as decimal text.
	Add(ctx context.Context, key string, delta int64) (int64, error)
	// CompareAndSet sets key to desired if its value equals expected; an
	// empty expected means "only if absent". It returns the value now
	// stored (desired on success, the current value otherwise; c10d
	// compare_set).
	CompareAndSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error)
	// Delete removes key and reports whether it existed.
	Delete(ctx context.Context, key string) (bool, error)
	// Check reports whether every key exists, without waiting.
	Check(ctx context.Context, keys []string) (bool, error)
	// Wait blocks until every key exists, timeout passes (0: the store
	// timeout) or ctx ends; a timeout wraps ErrTimeout and names the keys.
	Wait(ctx context.Context, keys []string, timeout time.Duration) error
	// Watch pushes puts and deletes of keys starting with prefix until ctx
	// ends or the store closes, then closes the channel. Changes already
	// present at the call are not replayed unless replay is true.
	Watch(ctx context.Context, prefix string, replay bool) (<-chan Event, error)
	// NumKeys is the number of keys in the store (c10d num_keys).
	NumKeys(ctx context.Context) (int64, error)
	// Timeout is the store's default timeout for Get and Wait.
	Timeout() time.Duration
	// Close releases the store's resources; later calls fail with ErrClosed.
	Close() error
}
