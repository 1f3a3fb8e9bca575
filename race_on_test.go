//go:build race

package ranktree

// raceEnabled: the race detector is on; it makes sync.Pool drop items at
// random, so allocation counts are not asserted.
const raceEnabled = true
