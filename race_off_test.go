//go:build !race

package ranktree

// raceEnabled: the race detector is on (see race_on_test.go).
const raceEnabled = false
