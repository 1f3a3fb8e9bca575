// Package natsauth carries the NATS credentials rankrunner passes to its
// ranks and uses for its own connections (the launcher's store, `events`,
// `diagnose`). The credential kinds are those of nats.go: token,
// user/password, NKey seed file, .creds file (JWT), and TLS (CA, client
// certificate and key).
package natsauth

import (
	"fmt"
	"os"

	"github.com/nats-io/nats.go"

	"github.com/ranktree/ranktree"
	"github.com/ranktree/ranktree/store/natsstore"
)

// Credentials are the NATS credentials of a job, field for field those of
// natsstore.Credentials (convert with natsstore.Credentials(c)), with the
// flag and environment handling rankrunner needs. Empty fields are unused.
// The variables: Token RANKTREE_NATS_TOKEN, User RANKTREE_NATS_USER,
// Password RANKTREE_NATS_PASSWORD, NKeyFile RANKTREE_NATS_NKEY, CredsFile
// RANKTREE_NATS_CREDS, TLSCA RANKTREE_NATS_TLS_CA, TLSCert
// RANKTREE_NATS_TLS_CERT, TLSKey RANKTREE_NATS_TLS_KEY.
type Credentials natsstore.Credentials

// Env variable names: the root package's (ranktree.EnvNATS*).
const (
	envToken    = ranktree.EnvNATSToken
	envUser     = ranktree.EnvNATSUser
	envPassword = ranktree.EnvNATSPassword
	envNKey     = ranktree.EnvNATSNKey
	envCreds    = ranktree.EnvNATSCreds
	envTLSCA    = ranktree.EnvNATSTLSCA
	envTLSCert  = ranktree.EnvNATSTLSCert
	envTLSKey   = ranktree.EnvNATSTLSKey
)

// FromEnv reads credentials from the RANKTREE_NATS_* variables through
// getenv (os.Getenv in production).
func FromEnv(getenv func(string) string) Credentials {
	return Credentials{
		Token: getenv(envToken), User: getenv(envUser), Password: getenv(envPassword),
		NKeyFile: getenv(envNKey), CredsFile: getenv(envCreds),
		TLSCA: getenv(envTLSCA), TLSCert: getenv(envTLSCert), TLSKey: getenv(envTLSKey),
	}
}

// Env returns the non-empty credentials as NAME=value entries for a rank's
// environment.
func (c Credentials) Env() []string {
	var out []string
	add := func(k, v string) {
		if v != "" {
			out = append(out, k+"="+v)
		}
	}
	add(envToken, c.Token)
	add(envUser, c.User)
	add(envPassword, c.Password)
	add(envNKey, c.NKeyFile)
	add(envCreds, c.CredsFile)
	add(envTLSCA, c.TLSCA)
	add(envTLSCert, c.TLSCert)
	add(envTLSKey, c.TLSKey)
	return out
}

// Validate checks that the credential combination is usable: a password
// needs a user, a TLS key needs a certificate (and vice versa), and named
// files exist. The error names the offending flag spelling.
func (c Credentials) Validate() error {
	if c.Password != "" && c.User == "" {
		return fmt.Errorf("--nats-password needs --nats-user")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return fmt.Errorf("--nats-tls-cert and --nats-tls-key must be given together")
	}
	for _, f := range []struct{ flag, path string }{
		{"--nats-nkey", c.NKeyFile}, {"--nats-creds", c.CredsFile},
		{"--nats-tls-ca", c.TLSCA}, {"--nats-tls-cert", c.TLSCert}, {"--nats-tls-key", c.TLSKey},
	} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return fmt.Errorf("%s: %w", f.flag, err)
		}
	}
	return nil
}

// Options returns the nats.go connect options for the credentials
// (natsstore.Credentials.NATSOptions: named files are checked, and a
// missing one is an error naming it).
func (c Credentials) Options() ([]nats.Option, error) {
	return natsstore.Credentials(c).NATSOptions()
}
