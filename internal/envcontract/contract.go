// Package envcontract reads the env contract between rankrunner and
// ranktree.Init once into a typed Contract (Read), and derives the CPU
// engine's options from it (CPUOptions). The root package re-exports the
// variable names with their documentation (ranktree.EnvRank, ...);
// internal/bootstrap turns a *VarError into the public *ranktree.EnvError.
// Nothing else reads the process environment for these variables.
package envcontract

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/internal/metrics"
	"github.com/ranktree/ranktree/store/natsstore"
	"github.com/ranktree/ranktree/supervisor"
)

// Variable names; see the root package's Env* constants for what each means.
const (
	Rank           = "RANK"
	WorldSize      = "WORLD_SIZE"
	LocalRank      = "LOCAL_RANK"
	LocalWorldSize = "LOCAL_WORLD_SIZE"
	NodeRank       = "GROUP_RANK"
	NATSURL        = "RANKTREE_NATS_URL"
	Job            = "RANKTREE_JOB"
	RestartCount   = "RANKTREE_RESTART_COUNT"
	Timeout        = "RANKTREE_TIMEOUT"
	StoreTimeout   = "RANKTREE_STORE_TIMEOUT"
	StoreWait      = "RANKTREE_STORE_WAIT"

	NATSToken    = "RANKTREE_NATS_TOKEN"
	NATSUser     = "RANKTREE_NATS_USER"
	NATSPassword = "RANKTREE_NATS_PASSWORD"
	NATSNKey     = "RANKTREE_NATS_NKEY"
	NATSCreds    = "RANKTREE_NATS_CREDS"
	NATSTLSCA    = "RANKTREE_NATS_TLS_CA"
	NATSTLSCert  = "RANKTREE_NATS_TLS_CERT"
	NATSTLSKey   = "RANKTREE_NATS_TLS_KEY"

	Backend          = "RANKTREE_BACKEND"
	Fault            = "RANKTREE_FAULT"
	Transport        = "RANKTREE_TRANSPORT"
	SocketIfname     = "RANKTREE_SOCKET_IFNAME"
	ListenHost       = "RANKTREE_LISTEN_HOST"
	AdvertiseHost    = "RANKTREE_ADVERTISE_HOST"
	HostID           = "RANKTREE_HOST_ID"
	FlatThreshold    = "RANKTREE_FLAT_THRESHOLD"
	SlotBytes        = "RANKTREE_SLOT_BYTES"
	SingleCopyMin    = "RANKTREE_SINGLE_COPY_MIN"
	SlotAllReduceMax = "RANKTREE_SLOT_ALLREDUCE_MAX"

	// ErrorFile is read on its own, not by Read: internal/bootstrap's
	// recordError reads it so that an Init that fails while parsing can
	// still report it.
	ErrorFile = "RANKTREE_ERROR_FILE"
)

// VarError is a malformed variable: Var, its Value and what is wrong with
// it (Msg). internal/bootstrap reports it as a *ranktree.EnvError.
type VarError struct {
	Var, Value, Msg string
}

// Error names the variable, its value and the problem.
func (e *VarError) Error() string { return fmt.Sprintf("%s=%q: %s", e.Var, e.Value, e.Msg) }

// Contract is the env contract as one rank reads it: every variable the
// runtime consults, read once by Read (Init passes os.LookupEnv) into
// typed fields and passed down from there to the store dial (NATSURL, Job,
// StoreTimeout, StoreWait, Creds), the engine choice (Backend, CPU), fault
// injection (Faults), the supervision tree (Supervision) and the metrics
// server (MetricsAddr, MetricsAddrFile). (RANKTREE_ERROR_FILE is the
// exception: internal/bootstrap's recordError reads it on its own so that an Init
// that fails while parsing can still report it.)
//
// A value that does not parse is a *VarError from Read; what may be
// missing, and whether the ranks are consistent, is decided by
// internal/bootstrap's Config.validate once options are merged in.
type Contract struct {
	// Identity: torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
	// GROUP_RANK (the node rank) and RANKTREE_RESTART_COUNT (torchrun's
	// TORCHELASTIC_RESTART_COUNT). Set is false when unset or empty.
	Rank, WorldSize, LocalRank, LocalWorldSize, NodeRank, RestartCount Int

	NATSURL      string                // RANKTREE_NATS_URL; "" when unset
	Job          string                // RANKTREE_JOB; "" when unset
	StoreTimeout time.Duration         // RANKTREE_STORE_TIMEOUT; 0 when unset
	StoreWait    bool                  // RANKTREE_STORE_WAIT
	Creds        natsstore.Credentials // RANKTREE_NATS_TOKEN ... RANKTREE_NATS_TLS_KEY

	// Backend is RANKTREE_BACKEND as given ("", "cpu" or "nccl"; checked
	// by bootstrap.Config.validate, and only when no WithBackend replaces it).
	Backend string
	CPU     CPU          // the CPU engine's transport and listener placement
	Faults  []comm.Fault // RANKTREE_FAULT, parsed (nil when unset)

	// Supervision is the supervisor's configuration from RANKTREE_TIMEOUT,
	// RANKTREE_ASYNC_ERROR_HANDLING (or TORCH_NCCL_ASYNC_ERROR_HANDLING),
	// RANKTREE_BLOCKING_WAIT, RANKTREE_HEARTBEAT_TIMEOUT,
	// RANKTREE_TRACE_BUFFER_SIZE, RANKTREE_TRACE_DIR, RANKTREE_EVENTS and
	// RANKTREE_ACTOR_PANIC, validated by supervisor.ConfigFromEnv.
	Supervision supervisor.Config
	// supervisionVars holds the supervisor's variables as read, so that an
	// option replacing one of them (WithActorPanic) re-derives the
	// configuration without reading the environment again.
	supervisionVars map[string]string

	MetricsAddr     string // RANKTREE_METRICS_ADDR; "" serves no metrics
	MetricsAddrFile string // RANKTREE_METRICS_ADDR_FILE; "" writes none
}

// Int is one integer variable of the contract.
type Int struct {
	Value int
	Set   bool // the variable was present and non-empty
}

// CPU is the CPU engine's part of the contract (see CPUOptions).
type CPU struct {
	Transport     string // RANKTREE_TRANSPORT: "", "auto", "shm" or "tcp"
	HostID        string // RANKTREE_HOST_ID
	SocketIfname  string // RANKTREE_SOCKET_IFNAME
	ListenHost    string // RANKTREE_LISTEN_HOST
	AdvertiseHost string // RANKTREE_ADVERTISE_HOST
	// FlatThreshold is RANKTREE_FLAT_THRESHOLD: the largest message in
	// bytes of the one-step shared-memory algorithms (0: the engine's
	// default, -1: off).
	FlatThreshold int
	// SlotBytes is RANKTREE_SLOT_BYTES: the size in bytes of each
	// group-segment slot, cpu.Options.SlotBytes (0: the engine's
	// default).
	SlotBytes int
	// SingleCopyMin is RANKTREE_SINGLE_COPY_MIN: the smallest allgather
	// (bytes gathered) between two ranks that moves by cross-memory
	// attach, cpu.Options.SingleCopyMin (0: the engine's default, which
	// a two-rank group's probe at creation may lower to 64 KiB, with the
	// two-rank broadcast; -1: off, and with it the three-rank single-copy
	// broadcast; any other value skips the probe).
	SingleCopyMin int
	// SlotAllReduceMax is RANKTREE_SLOT_ALLREDUCE_MAX: the largest
	// allreduce in bytes that three or more ranks on one host move
	// through the group segment's slots in rounds,
	// cpu.Options.SlotAllReduceMax (0: the engine's default, -1: off).
	SlotAllReduceMax int
}

// Read reads every variable of the env contract once through lookup and
// parses it. A malformed value is a *VarError naming its variable.
func Read(lookup func(string) (string, bool)) (Contract, error) {
	get := func(k string) string {
		v, _ := lookup(k)
		return v
	}
	var e Contract
	if err := e.readIdentity(get); err != nil {
		return e, err
	}
	if err := e.readStore(get); err != nil {
		return e, err
	}
	e.Backend = get(Backend)
	cpuE, err := readCPU(get)
	if err != nil {
		return e, err
	}
	e.CPU = cpuE
	if s := get(Fault); s != "" {
		faults, err := comm.ParseFaults(s)
		if err != nil {
			return e, &VarError{Var: Fault, Value: s, Msg: err.Error()}
		}
		e.Faults = faults
	}
	if err := e.readSupervision(get); err != nil {
		return e, err
	}
	e.MetricsAddr, e.MetricsAddrFile = get(metrics.EnvAddr), get(metrics.EnvAddrFile)
	return e, nil
}

// readIdentity parses the rank variables.
func (e *Contract) readIdentity(get func(string) string) error {
	for _, v := range []struct {
		name string
		dst  *Int
	}{
		{Rank, &e.Rank}, {WorldSize, &e.WorldSize}, {LocalRank, &e.LocalRank},
		{LocalWorldSize, &e.LocalWorldSize}, {NodeRank, &e.NodeRank}, {RestartCount, &e.RestartCount},
	} {
		s := get(v.name)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return &VarError{Var: v.name, Value: s, Msg: "not an integer"}
		}
		*v.dst = Int{Value: n, Set: true}
	}
	return nil
}

// readStore parses the control plane's variables.
func (e *Contract) readStore(get func(string) string) error {
	e.NATSURL, e.Job = get(NATSURL), get(Job)
	if s := get(StoreTimeout); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return &VarError{Var: StoreTimeout, Value: s, Msg: "not a positive Go duration (e.g. 5m)"}
		}
		e.StoreTimeout = d
	}
	if s := get(StoreWait); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return &VarError{Var: StoreWait, Value: s, Msg: "not a boolean (1, true, 0, false)"}
		}
		e.StoreWait = b
	}
	e.Creds = natsstore.Credentials{
		Token: get(NATSToken), User: get(NATSUser), Password: get(NATSPassword),
		NKeyFile: get(NATSNKey), CredsFile: get(NATSCreds), TLSCA: get(NATSTLSCA),
		TLSCert: get(NATSTLSCert), TLSKey: get(NATSTLSKey),
	}
	return nil
}

// readSupervision checks the supervision variables here, before anything
// connects, so bad values fail fast; the ones read are kept.
func (e *Contract) readSupervision(get func(string) string) error {
	e.supervisionVars = map[string]string{}
	sup, err := supervisor.ConfigFromEnv(func(k string) string {
		v := get(k)
		e.supervisionVars[k] = v
		return v
	})
	if err != nil {
		var ce *supervisor.ConfigError
		if errors.As(err, &ce) {
			return &VarError{Var: ce.Var, Value: ce.Value, Msg: ce.Msg}
		}
		return err
	}
	e.Supervision = sup
	return nil
}

// readCPU parses the CPU engine's variables.
func readCPU(get func(string) string) (CPU, error) {
	c := CPU{
		Transport: get(Transport), HostID: get(HostID), SocketIfname: get(SocketIfname),
		ListenHost: get(ListenHost), AdvertiseHost: get(AdvertiseHost),
	}
	for _, v := range []struct {
		name     string
		dst      *int
		min, max int // max 0: no bound
		msg      string
	}{
		{FlatThreshold, &c.FlatThreshold, -1, 16 << 20, "want a size in bytes up to 16777216, or -1 for off"},
		{SlotBytes, &c.SlotBytes, 0, 16 << 20, "want a size in bytes up to 16777216"},
		{SingleCopyMin, &c.SingleCopyMin, -1, 0, "want a size in bytes, or -1 for off"},
		{SlotAllReduceMax, &c.SlotAllReduceMax, -1, 0, "want a size in bytes, or -1 for off"},
	} {
		s := get(v.name)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < v.min || (v.max > 0 && n > v.max) {
			return c, &VarError{Var: v.name, Value: s, Msg: v.msg}
		}
		*v.dst = n
	}
	return c, nil
}

// SupervisionWith re-derives the supervisor's configuration from the
// variables as read, with variable k replaced by v (an option's value).
func (e *Contract) SupervisionWith(k, v string) (supervisor.Config, error) {
	return supervisor.ConfigFromEnv(func(name string) string {
		if name == k {
			return v
		}
		return e.supervisionVars[name]
	})
}
