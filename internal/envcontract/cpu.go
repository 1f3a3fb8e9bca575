package envcontract

import (
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/ranktree/ranktree/comm/cpu"
)

// CPUOptions builds the CPU engine's options from the parsed environment
// (Contract.CPU) of a job of worldSize ranks, localWorldSize on this node,
// whose control plane is natsURL:
// RANKTREE_TRANSPORT, then the listener's placement. An advertised host
// alone makes the engine listen on every interface (unless it is a loopback
// address). Without
// RANKTREE_SOCKET_IFNAME, RANKTREE_LISTEN_HOST or RANKTREE_ADVERTISE_HOST,
// a single-node job (WORLD_SIZE == LOCAL_WORLD_SIZE) listens on 127.0.0.1;
// a multi-node job listens on every interface and advertises the local
// address of the route to its NATS server, the one network every node of
// the job is known to reach (127.0.0.1 when that server is local, as in a
// multi-node job simulated on one host). Bad values give a *VarError.
func CPUOptions(e CPU, worldSize, localWorldSize int, natsURL string) (cpu.Options, error) {
	o := cpu.Options{Transport: e.Transport, HostID: e.HostID, FlatThreshold: e.FlatThreshold, SlotBytes: e.SlotBytes, SingleCopyMin: e.SingleCopyMin,
		SlotAllReduceMax: e.SlotAllReduceMax}
	if name := e.SocketIfname; name != "" {
		addr, err := interfaceAddr(name)
		if err != nil {
			return o, &VarError{Var: SocketIfname, Value: name, Msg: err.Error()}
		}
		o.ListenHost, o.AdvertiseHost = addr, addr
	}
	if h := e.ListenHost; h != "" {
		if net.ParseIP(h) == nil {
			if _, err := net.LookupHost(h); err != nil {
				return o, &VarError{Var: ListenHost, Value: h, Msg: "not an IP address or a resolvable host name"}
			}
		}
		o.ListenHost = h
		if e.SocketIfname == "" {
			o.AdvertiseHost = "" // the engine's default: ListenHost, or the hostname for a wildcard
		}
	}
	if h := e.AdvertiseHost; h != "" {
		o.AdvertiseHost = h
	}
	if o.ListenHost == "" && o.AdvertiseHost != "" {
		// Peers come from elsewhere: listen on every interface, unless
		// the advertised address is a loopback one.
		if ip := net.ParseIP(o.AdvertiseHost); ip == nil || !ip.IsLoopback() {
			o.ListenHost = "0.0.0.0"
		}
	}
	if o.ListenHost == "" && o.AdvertiseHost == "" && worldSize > localWorldSize {
		if ip := routeTo(natsURL); ip != nil && !ip.IsLoopback() {
			o.ListenHost, o.AdvertiseHost = "0.0.0.0", ip.String()
		}
	}
	return o, nil
}

// interfaceAddr is the address of the named interface that peers should
// dial: its first IPv4 address, else its first global unicast IPv6 one.
func interfaceAddr(name string) (string, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return "", fmt.Errorf("no such network interface (have %s)", interfaceNames())
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return "", err
	}
	var v6 string
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		if ip4 := ipn.IP.To4(); ip4 != nil {
			return ip4.String(), nil
		}
		if v6 == "" && (ipn.IP.IsGlobalUnicast() || ipn.IP.IsLoopback()) {
			v6 = ipn.IP.String()
		}
	}
	if v6 == "" {
		return "", fmt.Errorf("interface %s has no usable address", name)
	}
	return v6, nil
}

func interfaceNames() string {
	ifs, err := net.Interfaces()
	if err != nil || len(ifs) == 0 {
		return "none"
	}
	names := make([]string, len(ifs))
	for i, ifc := range ifs {
		names[i] = ifc.Name
	}
	return strings.Join(names, ", ")
}

// routeTo is the local address the kernel would send from to reach the
// first server of a NATS URL list ("nats://host:port,..."), or nil when the
// URL does not parse or names no reachable host. Nothing is sent: a UDP
// socket is connected only to pick the route.
func routeTo(natsURL string) net.IP {
	first, _, _ := strings.Cut(natsURL, ",")
	first = strings.TrimSpace(first)
	if first == "" {
		return nil
	}
	if !strings.Contains(first, "://") {
		first = "nats://" + first
	}
	u, err := url.Parse(first)
	if err != nil || u.Hostname() == "" {
		return nil
	}
	port := u.Port()
	if port == "" {
		port = "4222"
	}
	conn, err := net.Dial("udp", net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		return nil
	}
	defer conn.Close()
	if a, ok := conn.LocalAddr().(*net.UDPAddr); ok {
		return a.IP
	}
	return nil
}
