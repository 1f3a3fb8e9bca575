package launcher

import "strconv"

// rankEnv is the environment of one rank: the base environment, then the
// env contract (later entries win in os/exec). worldSize and localWorld are
// the job's and this node's rank counts; attempt is RANKTREE_RESTART_COUNT.
func rankEnv(cfg *Config, url string, slot RankSlot, worldSize, localWorld, attempt int) []string {
	env := make([]string, 0, len(cfg.Env)+16)
	env = append(env, cfg.Env...)
	kv := func(k string, v int) { env = append(env, k+"="+strconv.Itoa(v)) }
	kv(EnvRank, slot.Rank)
	kv(EnvWorldSize, worldSize)
	kv(EnvLocalRank, slot.LocalRank)
	kv(EnvLocalWorldSize, localWorld)
	kv(EnvGroupRank, cfg.NodeRank)
	kv(EnvRestartCount, attempt)
	env = append(env, EnvNATSURL+"="+url, EnvJob+"="+cfg.JobID)
	if cfg.Timeout > 0 {
		env = append(env, EnvTimeout+"="+cfg.Timeout.String())
	}
	return append(env, cfg.Creds.Env()...)
}
