package bootstrap

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/internal/envcontract"
)

// hostIPv4 is a non-loopback IPv4 address of this machine, or "".
func hostIPv4() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
			return ipn.IP.String()
		}
	}
	return ""
}

// TestCPUOptionsFromEnv: where the CPU engine listens and what it
// advertises, from RANKTREE_SOCKET_IFNAME, RANKTREE_LISTEN_HOST,
// RANKTREE_ADVERTISE_HOST and, for multi-node jobs, the route to NATS.
func TestCPUOptionsFromEnv(t *testing.T) {
	single := &Config{worldSize: 4, localWorldSize: 4, natsURL: "nats://10.255.255.1:4222"}
	multi := func(url string) *Config { return &Config{worldSize: 4, localWorldSize: 2, natsURL: url} }
	type want struct{ listen, advertise string }
	cases := []struct {
		name string
		env  map[string]string
		c    *Config
		want want
	}{
		{"single node: loopback defaults", nil, single, want{"", ""}},
		{"host id", map[string]string{envcontract.HostID: "nodeA"}, single, want{"", ""}},
		{"ifname lo", map[string]string{envcontract.SocketIfname: "lo"}, single, want{"127.0.0.1", "127.0.0.1"}},
		{"listen wildcard", map[string]string{envcontract.ListenHost: "0.0.0.0"}, single, want{"0.0.0.0", ""}},
		{"advertise only", map[string]string{envcontract.AdvertiseHost: "10.1.2.3"}, single, want{"0.0.0.0", "10.1.2.3"}},
		{"advertise loopback only", map[string]string{envcontract.AdvertiseHost: "127.0.0.1"}, single, want{"", "127.0.0.1"}},
		{"ifname then listen override", map[string]string{envcontract.SocketIfname: "lo", envcontract.ListenHost: "0.0.0.0"}, single, want{"0.0.0.0", "127.0.0.1"}},
		{"multi node, NATS on loopback", nil, multi("nats://127.0.0.1:4222"), want{"", ""}},
		{"multi node, no NATS URL (WithStore)", nil, multi(""), want{"", ""}},
		{"multi node, explicit env wins", map[string]string{envcontract.ListenHost: "127.0.0.1"}, multi("nats://10.255.255.1:4222"), want{"127.0.0.1", ""}},
	}
	if ip := hostIPv4(); ip != "" {
		cases = append(cases, struct {
			name string
			env  map[string]string
			c    *Config
			want want
		}{"multi node, NATS on " + ip, nil, multi("nats://" + ip + ":4222,nats://127.0.0.1:1"), want{"0.0.0.0", ip}})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := *tc.c
			c.env = envFrom(t, tc.env)
			o, err := cpuOptions(&c)
			if err != nil {
				t.Fatal(err)
			}
			if got := (want{o.ListenHost, o.AdvertiseHost}); got != tc.want {
				t.Fatalf("listen/advertise = %+v, want %+v", got, tc.want)
			}
			if o.HostID != tc.env[envcontract.HostID] {
				t.Fatalf("HostID = %q, want %q", o.HostID, tc.env[envcontract.HostID])
			}
		})
	}
}

// TestCPUOptionsEnvErrors: a bad interface or listen host is an *EnvError
// naming the variable (and, for an interface, the ones that exist).
func TestCPUOptionsEnvErrors(t *testing.T) {
	for _, tc := range []struct{ v, val, msg string }{
		{envcontract.SocketIfname, "nosuchif0", "no such network interface (have "},
		{envcontract.ListenHost, "bad host name!", "not an IP address or a resolvable host name"},
	} {
		t.Run(tc.v, func(t *testing.T) {
			_, err := cpuOptions(&Config{worldSize: 1, localWorldSize: 1, env: envFrom(t, map[string]string{tc.v: tc.val})})
			var ee *EnvError
			if !errors.As(err, &ee) || ee.Var != tc.v || !errors.Is(err, ErrEnv) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("got %v, want an EnvError for %s containing %q", err, tc.v, tc.msg)
			}
			if tc.v == envcontract.SocketIfname && !strings.Contains(err.Error(), "lo") {
				t.Fatalf("error does not list the interfaces: %v", err)
			}
		})
	}
}

// TestCPUOptionsFlatThreshold: RANKTREE_FLAT_THRESHOLD sets
// cpu.Options.FlatThreshold; a bad value is an *EnvError naming it.
func TestCPUOptionsFlatThreshold(t *testing.T) {
	checkCPUOptionVar(t, envcontract.FlatThreshold, 2, func(o cpu.Options) int { return o.FlatThreshold },
		map[string]int{"": 0, "4096": 4096, "-1": -1}, []string{"x", "-2", "99999999"})
}

// TestCPUOptionsSlotBytes: RANKTREE_SLOT_BYTES sets
// cpu.Options.SlotBytes; a bad value is an *EnvError naming it.
func TestCPUOptionsSlotBytes(t *testing.T) {
	checkCPUOptionVar(t, envcontract.SlotBytes, 3, func(o cpu.Options) int { return o.SlotBytes },
		map[string]int{"": 0, "65536": 65536, "16777216": 16 << 20}, []string{"x", "-1", "16777217"})
}

// TestCPUOptionsSingleCopyMin: RANKTREE_SINGLE_COPY_MIN sets
// cpu.Options.SingleCopyMin; a bad value is an *EnvError naming it.
func TestCPUOptionsSingleCopyMin(t *testing.T) {
	checkCPUOptionVar(t, envcontract.SingleCopyMin, 2, func(o cpu.Options) int { return o.SingleCopyMin },
		map[string]int{"": 0, "1048576": 1 << 20, "-1": -1}, []string{"x", "-2", "1.5"})
}

// TestCPUOptionsSlotAllReduceMax: RANKTREE_SLOT_ALLREDUCE_MAX sets
// cpu.Options.SlotAllReduceMax; a bad value is an *EnvError naming it.
func TestCPUOptionsSlotAllReduceMax(t *testing.T) {
	checkCPUOptionVar(t, envcontract.SlotAllReduceMax, 4, func(o cpu.Options) int { return o.SlotAllReduceMax },
		map[string]int{"": 0, "2097152": 2 << 20, "-1": -1}, []string{"x", "-2", "1.5"})
}

// checkCPUOptionVar sets variable v to each key of good and checks the
// engine option field reads (a single-node job of world ranks), then to
// each of bad and checks for an *EnvError naming v.
func checkCPUOptionVar(t *testing.T, v string, world int, field func(cpu.Options) int, good map[string]int, bad []string) {
	t.Helper()
	for _, k := range []string{envcontract.SocketIfname, envcontract.ListenHost, envcontract.AdvertiseHost} {
		t.Setenv(k, "")
	}
	options := func() (cpu.Options, error) {
		e, err := readEnv(os.LookupEnv)
		if err != nil {
			return cpu.Options{}, err
		}
		return cpuOptions(&Config{worldSize: world, localWorldSize: world, env: e})
	}
	for val, want := range good {
		t.Setenv(v, val)
		o, err := options()
		if err != nil || field(o) != want {
			t.Fatalf("%s=%q: got %d, %v; want %d", v, val, field(o), err, want)
		}
	}
	for _, val := range bad {
		t.Setenv(v, val)
		_, err := options()
		var ee *EnvError
		if !errors.As(err, &ee) || ee.Var != v {
			t.Fatalf("%s=%q: got %v, want an EnvError naming it", v, val, err)
		}
	}
}
