package ranktree

import (
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/internal/envcontract"
)

// Environment variables that place the CPU engine's TCP listener; they
// matter for jobs that span hosts. The listener carries the data for tcp
// links and the control connection for shm links.
const (
	// EnvSocketIfname names the network interface to use, as
	// GLOO_SOCKET_IFNAME does for Gloo: the engine listens on and
	// advertises that interface's first IPv4 address (else its first
	// global IPv6 address).
	EnvSocketIfname = envcontract.SocketIfname
	// EnvListenHost is the address the listener binds (overrides the
	// interface's address), e.g. "0.0.0.0".
	EnvListenHost = envcontract.ListenHost
	// EnvAdvertiseHost is the host or address peers dial (overrides the
	// interface's address).
	EnvAdvertiseHost = envcontract.AdvertiseHost
	// EnvHostID overrides the host identity by which the engine's auto
	// transport picks shared memory (ranks with equal ids) or TCP (default:
	// the kernel's boot id and the hostname). Giving two groups of ranks on
	// one machine different ids makes them talk TCP, as on two hosts.
	EnvHostID = envcontract.HostID
	// EnvFlatThreshold sets the CPU engine's cpu.Options.FlatThreshold:
	// the largest message in bytes of the one-step shared-memory
	// algorithms (default 32 KiB; -1 turns them off). Every rank must see
	// the same value.
	EnvFlatThreshold = envcontract.FlatThreshold
)

// cpuOptions builds the CPU engine's options from the parsed environment
// (envcontract.CPUOptions: RANKTREE_TRANSPORT, then the listener's
// placement). Bad values give an *EnvError.
func cpuOptions(c *config) (cpu.Options, error) {
	o, err := envcontract.CPUOptions(c.env.CPU, c.worldSize, c.localWorldSize, c.natsURL)
	return o, envErr(err)
}
