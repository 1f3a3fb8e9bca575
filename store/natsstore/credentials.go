package natsstore

import (
	"errors"
	"fmt"
	"os"

	"github.com/nats-io/nats.go"
)

// Credentials are a NATS client's credentials, as nats.go takes them.
// Empty fields are unused; they combine as NATS allows (a token, or a
// user and password, or an nkey seed file, or a JWT creds file; TLS
// independently of all of them). ranktree's ranks read them from the
// RANKTREE_NATS_* variables and rankrunner from its --nats-* flags.
type Credentials struct {
	Token     string // auth token
	User      string // user name (with Password)
	Password  string
	NKeyFile  string // path of an nkey seed file
	CredsFile string // path of a JWT creds file
	TLSCA     string // PEM CA bundle to verify the server
	TLSCert   string // PEM client certificate (with TLSKey)
	TLSKey    string
}

// Check rejects combinations no server accepts: a password without a user,
// a TLS certificate without its key or the other way round. The error names
// the fields.
func (c Credentials) Check() error {
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("natsstore: TLSCert and TLSKey must be set together")
	}
	if c.Password != "" && c.User == "" {
		return errors.New("natsstore: Password set without User")
	}
	return nil
}

// NATSOptions returns the nats.go connect options for the credentials. It
// reads the nkey seed file and checks that every other named file can be
// opened: nats.go reads those only while dialling, where a missing file
// would look like a server out of reach. Errors name the file and are
// permanent (retrying will not help).
func (c Credentials) NATSOptions() ([]nats.Option, error) {
	var opts []nats.Option
	if c.Token != "" {
		opts = append(opts, nats.Token(c.Token))
	}
	if c.User != "" {
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	}
	if c.NKeyFile != "" {
		opt, err := nats.NkeyOptionFromSeed(c.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("natsstore: nkey seed file %q: %w", c.NKeyFile, err)
		}
		opts = append(opts, opt)
	}
	for _, f := range [...]struct{ what, path string }{
		{"creds file", c.CredsFile}, {"TLS CA file", c.TLSCA},
		{"TLS certificate file", c.TLSCert}, {"TLS key file", c.TLSKey},
	} {
		if f.path == "" {
			continue
		}
		fh, err := os.Open(f.path)
		if err != nil {
			return nil, fmt.Errorf("natsstore: %s %q: %w", f.what, f.path, err)
		}
		fh.Close()
	}
	if c.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	}
	if c.TLSCA != "" {
		opts = append(opts, nats.RootCAs(c.TLSCA))
	}
	if c.TLSCert != "" {
		opts = append(opts, nats.ClientCert(c.TLSCert, c.TLSKey))
	}
	return opts, nil
}
