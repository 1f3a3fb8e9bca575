package natsstore

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/store"
)

// Options configures Connect. URL and Job are required; the credential
// fields are optional and combine as NATS allows (token, or user/password,
// or an nkey seed file, or a creds file; TLS independently).
type Options struct {
	URL string // NATS server URL(s), comma-separated, e.g. "nats://127.0.0.1:4222"
	Job string // job name; selects the KV bucket (BucketForJob)

	Credentials // optional; see Credentials

	// Timeout is the store timeout for Get and Wait and the bound on every
	// other operation during an outage; default store.DefaultTimeout (5 min).
	Timeout time.Duration
	Name    string // NATS connection name (shown by the server's monitoring)
	// DirectAdd makes every Add a compare-and-swap from this client, never a
	// request to the add service (ServeAdds). For tests and benchmarks.
	DirectAdd bool
	Log       zerolog.Logger // connection events (disconnect, reconnect, errors)
}

// validate fills defaults and rejects unusable combinations.
func (o *Options) validate() error {
	if o.URL == "" {
		return errors.New("natsstore: Options.URL is empty")
	}
	if o.Job == "" {
		return errors.New("natsstore: Options.Job is empty")
	}
	if o.Timeout < 0 {
		return fmt.Errorf("natsstore: Options.Timeout %v is negative", o.Timeout)
	}
	if o.Timeout == 0 {
		o.Timeout = store.DefaultTimeout
	}
	if err := o.Credentials.Check(); err != nil {
		return err
	}
	if o.Name == "" {
		o.Name = "ranktree/" + o.Job
	}
	return nil
}

// natsOptions turns Options into nats.go connection options: unlimited
// reconnects with jitter, so the connection survives a NATS restart.
func (o *Options) natsOptions() ([]nats.Option, error) {
	log := o.Log
	nopts := []nats.Option{
		nats.Name(o.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		nats.Timeout(5 * time.Second),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err == nil || nc.IsClosed() {
				// Our own Close: not worth a warning.
				log.Debug().Msg("NATS connection closed")
				return
			}
			log.Warn().Err(err).Msg("NATS disconnected")
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info().Str("url", nc.ConnectedUrlRedacted()).Msg("NATS reconnected")
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			ev := log.Debug().Err(err)
			if sub != nil {
				ev = ev.Str("subject", sub.Subject)
			}
			ev.Msg("NATS async error")
		}),
	}
	creds, err := o.Credentials.NATSOptions()
	if err != nil {
		return nil, err
	}
	return append(nopts, creds...), nil
}

// Connect dials NATS with opts, creates the job's KV bucket if absent and
// returns a Store that owns the connection (Close closes it). Errors: a
// server out of reach is store.ErrUnavailable (worth retrying); a missing
// credential or certificate file, credentials the server rejects, or a
// server certificate that does not verify is a plain error naming the
// cause (retrying will not help).
func Connect(ctx context.Context, opts Options) (*Store, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	nopts, err := opts.natsOptions()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(opts.URL, nopts...)
	if err != nil {
		if rejected(err) {
			// Retrying will not help: not store.ErrUnavailable.
			return nil, fmt.Errorf("natsstore: connecting to %s: credentials or certificates rejected: %w", redactURL(opts.URL), err)
		}
		return nil, &store.UnavailableError{Op: "connect", Err: fmt.Errorf("natsstore: connecting to %s: %w", redactURL(opts.URL), err)}
	}
	s, err := newStore(ctx, nc, opts.Job, opts.Timeout, opts.Log, true)
	if err != nil {
		nc.Close()
		return nil, err
	}
	s.directAdd = opts.DirectAdd
	return s, nil
}

// NewFromConn returns a Store for job over an existing connection, so one
// process can share a single NATS connection between the store and event
// publishing. The caller keeps ownership: Store.Close does not close nc.
// timeout 0 means store.DefaultTimeout.
func NewFromConn(ctx context.Context, nc *nats.Conn, job string, timeout time.Duration) (*Store, error) {
	if nc == nil {
		return nil, errors.New("natsstore: NewFromConn: nil connection")
	}
	if job == "" {
		return nil, errors.New("natsstore: NewFromConn: empty job")
	}
	if timeout < 0 {
		return nil, fmt.Errorf("natsstore: NewFromConn: negative timeout %v", timeout)
	}
	if timeout == 0 {
		timeout = store.DefaultTimeout
	}
	return newStore(ctx, nc, job, timeout, zerolog.Nop(), false)
}

// rejected reports whether a failed connect is a verdict on our
// credentials (the server's authorization violation, expired or revoked
// credentials) or on the server's certificate (it does not verify against
// our CA), rather than the server being out of reach. A server that turns
// down our client certificate during the TLS handshake is not recognised:
// the client sees anything from a TLS alert to a broken pipe, so that stays
// store.ErrUnavailable.
func rejected(err error) bool {
	if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked) {
		return true
	}
	var (
		ua x509.UnknownAuthorityError
		ci x509.CertificateInvalidError
		hn x509.HostnameError
	)
	return errors.As(err, &ua) || errors.As(err, &ci) || errors.As(err, &hn)
}

// redactURL hides credentials embedded in a (comma-separated) URL list.
func redactURL(u string) string {
	parts := strings.Split(u, ",")
	for i, p := range parts {
		if pu, err := url.Parse(strings.TrimSpace(p)); err == nil && pu.User != nil {
			pu.User = url.User("***")
			parts[i] = pu.String()
		}
	}
	return strings.Join(parts, ",")
}
