package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// BindError says a metrics address could not be listened on; the job does
// not start (a metrics endpoint the operator asked for is not optional).
type BindError struct {
	Addr string // the address as given
	Err  error
}

// Error implements error.
func (e *BindError) Error() string {
	return fmt.Sprintf("metrics: cannot listen on %q: %v", e.Addr, e.Err)
}

// Unwrap returns the listen error.
func (e *BindError) Unwrap() error { return e.Err }

// Server serves /metrics for a Gatherer on one address.
type Server struct {
	ln  net.Listener
	srv *http.Server
}

// Serve listens on addr (host:port; ":0" or port 0 picks a free port) at
// once, so a bad or busy address is a *BindError before anything starts,
// and serves g at /metrics in the background.
func Serve(addr string, g prometheus.Gatherer) (*Server, error) {
	if addr == "" {
		return nil, &BindError{Addr: addr, Err: errors.New("empty address")}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, &BindError{Addr: addr, Err: err}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	s := &Server{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the address actually listened on (host:port).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops serving, waiting up to 2 s for scrapes in progress.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}
