package launcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

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

// connectStore connects to the job's store, retrying until
// cfg.StoreTimeout passes (node 0's server may start after this runner).
func connectStore(ctx context.Context, cfg *Config, url, id string, log zerolog.Logger) (store.Store, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.StoreTimeout)
	defer cancel()
	opts := natsstore.Options{
		URL: url, Job: cfg.JobID,
		Credentials: natsstore.Credentials(cfg.Creds),
		Timeout:     cfg.StoreTimeout, Name: "rankrunner/" + cfg.JobID + "/" + id, Log: log,
	}
	wait := 100 * time.Millisecond
	for try := 1; ; try++ {
		st, err := natsstore.Connect(ctx, opts)
		if err == nil {
			return st, nil
		}
		if !errors.Is(err, store.ErrUnavailable) {
			return nil, fmt.Errorf("launcher: store at %s: %w", url, err)
		}
		log.Debug().Err(err).Int("try", try).Msg("store not reachable yet")
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("launcher: store at %s unreachable after %v: %w", url, cfg.StoreTimeout, err)
		case <-time.After(wait):
		}
		if wait < 2*time.Second {
			wait *= 2
		}
	}
}
