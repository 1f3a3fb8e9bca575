package launcher

import (
	"runtime"
	"strconv"
	"strings"
)

// rankEnv is the environment of one rank: the base environment, then the
// env contract (later entries win in os/exec). worldSize and localWorld are
// the job's and this node's rank counts; attempt is RANKTREE_RESTART_COUNT;
// errFile, when set, is the rank's RANKTREE_ERROR_FILE.
// Unless the base environment sets GOMAXPROCS, each rank gets the node's
// cores divided among its local ranks (at least 1), as torchrun sets
// OMP_NUM_THREADS: ranks that each schedule on every core wake idle OS
// threads on every goroutine hand-off, which costs collectives latency.
func rankEnv(cfg *Config, url string, slot RankSlot, worldSize, localWorld, attempt int, errFile string) []string {
	env := make([]string, 0, len(cfg.Env)+16)
	env = append(env, cfg.Env...)
	kv := func(k string, v int) { env = append(env, k+"="+strconv.Itoa(v)) }
	kv(EnvRank, slot.Rank)
	kv(EnvWorldSize, worldSize)
	kv(EnvLocalRank, slot.LocalRank)
	kv(EnvLocalWorldSize, localWorld)
	kv(EnvNodeRank, cfg.NodeRank)
	kv(EnvRestartCount, attempt)
	env = append(env, EnvNATSURL+"="+url, EnvJob+"="+cfg.JobID)
	if !hasVar(cfg.Env, "GOMAXPROCS") {
		kv("GOMAXPROCS", max(1, runtime.NumCPU()/max(1, localWorld)))
	}
	if errFile != "" {
		env = append(env, EnvErrorFile+"="+errFile)
	}
	if cfg.StoreWait {
		env = append(env, EnvStoreWait+"=1")
	}
	if cfg.Timeout > 0 {
		env = append(env, EnvTimeout+"="+cfg.Timeout.String())
	}
	return append(env, cfg.Creds.Env()...)
}

// hasVar reports whether env sets name.
func hasVar(env []string, name string) bool {
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); ok && k == name {
			return true
		}
	}
	return false
}
