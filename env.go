package ranktree

import (
	"github.com/ranktree/ranktree/internal/envcontract"
	"github.com/ranktree/ranktree/internal/metrics"
)

// Environment variables of the env contract between rankrunner and Init.
// The rank variables are torchrun's (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK; RANKTREE_RESTART_COUNT plays
// TORCHELASTIC_RESTART_COUNT); the rest configure the NATS control plane.
const (
	EnvRank           = envcontract.Rank           // global rank, 0..WORLD_SIZE-1 (required)
	EnvWorldSize      = envcontract.WorldSize      // ranks in the job (required)
	EnvLocalRank      = envcontract.LocalRank      // rank within this node (required)
	EnvLocalWorldSize = envcontract.LocalWorldSize // ranks on this node (required)
	EnvNodeRank       = envcontract.NodeRank       // node rank, 0..nodes-1: torchrun's GROUP_RANK, not a rank in a process group (required)
	EnvNATSURL        = envcontract.NATSURL        // control-plane NATS URL (required unless WithStore)
	EnvJob            = envcontract.Job            // job id: KV bucket and event subjects (required unless WithStore)
	EnvRestartCount   = envcontract.RestartCount   // 0 for the first attempt, +1 per restart (default 0)
	EnvTimeout        = envcontract.Timeout        // collective default timeout (read by the supervisor; default 10m)
	EnvStoreTimeout   = envcontract.StoreTimeout   // store/init-barrier timeout as a Go duration (default 5m)
	// EnvStoreWait, set to 1/true, keeps retrying a store URL that refuses
	// connections for the whole store timeout; unset or 0/false, refused
	// connections end Init after natsstore.DefaultRefusedGrace.
	EnvStoreWait = envcontract.StoreWait

	EnvNATSToken    = envcontract.NATSToken    // NATS auth token
	EnvNATSUser     = envcontract.NATSUser     // NATS user (with EnvNATSPassword)
	EnvNATSPassword = envcontract.NATSPassword // NATS password
	EnvNATSNKey     = envcontract.NATSNKey     // path of an nkey seed file
	EnvNATSCreds    = envcontract.NATSCreds    // path of a JWT .creds file
	EnvNATSTLSCA    = envcontract.NATSTLSCA    // PEM CA bundle for the server certificate
	EnvNATSTLSCert  = envcontract.NATSTLSCert  // client certificate (mutual TLS)
	EnvNATSTLSKey   = envcontract.NATSTLSKey   // client key (mutual TLS)
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
	// algorithms (default 32 KiB for 2 ranks, 128 KiB for 3 or more; -1
	// turns them off). Every rank must see the same value.
	EnvFlatThreshold = envcontract.FlatThreshold
)

// EnvTransport selects the CPU engine's transport: "auto" (default: shared
// memory between ranks on one host, TCP otherwise), "shm" or "tcp".
const EnvTransport = envcontract.Transport

// EnvBackend selects the collective engine of every process group: "cpu"
// (the default: the built-in CPU engine, host buffers) or "nccl" (NCCL and
// the CUDA driver loaded at run time, device buffers; the rank's GPU is
// LOCAL_RANK modulo the node's GPU count). torch.distributed's
// init_process_group(backend=...).
const EnvBackend = envcontract.Backend

// EnvFault injects faults into the CPU engine (see comm.ParseFaults and
// docs/faults.md), e.g. "hang@rank=1,seq=5". Unset in normal runs. A fault
// applies to every epoch of a matching group: a group re-created by
// RestartGroup meets it again when its seq counter reaches S.
const EnvFault = envcontract.Fault

// EnvMetricsAddr names the variable with the address (host:port; port 0:
// any free port) where Init serves this rank's Prometheus metrics at
// /metrics (docs/metrics.md). Unset: no metrics are served.
const EnvMetricsAddr = metrics.EnvAddr

// EnvErrorFile names a file where the rank writes the error that ends it
// (torchrun's TORCHELASTIC_ERROR_FILE): rankrunner sets it per rank and
// puts the file's text in its failure summary. Init writes its own error
// there; the first error written wins.
const EnvErrorFile = envcontract.ErrorFile
