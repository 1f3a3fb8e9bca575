package launcher

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/store/natsstore"
)

// startServer serves the job's embedded NATS server (JetStream) at
// cfg.NATSListen, protected by the token or user/password credentials.
func startServer(cfg *Config, log zerolog.Logger) (string, func(), error) {
	host, portStr, err := net.SplitHostPort(cfg.NATSListen)
	if err != nil {
		return "", nil, &FlagError{Flag: "--nats-listen", Msg: err.Error()}
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return "", nil, &FlagError{Flag: "--nats-listen", Msg: fmt.Sprintf("port %q is not a number", portStr)}
	}
	if cfg.Creds.NKeyFile != "" || cfg.Creds.CredsFile != "" {
		log.Warn().Msg("the embedded NATS server checks only token and user/password credentials")
	}
	url, shutdown, err := natsstore.StartEmbedded(natsstore.EmbeddedOptions{
		Host: host, Port: port, StoreDir: cfg.StoreDir,
		Token: cfg.Creds.Token, User: cfg.Creds.User, Password: cfg.Creds.Password,
		Log: log,
	})
	if err != nil {
		return "", nil, fmt.Errorf("launcher: embedded NATS server at %s: %w", cfg.NATSListen, err)
	}
	return url, shutdown, nil
}

// connectStore connects to the job's store, retrying while it is out of
// reach for up to cfg.StoreTimeout (node 0's server may start after this
// runner), or for natsstore.DefaultRefusedGrace of refused connections
// unless cfg.StoreWait. The first failure is logged at once, then every
// natsstore.DefaultLogEvery; the error is a *natsstore.DialError naming
// the URL and the last error.
func connectStore(ctx context.Context, cfg *Config, url, id string, log zerolog.Logger) (store.Store, error) {
	opts := natsstore.Options{
		URL: url, Job: cfg.JobID,
		Credentials: natsstore.Credentials(cfg.Creds),
		Timeout:     cfg.StoreTimeout, Name: "rankrunner/" + cfg.JobID + "/" + id, Log: log,
	}
	st, err := natsstore.Dial(ctx, opts, natsstore.DialPolicy{WaitFor: cfg.StoreTimeout, WaitWhenRefused: cfg.StoreWait})
	if err != nil {
		return nil, fmt.Errorf("launcher: connecting the job store: %w", err)
	}
	return st, nil
}
