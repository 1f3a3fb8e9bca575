// Package e2e holds in-process end-to-end tests of package supervisor with
// the real engines, communicator actors and stores (comm/cpu,
// actors.Communicator, store/natsstore). They live apart from the
// supervisor's unit tests so that those build without the engines.
package e2e
