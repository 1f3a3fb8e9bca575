package natsauth

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestEnvRoundTrip(t *testing.T) {
	c := Credentials{Token: "t", User: "u", Password: "p", TLSCA: "/ca.pem"}
	env := map[string]string{}
	for _, kv := range c.Env() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	if len(env) != 4 || env["RANKTREE_NATS_TOKEN"] != "t" || env["RANKTREE_NATS_TLS_CA"] != "/ca.pem" {
		t.Fatalf("Env() = %v", c.Env())
	}
	if got := FromEnv(func(k string) string { return env[k] }); !reflect.DeepEqual(got, c) {
		t.Fatalf("FromEnv(Env()) = %+v, want %+v", got, c)
	}
}

func TestValidate(t *testing.T) {
	f := filepath.Join(t.TempDir(), "seed")
	if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cred Credentials
		want string // "" = valid
	}{
		{Credentials{}, ""},
		{Credentials{NKeyFile: f}, ""},
		{Credentials{Password: "p"}, "--nats-password"},
		{Credentials{TLSCert: f}, "--nats-tls-cert"},
		{Credentials{CredsFile: "/no/such/file"}, "--nats-creds"},
	} {
		err := c.cred.Validate()
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: %v, want %q", c.cred, err, c.want)
		}
	}
}
