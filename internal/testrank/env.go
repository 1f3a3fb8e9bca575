package testrank

import (
	"os"
	"strings"
)

// LauncherEnv is this process's environment without the env contract
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK and every
// RANKTREE_ variable), for tests that start rankrunner: an outer launcher's
// settings must not leak into the job under test.
func LauncherEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "RANK", k == "WORLD_SIZE", k == "LOCAL_RANK", k == "LOCAL_WORLD_SIZE", k == "GROUP_RANK", strings.HasPrefix(k, "RANKTREE_"):
		default:
			env = append(env, kv)
		}
	}
	return env
}
