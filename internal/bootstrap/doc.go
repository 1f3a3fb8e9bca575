// Package bootstrap is the work behind ranktree.Init and Runtime.Close,
// which the root package forwards to:
//
//   - Config (options.go, config.go): the With* options set it, merge fills
//     the rest from the env contract read once (internal/envcontract), and
//     validate checks it; bad values are *EnvError or *OptionError.
//   - Start (rank.go): metrics server (metrics.go), job store, the init
//     barrier under the dead-rank watch (deadranks.go: *InitError), then
//     the engine choice and the process groups (engine.go,
//     internal/groups).
//   - Rank.Close (rank.go): bounded, idempotent teardown.
//
// The root package re-exports the public names defined here (EnvError,
// OptionError, InitError, DeadRank, ...) as aliases with their docs.
package bootstrap
