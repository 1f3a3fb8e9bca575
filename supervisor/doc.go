// Package supervisor is a rank's supervision: the watchdog that turns a
// hung or failed collective into a typed error on every rank in bounded
// time, the error-handling policy (c10d's TORCH_NCCL_ASYNC_ERROR_HANDLING),
// abort propagation through the store, the flight recorder and its merge
// for `rankrunner diagnose`, the heartbeat monitor, and the supervision root
// whose children are the rank's actors.
//
// Decisions are pure (etcd raft style): WatchdogCore.Step and
// HeartbeatCore.Observe take events with time as an argument and return
// Actions; Watchdog and HeartbeatMonitor are the protoactor actors that feed
// them and carry the actions out. Files: config.go (Config, ConfigFromEnv),
// flightrecorder.go, merge.go, watchdog_core.go, watchdog.go (the actor),
// watchdog_works.go (its pass over Works: events, metrics), heartbeat.go,
// root.go, restart.go (epoch agreement), dumpservice.go (dumps over NATS),
// rank.go (all of it wired for one rank).
//
// StartRank does steps 2-5 below in one call and Rank.AttachGroup step 6;
// Rank.Close step 8. The runtime's duties, in order (ranktree.Init /
// NewGroup / Close):
//
//  1. cfg, err := ConfigFromEnv(os.Getenv); fail Init with err (a
//     *ConfigError naming the variable). comm.ParseFaults(os.Getenv(
//     comm.FaultEnvVar)) likewise.
//  2. root := StartRoot(system, RootConfig{Rank, Policy, Dumper, Events, Exit}).
//  3. rec := NewFlightRecorder(RecorderConfig{Job, Rank, WorldSize,
//     Capacity: cfg.TraceBufferSize}); dumper := Dumper{rec, cfg.TraceDir, store}.
//  4. Start the event publisher (actors.NewEventPublisher with
//     Level: cfg.Events) under root; ServeDumps(nc, job, rank, rec, dumper, log).
//  5. wd, _ := NewWatchdog(WatchdogConfig{Rank, Cfg: cfg, Store, Dumper: dumper,
//     Events: publisher, Metrics: workMetrics (optional), Exit});
//     wd.Start(system, root); then
//     NewHeartbeatMonitor(HeartbeatConfig{Beat: wd.Heartbeat(), Timeout:
//     cfg.HeartbeatTimeout, Dumper, Exit}).Start(system, root).
//  6. Per communicator (group × epoch): rec.AddGroup(name, epoch, groupRank,
//     globalRanks); wd.Register(GroupSpec{Name, Epoch, Engine, Members,
//     Timeout}, backend, backend); and give the communicator actor
//     actors.Observers{rec.Observer(name, groupTimeout), wd.Observer(name)},
//     Parent: root and OnPanic: Rank.ActorPanicked, so that its panics
//     follow cfg.ActorPanic (RANKTREE_ACTOR_PANIC).
//     ProcessGroup.SetTimeout calls wd.SetTimeout; Destroy calls
//     wd.Deregister after failing its Works.
//  7. Exit funcs should close the event publisher (flushing events) and the
//     NATS connection before os.Exit.
//  8. Close: wd.Stop, the heartbeat monitor's Stop, root.Stop, each bounded.
//
// Errors the watchdog puts on Works: *comm.TimeoutError (ErrTimeout),
// *comm.EngineError (ErrEngine), *comm.RemoteAbortError (ErrRemoteAbort)
// and *comm.AbortedError (ErrAborted) for the other Works of an aborted
// group; all are recoverable by re-creating the group (CleanupOnly) or the
// job (TearDown).
package supervisor
