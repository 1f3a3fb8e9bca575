package launcher

import "github.com/ranktree/ranktree"

// Environment variable names of the env contract between rankrunner and
// ranktree.Init (torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// GROUP_RANK and TORCHELASTIC_RESTART_COUNT, plus ranktree's control-plane
// variables), taken from the root package so the two sides cannot drift.
const (
	EnvRank           = ranktree.EnvRank           // global rank, 0..WORLD_SIZE-1
	EnvWorldSize      = ranktree.EnvWorldSize      // number of ranks in the job
	EnvLocalRank      = ranktree.EnvLocalRank      // rank within this node
	EnvLocalWorldSize = ranktree.EnvLocalWorldSize // ranks on this node
	EnvNodeRank       = ranktree.EnvNodeRank       // node rank (torchrun's group rank)
	EnvNATSURL        = ranktree.EnvNATSURL        // control-plane NATS URL
	EnvJob            = ranktree.EnvJob            // job id (KV bucket and event subjects)
	EnvRestartCount   = ranktree.EnvRestartCount   // 0 for the first attempt, +1 per restart
	EnvTimeout        = ranktree.EnvTimeout        // collective default timeout, Go duration
	EnvStoreWait      = ranktree.EnvStoreWait      // keep retrying a refused store URL
	EnvErrorFile      = ranktree.EnvErrorFile      // where the rank writes the error that ends it
)

// Scheduler variables read by DetectCluster.
const (
	envSlurmProcID        = "SLURM_PROCID"
	envSlurmNTasks        = "SLURM_NTASKS"
	envSlurmLocalID       = "SLURM_LOCALID"
	envSlurmNodeID        = "SLURM_NODEID"
	envSlurmNNodes        = "SLURM_NNODES"
	envSlurmJobID         = "SLURM_JOB_ID"
	envSlurmTasksPerNode  = "SLURM_NTASKS_PER_NODE"
	envK8sCompletionIndex = "JOB_COMPLETION_INDEX"
)
