package natsstore

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/ranktree/ranktree/store"
)

// Tests of the credential options NKeyFile, CredsFile, TLSCA, TLSCert and
// TLSKey against an in-process nats-server configured for each.

// authTimeout bounds every Connect in these tests (its Options.Timeout and
// its context), so a rejected credential fails fast instead of hanging.
const authTimeout = 5 * time.Second

// startAuthServer runs a JetStream nats-server with the given options on a
// random 127.0.0.1 port and returns its client URL.
func startAuthServer(t *testing.T, o *server.Options) string {
	t.Helper()
	o.Host = "127.0.0.1"
	o.Port = server.RANDOM_PORT
	o.JetStream = true
	o.StoreDir = t.TempDir()
	o.NoSigs = true
	o.NoLog = true
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("server.NewServer: %v", err)
	}
	s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready after 10s")
	}
	return s.ClientURL()
}

// connectRoundTrip connects with o, writes a value and reads it back.
func connectRoundTrip(t *testing.T, o Options) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*authTimeout)
	defer cancel()
	o.Job = uniqueJob(t)
	o.Timeout = authTimeout
	s, err := Connect(ctx, o)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	defer s.Close()
	want := "v-" + o.Job
	must(t, s.Set(ctx, "auth/k", []byte(want)))
	got, err := s.Get(ctx, "auth/k")
	if err != nil || string(got) != want {
		t.Fatalf("Get after Set = %q, %v; want %q", got, err, want)
	}
}

// connectFails connects with o, expects an error within the bound and
// returns it.
func connectFails(t *testing.T, o Options) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), authTimeout)
	defer cancel()
	o.Job = uniqueJob(t)
	o.Timeout = authTimeout
	start := time.Now()
	s, err := Connect(ctx, o)
	if err == nil {
		s.Close()
		t.Fatalf("Connect(%+v) succeeded", o)
	}
	if d := time.Since(start); d > authTimeout+time.Second {
		t.Errorf("Connect took %v to fail (bound %v)", d, authTimeout)
	}
	t.Logf("Connect error: %v", err)
	return err
}

// wantErr checks err is store.ErrUnavailable (a refused connection) and
// mentions every one of subs (case-insensitive).
func wantErr(t *testing.T, what string, err error, subs ...string) {
	t.Helper()
	if !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("%s: error %v is not store.ErrUnavailable", what, err)
	}
	msg := strings.ToLower(err.Error())
	for _, sub := range subs {
		if !strings.Contains(msg, strings.ToLower(sub)) {
			t.Errorf("%s: error %q does not mention %q", what, err, sub)
		}
	}
}

// wantRejected checks err is a permanent rejection (not
// store.ErrUnavailable, so callers do not retry it) that mentions every one
// of subs (case-insensitive).
func wantRejected(t *testing.T, what string, err error, subs ...string) {
	t.Helper()
	if errors.Is(err, store.ErrUnavailable) {
		t.Errorf("%s: error %v is store.ErrUnavailable, want a permanent error", what, err)
	}
	msg := strings.ToLower(err.Error())
	for _, sub := range append(subs, "rejected") {
		if !strings.Contains(msg, strings.ToLower(sub)) {
			t.Errorf("%s: error %q does not mention %q", what, err, sub)
		}
	}
}

// wantFileErr checks err names path and is not store.ErrUnavailable: a
// missing local file is a configuration error, not worth retrying.
func wantFileErr(t *testing.T, err error, path string) {
	t.Helper()
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name %s", err, path)
	}
	if errors.Is(err, store.ErrUnavailable) {
		t.Errorf("error %q for a missing file is store.ErrUnavailable", err)
	}
}

// --- TLS ---

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newSerial(t *testing.T) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	must(t, err)
	return n
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          newSerial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	must(t, err)
	cert, err := x509.ParseCertificate(der)
	must(t, err)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue signs a leaf certificate (server if ip is set, else client) and
// returns its certificate and key PEM.
func (ca *testCA) issue(t *testing.T, name string, ip net.IP) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: newSerial(t),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	must(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	must(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	must(t, os.WriteFile(p, data, 0o600))
	return p
}

func TestTLSClientCert(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "ranktree test CA")
	srvCert, srvKey := ca.issue(t, "nats-server", net.IPv4(127, 0, 0, 1))
	cliCert, cliKey := ca.issue(t, "rank", nil)
	// An impostor CA with the same name: the client offers its certificate
	// (the server's acceptable-CA list matches by name), the server must
	// reject it on the signature.
	other := newTestCA(t, "ranktree test CA")
	badCert, badKey := other.issue(t, "intruder", nil)

	caFile := writeFile(t, dir, "ca.pem", ca.pem)
	certFile := writeFile(t, dir, "client.pem", cliCert)
	keyFile := writeFile(t, dir, "client-key.pem", cliKey)
	badCertFile := writeFile(t, dir, "bad.pem", badCert)
	badKeyFile := writeFile(t, dir, "bad-key.pem", badKey)

	pair, err := tls.X509KeyPair(srvCert, srvKey)
	must(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	u := startAuthServer(t, &server.Options{
		TLS:       true,
		TLSVerify: true,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{pair},
			ClientCAs:    pool,
			ClientAuth:   tls.RequireAndVerifyClientCert,
			MinVersion:   tls.VersionTLS12,
		},
		TLSTimeout: 2,
	})

	t.Run("RoundTrip", func(t *testing.T) {
		connectRoundTrip(t, Options{URL: u, Credentials: Credentials{TLSCA: caFile, TLSCert: certFile, TLSKey: keyFile}})
	})
	t.Run("ClientCertFromOtherCA", func(t *testing.T) {
		err := connectFails(t, Options{URL: u, Credentials: Credentials{TLSCA: caFile, TLSCert: badCertFile, TLSKey: badKeyFile}})
		// The message depends on timing (a TLS alert, or a broken pipe when
		// the server has closed first); the rejection is what counts.
		wantErr(t, "client cert of another CA", err)
	})
	t.Run("NoClientCert", func(t *testing.T) {
		err := connectFails(t, Options{URL: u, Credentials: Credentials{TLSCA: caFile}})
		// "certificate required", or a broken pipe, as above.
		wantErr(t, "no client cert", err)
	})
	t.Run("SystemRoots", func(t *testing.T) {
		// Without TLSCA the server's certificate is checked against the
		// system roots, which do not hold the test CA.
		err := connectFails(t, Options{URL: u, Credentials: Credentials{TLSCert: certFile, TLSKey: keyFile}})
		wantRejected(t, "no TLSCA", err, "unknown authority")
	})
	t.Run("MissingCAFile", func(t *testing.T) {
		missing := filepath.Join(dir, "nope.pem")
		wantFileErr(t, connectFails(t, Options{URL: u, Credentials: Credentials{TLSCA: missing, TLSCert: certFile, TLSKey: keyFile}}), missing)
	})
	t.Run("MissingKeyFile", func(t *testing.T) {
		missing := filepath.Join(dir, "nope-key.pem")
		wantFileErr(t, connectFails(t, Options{URL: u, Credentials: Credentials{TLSCA: caFile, TLSCert: certFile, TLSKey: missing}}), missing)
	})
}

// --- NKey ---

func newUserSeedFile(t *testing.T, dir, name string) (path, pub string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	must(t, err)
	seed, err := kp.Seed()
	must(t, err)
	pub, err = kp.PublicKey()
	must(t, err)
	return writeFile(t, dir, name, seed), pub
}

func TestNKeyUser(t *testing.T) {
	dir := t.TempDir()
	seedFile, pub := newUserSeedFile(t, dir, "user.nk")
	otherFile, _ := newUserSeedFile(t, dir, "other.nk")
	u := startAuthServer(t, &server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}})

	t.Run("RoundTrip", func(t *testing.T) {
		connectRoundTrip(t, Options{URL: u, Credentials: Credentials{NKeyFile: seedFile}})
	})
	t.Run("OtherUser", func(t *testing.T) {
		err := connectFails(t, Options{URL: u, Credentials: Credentials{NKeyFile: otherFile}})
		wantRejected(t, "unknown nkey", err, "authorization violation")
	})
	t.Run("NoCredentials", func(t *testing.T) {
		err := connectFails(t, Options{URL: u})
		wantRejected(t, "no nkey", err, "authorization violation")
	})
	t.Run("MissingSeedFile", func(t *testing.T) {
		missing := filepath.Join(dir, "missing.nk")
		wantFileErr(t, connectFails(t, Options{URL: u, Credentials: Credentials{NKeyFile: missing}}), missing)
	})
}

// --- JWT creds (operator mode) ---

// newAccount returns an account key pair and its JWT signed by op; js
// enables JetStream for the account.
func newAccount(t *testing.T, op nkeys.KeyPair, name string, js bool) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateAccount()
	must(t, err)
	pub, err := kp.PublicKey()
	must(t, err)
	ac := jwt.NewAccountClaims(pub)
	ac.Name = name
	if js {
		ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: 64 << 20, Streams: -1, Consumer: -1}
	}
	tok, err := ac.Encode(op)
	must(t, err)
	return kp, tok
}

// newCredsFile writes a creds file for a fresh user signed by acct.
func newCredsFile(t *testing.T, dir, name string, acct nkeys.KeyPair) string {
	t.Helper()
	ukp, err := nkeys.CreateUser()
	must(t, err)
	upub, err := ukp.PublicKey()
	must(t, err)
	seed, err := ukp.Seed()
	must(t, err)
	uc := jwt.NewUserClaims(upub)
	uc.Name = name
	tok, err := uc.Encode(acct)
	must(t, err)
	creds, err := jwt.FormatUserConfig(tok, seed)
	must(t, err)
	return writeFile(t, dir, name+".creds", creds)
}

func TestCredsFile(t *testing.T) {
	dir := t.TempDir()
	okp, err := nkeys.CreateOperator()
	must(t, err)
	opub, err := okp.PublicKey()
	must(t, err)
	sysKP, sysJWT := newAccount(t, okp, "SYS", false)
	sysPub, err := sysKP.PublicKey()
	must(t, err)
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "ranktree-test"
	oc.SystemAccount = sysPub
	opJWT, err := oc.Encode(okp)
	must(t, err)
	opClaims, err := jwt.DecodeOperatorClaims(opJWT)
	must(t, err)

	accKP, accJWT := newAccount(t, okp, "RANKTREE", true)
	accPub, err := accKP.PublicKey()
	must(t, err)
	res := &server.MemAccResolver{}
	must(t, res.Store(sysPub, sysJWT))
	must(t, res.Store(accPub, accJWT))

	u := startAuthServer(t, &server.Options{
		TrustedOperators: []*jwt.OperatorClaims{opClaims},
		SystemAccount:    sysPub,
		AccountResolver:  res,
	})

	credsFile := newCredsFile(t, dir, "rank", accKP)
	// A user of an account the server has never seen (signed by the same
	// operator, but not in the resolver).
	strayKP, _ := newAccount(t, okp, "STRAY", true)
	strayCreds := newCredsFile(t, dir, "stray", strayKP)

	t.Run("RoundTrip", func(t *testing.T) {
		connectRoundTrip(t, Options{URL: u, Credentials: Credentials{CredsFile: credsFile}})
	})
	t.Run("UnknownAccount", func(t *testing.T) {
		err := connectFails(t, Options{URL: u, Credentials: Credentials{CredsFile: strayCreds}})
		wantRejected(t, "user of an unknown account", err, "authorization violation")
	})
	t.Run("NoCredentials", func(t *testing.T) {
		err := connectFails(t, Options{URL: u})
		wantRejected(t, "no creds", err, "authorization violation")
	})
	t.Run("MissingCredsFile", func(t *testing.T) {
		missing := filepath.Join(dir, "missing.creds")
		wantFileErr(t, connectFails(t, Options{URL: u, Credentials: Credentials{CredsFile: missing}}), missing)
	})
}
