package store

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrBadCounter is returned by Add when the key holds a value that is not a
// decimal int64 (c10d's add fails the same way on a non-integer value).
var ErrBadCounter = errors.New("store: value is not an int64 counter")

// DefaultTimeout is the store timeout used when none is configured: c10d's
// default store timeout (kDefaultStoreTimeout, 300 s).
const DefaultTimeout = 5 * time.Minute

// TimeoutError is returned by Get and Wait when keys did not appear in time.
// It unwraps to ErrTimeout; its text contains "timeout" and the keys.
type TimeoutError struct {
	Op      string        // "get" or "wait"
	Keys    []string      // the keys still missing when the time ran out
	Timeout time.Duration // the bound that expired (store timeout or ctx deadline)
}

// Error implements error: the message names what failed and why.
func (e *TimeoutError) Error() string {
	return fmt.Sprintf("store: timeout after %v in %s waiting for keys [%s]", e.Timeout, e.Op, strings.Join(quoteAll(e.Keys), " "))
}

// Unwrap returns ErrTimeout.
func (e *TimeoutError) Unwrap() error { return ErrTimeout }

// CounterError is returned by Add when Key holds a non-integer value. It
// unwraps to ErrBadCounter.
type CounterError struct {
	Key   string
	Value []byte
}

// Error implements error: the message names what failed and why.
func (e *CounterError) Error() string {
	v := e.Value
	if len(v) > 32 {
		v = v[:32]
	}
	return fmt.Sprintf("store: add on key %q: value %q is not an int64 counter", e.Key, v)
}

// Unwrap returns ErrBadCounter.
func (e *CounterError) Unwrap() error { return ErrBadCounter }

func quoteAll(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = fmt.Sprintf("%q", k)
	}
	return out
}

// UnavailableError is returned when the backing service could not complete
// Op on Key within the operation's bound (an outage longer than the store
// timeout, or a write whose outcome could not be determined). It unwraps to
// ErrUnavailable and to the underlying error. The stored value is never
// misreported: the caller simply does not know it.
type UnavailableError struct {
	Op  string // "set", "add", "get", ...
	Key string
	Err error
}

// Error implements error: the message names what failed and why.
func (e *UnavailableError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("store: %s: unavailable: %v", e.Op, e.Err)
	}
	return fmt.Sprintf("store: %s of key %q: unavailable: %v", e.Op, e.Key, e.Err)
}

// Unwrap returns ErrUnavailable and the underlying error.
func (e *UnavailableError) Unwrap() []error { return []error{ErrUnavailable, e.Err} }
