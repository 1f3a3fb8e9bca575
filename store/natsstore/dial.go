package natsstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"strings"
	"syscall"
	"time"

	"github.com/ranktree/ranktree/store"
)

// DefaultRefusedGrace is how long Dial keeps retrying while every attempt
// is refused outright (nothing listens at the URL) before it gives up,
// unless DialPolicy.WaitWhenRefused is set.
const DefaultRefusedGrace = 3 * time.Second

// DefaultLogEvery is the interval of Dial's "still retrying" warnings.
const DefaultLogEvery = 10 * time.Second

// DialPolicy says how long and how Dial retries an unreachable store.
// The zero value waits up to Options.Timeout, gives up after
// DefaultRefusedGrace of refused connections and warns every
// DefaultLogEvery.
type DialPolicy struct {
	// WaitFor bounds the whole dial; 0 means Options.Timeout (or
	// store.DefaultTimeout).
	WaitFor time.Duration
	// WaitWhenRefused keeps retrying a URL that refuses connections for the
	// whole of WaitFor (a server that has not started yet, e.g. node 0 of a
	// multi-node job started after this one). Off: refused connections for
	// RefusedGrace end the dial.
	WaitWhenRefused bool
	// RefusedGrace is how long refused connections are retried when
	// WaitWhenRefused is off; 0 means DefaultRefusedGrace.
	RefusedGrace time.Duration
	// LogEvery is the interval between warnings while retrying; 0 means
	// DefaultLogEvery. The first failed attempt is logged at once.
	LogEvery time.Duration
}

// DialError is returned by Dial when the store could not be reached: it
// names the URL (credentials redacted), how long Dial tried, how many
// attempts it made, whether it gave up early because every attempt was
// refused, and the last attempt's error. It unwraps to that error (so
// errors.Is(err, store.ErrUnavailable) holds for an unreachable server).
type DialError struct {
	URL      string        // the store URL, credentials redacted
	Waited   time.Duration // time spent retrying
	Attempts int           // connection attempts made
	Refused  bool          // gave up early: connections were refused (nothing listening)
	Last     error         // the last attempt's error
}

// Error implements error.
func (e *DialError) Error() string {
	why := "unreachable"
	if e.Refused {
		why = "refused connections"
	}
	return fmt.Sprintf("natsstore: store at %s %s for %v (%d attempts; set RANKTREE_STORE_WAIT=1 or --store-wait to wait for a server that starts later): last error: %v",
		e.URL, why, e.Waited.Round(time.Millisecond), e.Attempts, e.Last)
}

// Unwrap returns the last attempt's error.
func (e *DialError) Unwrap() error { return e.Last }

// Refused reports whether err is a refused TCP connection (nothing listens
// at the address).
func Refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// refusedError is a failed connect whose servers all refused the TCP
// connection; it unwraps to both.
type refusedError struct{ err, refused error }

func (e *refusedError) Error() string   { return fmt.Sprintf("%v: %v", e.err, e.refused) }
func (e *refusedError) Unwrap() []error { return []error{e.err, e.refused} }

// probeRefused dials every server of the comma-separated URL list once and
// returns the last refusal if every one refused the TCP connection, nil
// otherwise (one accepted, timed out, or failed another way).
func probeRefused(urls string) error {
	var last error
	for _, u := range strings.Split(urls, ",") {
		pu, err := neturl.Parse(strings.TrimSpace(u))
		if err != nil || pu.Host == "" {
			return nil
		}
		host := pu.Host
		if pu.Port() == "" {
			host = net.JoinHostPort(pu.Hostname(), "4222")
		}
		c, err := net.DialTimeout("tcp", host, time.Second)
		if err == nil {
			_ = c.Close()
			return nil
		}
		if !Refused(err) {
			return nil
		}
		last = err
	}
	return last
}

// withDefaults fills p's unset (≤ 0) durations: WaitFor with timeout,
// RefusedGrace with DefaultRefusedGrace, LogEvery with DefaultLogEvery.
func (p DialPolicy) withDefaults(timeout time.Duration) DialPolicy {
	if p.WaitFor <= 0 {
		p.WaitFor = timeout
	}
	if p.RefusedGrace <= 0 {
		p.RefusedGrace = DefaultRefusedGrace
	}
	if p.LogEvery <= 0 {
		p.LogEvery = DefaultLogEvery
	}
	return p
}

// Dial is Connect retried with backoff while the server is out of reach
// (store.ErrUnavailable), under policy. It logs the first failed attempt at
// once on opts.Log at warn level (URL, error, "retrying for up to X"), then
// every policy.LogEvery. Errors: a *DialError when WaitFor passes, or
// sooner when every attempt for RefusedGrace was refused and
// WaitWhenRefused is off; Connect's non-retryable errors as they are; ctx's
// error if ctx ends first (wrapped in a *DialError when an attempt failed).
func Dial(ctx context.Context, opts Options, policy DialPolicy) (*Store, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	policy = policy.withDefaults(opts.Timeout)
	waitFor, grace, every := policy.WaitFor, policy.RefusedGrace, policy.LogEvery
	url := redactURL(opts.URL)
	start := time.Now()
	deadline := start.Add(waitFor)
	var refusedSince time.Time
	var lastLog time.Time
	wait := 100 * time.Millisecond
	for try := 1; ; try++ {
		st, err := Connect(ctx, opts)
		if err == nil {
			if try > 1 {
				opts.Log.Info().Str("url", url).Int("attempts", try).Dur("waited", time.Since(start)).Msg("store reachable")
			}
			return st, nil
		}
		if !errors.Is(err, store.ErrUnavailable) {
			return nil, err
		}
		if perr := probeRefused(opts.URL); perr != nil {
			// nats.go reports "no servers available"; say why.
			err = &refusedError{err: err, refused: perr}
		}
		now := time.Now()
		fail := func(refused bool) error {
			return &DialError{URL: url, Waited: now.Sub(start), Attempts: try, Refused: refused, Last: err}
		}
		if Refused(err) {
			if refusedSince.IsZero() {
				refusedSince = now
			}
		} else {
			refusedSince = time.Time{}
		}
		switch {
		case !now.Before(deadline):
			return nil, fail(false)
		case !policy.WaitWhenRefused && !refusedSince.IsZero() && now.Sub(refusedSince) >= grace:
			return nil, fail(true)
		}
		if try == 1 {
			limit := waitFor
			if !policy.WaitWhenRefused && Refused(err) {
				limit = grace
			}
			opts.Log.Warn().Str("url", url).Err(err).Str("retrying_for", limit.String()).
				Msgf("store not reachable, retrying for up to %v", limit)
			lastLog = now
		} else if now.Sub(lastLog) >= every {
			opts.Log.Warn().Str("url", url).Err(err).Int("attempts", try).Dur("waited", now.Sub(start)).
				Str("retrying_for", time.Until(deadline).Round(time.Second).String()).
				Msgf("store still not reachable, retrying for up to %v more", time.Until(deadline).Round(time.Second))
			lastLog = now
		}
		d := min(wait, time.Until(deadline))
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, &DialError{URL: url, Waited: time.Since(start), Attempts: try, Last: fmt.Errorf("%w (last attempt: %v)", ctx.Err(), err)}
		case <-t.C:
		}
		if wait < 2*time.Second {
			wait *= 2
		}
	}
}
