package natsstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// EmbeddedMaxPayload is the largest message the embedded server accepts
// (8 MiB): a 1 MiB store value plus headers fits with room to spare.
const EmbeddedMaxPayload = 8 << 20

// EmbeddedOptions configures StartEmbedded.
type EmbeddedOptions struct {
	Host     string // listen address; default 127.0.0.1
	Port     int    // client port; 0 picks a random free port
	StoreDir string // JetStream file storage; "" = a temp dir removed on shutdown
	// Token, or User and Password, require clients to authenticate.
	Token, User, Password string
	Log                   zerolog.Logger // server notices and errors (default: discarded)
}

// StartEmbedded runs an in-process NATS server with JetStream (file
// storage) so a single-node job needs nothing installed; rankrunner and
// tests use it. It returns the client URL ("nats://host:port") and a
// shutdown function that stops the server, waits for it and removes a temp
// store dir. A temp store dir left by a process that died without its
// shutdown (kill -9) is removed by the next StartEmbedded on the machine. Restarting with the same Port and StoreDir keeps the KV data.
// The server also runs the add service (ServeAdds) on an in-process
// connection, as torchrun's agent hosts the TCPStore server.
func StartEmbedded(opts EmbeddedOptions) (url string, shutdown func(), err error) {
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.Port < 0 || opts.Port > 65535 {
		return "", nil, fmt.Errorf("natsstore: embedded server: port %d out of range", opts.Port)
	}
	if opts.Token != "" && (opts.User != "" || opts.Password != "") {
		return "", nil, errors.New("natsstore: embedded server: set either Token or User/Password, not both")
	}
	dir, tmp := opts.StoreDir, false
	if dir == "" {
		removeStaleStoreDirs(os.TempDir(), opts.Log)
		if dir, err = os.MkdirTemp("", fmt.Sprintf("%s%d-*", tempDirPrefix, os.Getpid())); err != nil {
			return "", nil, fmt.Errorf("natsstore: embedded server: %w", err)
		}
		tmp = true
	}
	s, err := server.NewServer(embeddedServerOptions(opts, dir))
	if err != nil {
		if tmp {
			os.RemoveAll(dir)
		}
		return "", nil, fmt.Errorf("natsstore: embedded server: %w", err)
	}
	s.SetLoggerV2(&serverLog{log: opts.Log}, false, false, false)
	s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		if tmp {
			os.RemoveAll(dir)
		}
		return "", nil, fmt.Errorf("natsstore: embedded server on %s:%d not ready after 30s", opts.Host, opts.Port)
	}
	url = s.ClientURL()
	// The add service rides on an in-process connection.
	copts := []nats.Option{nats.InProcessServer(s), nats.Name("ranktree-add-service"), nats.MaxReconnects(-1)}
	if opts.Token != "" {
		copts = append(copts, nats.Token(opts.Token))
	}
	if opts.User != "" {
		copts = append(copts, nats.UserInfo(opts.User, opts.Password))
	}
	nc, err := nats.Connect(url, copts...)
	var stopAdds func()
	if err == nil {
		stopAdds, err = ServeAdds(nc, opts.Log)
	}
	if err != nil {
		if nc != nil {
			nc.Close()
		}
		s.Shutdown()
		if tmp {
			os.RemoveAll(dir)
		}
		return "", nil, fmt.Errorf("natsstore: embedded server: starting the add service: %w", err)
	}
	opts.Log.Info().Str("url", url).Str("store_dir", dir).Msg("embedded NATS server started")
	shutdown = func() {
		stopAdds()
		nc.Close()
		s.Shutdown()
		s.WaitForShutdown()
		if tmp {
			os.RemoveAll(dir)
		}
	}
	return url, shutdown, nil
}

// embeddedServerOptions is the embedded server's configuration: opts'
// address and credentials, JetStream stored in dir.
func embeddedServerOptions(opts EmbeddedOptions, dir string) *server.Options {
	port := opts.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return &server.Options{
		ServerName:    "ranktree-embedded",
		Host:          opts.Host,
		Port:          port,
		JetStream:     true,
		StoreDir:      dir,
		MaxPayload:    EmbeddedMaxPayload,
		NoSigs:        true,
		Authorization: opts.Token,
		Username:      opts.User,
		Password:      opts.Password,
		// Every rank blocked in Get/Wait holds one KV watch (an ephemeral
		// consumer); lift the default cap of 1000 consumers per stream.
		JetStreamLimits: server.JSLimitOpts{DefaultMaxConsumers: -1},
	}
}

// serverLog adapts nats-server's Logger to zerolog.
type serverLog struct{ log zerolog.Logger }

func (l *serverLog) Noticef(format string, v ...any) {
	l.log.Debug().Str("component", "nats-server").Msgf(format, v...)
}
func (l *serverLog) Warnf(format string, v ...any) {
	l.log.Warn().Str("component", "nats-server").Msgf(format, v...)
}
func (l *serverLog) Fatalf(format string, v ...any) {
	l.log.Error().Str("component", "nats-server").Msgf(format, v...)
}
func (l *serverLog) Errorf(format string, v ...any) {
	l.log.Error().Str("component", "nats-server").Msgf(format, v...)
}
func (l *serverLog) Debugf(format string, v ...any) {
	l.log.Trace().Str("component", "nats-server").Msgf(format, v...)
}
func (l *serverLog) Tracef(format string, v ...any) {
	l.log.Trace().Str("component", "nats-server").Msgf(format, v...)
}

// tempDirPrefix starts the name of a temp store dir; the creating
// process's PID follows ("ranktree-nats-<pid>-<random>").
const tempDirPrefix = "ranktree-nats-"

// removeStaleStoreDirs removes the temp store dirs under tmp whose creating
// process is gone (a rankrunner killed by SIGKILL cannot remove its own),
// so that no job leaves more than its own run's dir behind. Dirs of live
// processes, and names it does not recognise, are kept.
func removeStaleStoreDirs(tmp string, log zerolog.Logger) {
	ents, err := os.ReadDir(tmp)
	if err != nil {
		return
	}
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), tempDirPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			continue // alive (or not ours to judge)
		}
		path := filepath.Join(tmp, e.Name())
		if err := os.RemoveAll(path); err == nil {
			log.Info().Str("dir", path).Int("pid", pid).Msg("removed the store dir of an embedded NATS server whose process is gone")
		}
	}
}
