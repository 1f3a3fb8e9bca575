// Package ranktree is an embeddable, actor-style collective-communication
// runtime for Go training programs: the Go counterpart of PyTorch's c10d
// (process groups, the store, the NCCL watchdog), DDP's Reducer and
// torchrun, with a NATS control plane that makes a running job observable.
//
// # The caller's duties
//
//  1. Start every rank with the env contract set: normally by launching the
//     program with rankrunner (rankrunner --nproc-per-node N ./cmd/train),
//     which also starts an embedded NATS server. By hand, set the variables
//     below, or pass the matching With* options (options win).
//  2. Call Init exactly once per process, before any collective, and check
//     its error: *EnvError for a missing/malformed variable (the text reads
//     like c10d's "environment variable RANK expected, but not set"),
//     *OptionError for a bad option, store.ErrUnavailable when NATS cannot be
//     reached, *store.BarrierError when not all ranks arrived in time.
//  3. Defer Runtime.Close with a bounded context. Close is idempotent and
//     returns by the context's deadline (30 s without one).
//  4. Issue the collectives of a process group in the same order on every
//     rank (c10d's rule); the runtime turns violations into ErrMismatch or
//     timeouts, never silent corruption.
//  5. Treat comm.ErrTimeout, ErrAborted and ErrRemoteAbort as "re-create the
//     group or restart the job": rankrunner restarts the job with
//     RANKTREE_RESTART_COUNT+1, and every store key of the new attempt lives
//     under a fresh prefix.
//
// # Env contract
//
//	RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK   required (torchrun's names)
//	RANKTREE_NATS_URL, RANKTREE_JOB                              required unless WithStore
//	RANKTREE_RESTART_COUNT                                       default 0 (TORCHELASTIC_RESTART_COUNT)
//	RANKTREE_STORE_TIMEOUT                                       store/init-barrier timeout, default 5m
//	RANKTREE_TIMEOUT                                             collective default timeout, default 10m (see package supervisor)
//	RANKTREE_ACTOR_PANIC                                         escalate (default) or restart: what an actor panic leads to (groups.go)
//	RANKTREE_TRANSPORT, RANKTREE_BACKEND                         CPU engine transport (auto, shm, tcp); engine (cpu, nccl)
//	RANKTREE_SOCKET_IFNAME, RANKTREE_LISTEN_HOST,
//	RANKTREE_ADVERTISE_HOST                                      where the CPU engine listens and what peers dial (cpuenv.go)
//	RANKTREE_HOST_ID                                             host identity for choosing shm over TCP (cpuenv.go)
//	RANKTREE_NATS_TOKEN, RANKTREE_NATS_USER, RANKTREE_NATS_PASSWORD,
//	RANKTREE_NATS_NKEY (seed file), RANKTREE_NATS_CREDS (creds file),
//	RANKTREE_NATS_TLS_CA, RANKTREE_NATS_TLS_CERT, RANKTREE_NATS_TLS_KEY   optional credentials
//
// The names are exported as Env* constants so the launcher uses the same.
//
// # Store layout
//
// The job store is one NATS JetStream KV bucket per job (see
// store/natsstore). Runtime.Store is that store under the per-restart
// prefix "restart/<n>/"; Runtime.JobStore is the whole bucket. Under the
// per-restart prefix:
//
//	init/...                 Init's store-based barrier (InitBarrierKey)
//	abort/<comm-id>          abort signal of a communicator: JSON
//	                         {"rank":R,"reason":"..."} (more fields allowed);
//	                         written by the rank that aborts, watched (a push,
//	                         not a poll) by every peer's watchdog, which then
//	                         fails its in-flight work with comm.ErrRemoteAbort
//
// <comm-id> names one communicator (process group × epoch).
package ranktree
