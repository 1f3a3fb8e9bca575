// Package watchdogtest holds the integration tests of the NCCL engine with
// the supervisor's watchdog actor: a hung stream is timed out by the
// watchdog, which aborts the communicator (ncclCommAbort) and fails the
// Work with comm.ErrTimeout, while the process survives (CleanupOnly); an
// NCCL async error is picked up by the watchdog's AsyncError poll. It has
// no non-test code; it is a separate package so that the engine's own
// tests do not depend on the supervisor.
package watchdogtest
