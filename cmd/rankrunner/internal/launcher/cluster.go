package launcher

import (
	"fmt"
	"strconv"
)

// Cluster is what DetectCluster learned from a scheduler's environment.
// Fields a scheduler does not provide are -1 (ints) or empty.
type Cluster struct {
	// Kind is "slurm", "kubernetes" or "" (none detected).
	Kind string
	// NodeRank and NNodes are the node's index and the node count (-1: unknown).
	NodeRank, NNodes int
	// Task is set when the scheduler started one task per rank (Slurm with
	// SLURM_NTASKS > SLURM_NNODES): rankrunner then runs exactly that rank.
	Task *TaskSlot
	// JobID is a job id derived from the scheduler's ("slurm-<SLURM_JOB_ID>").
	JobID string
}

// TaskSlot pins the one rank a runner launches when a scheduler already
// started one task per rank (srun --ntasks-per-node=GPUs).
type TaskSlot struct {
	Rank, WorldSize, LocalRank, LocalWorldSize int
}

// DetectCluster reads Slurm's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
// SLURM_NODEID, SLURM_NNODES, SLURM_NTASKS_PER_NODE, SLURM_JOB_ID) and a
// Kubernetes indexed Job's (JOB_COMPLETION_INDEX) variables through getenv.
//
// Slurm with one task per node (SLURM_NTASKS == SLURM_NNODES) gives the
// node rank and count, as torchrun under srun. Slurm with more tasks than
// nodes is one task per rank: the result's Task pins RANK, WORLD_SIZE,
// LOCAL_RANK and LOCAL_WORLD_SIZE. A Kubernetes indexed Job gives the node
// rank only (the node count is --nnodes). Malformed values are an error
// naming the variable.
func DetectCluster(getenv func(string) string) (Cluster, error) {
	c := Cluster{NodeRank: -1, NNodes: -1}
	num := func(name string) (int, bool, error) { return envNum(getenv, name) }
	procID, hasProc, err := num(envSlurmProcID)
	if err != nil {
		return c, err
	}
	ntasks, hasTasks, err := num(envSlurmNTasks)
	if err != nil {
		return c, err
	}
	if hasProc && hasTasks {
		return slurmCluster(c, getenv, procID, ntasks)
	}
	idx, ok, err := num(envK8sCompletionIndex)
	if err != nil {
		return c, err
	}
	if ok {
		c.Kind = "kubernetes"
		c.NodeRank = idx
	}
	return c, nil
}

// slurmCluster is DetectCluster under Slurm (SLURM_PROCID=procID and
// SLURM_NTASKS=ntasks set): one runner per node, or one task per rank.
func slurmCluster(c Cluster, getenv func(string) string, procID, ntasks int) (Cluster, error) {
	num := func(name string) (int, bool, error) { return envNum(getenv, name) }
	c.Kind = "slurm"
	if id := getenv(envSlurmJobID); id != "" {
		c.JobID = "slurm-" + id
	}
	nnodes, ok, err := num(envSlurmNNodes)
	if err != nil {
		return c, err
	}
	if !ok {
		nnodes = 1
	}
	nodeID, ok, err := num(envSlurmNodeID)
	if err != nil {
		return c, err
	}
	if !ok {
		nodeID = 0
	}
	if ntasks <= nnodes {
		// one runner per node
		c.NodeRank, c.NNodes = nodeID, nnodes
		if ntasks < nnodes {
			c.NNodes = ntasks
			c.NodeRank = procID
		}
		return c, nil
	}
	localID, ok, err := num(envSlurmLocalID)
	if err != nil {
		return c, err
	}
	if !ok {
		return c, fmt.Errorf("launcher: %s is set but %s is not", envSlurmNTasks, envSlurmLocalID)
	}
	perNode, ok, err := num(envSlurmTasksPerNode)
	if err != nil {
		return c, err
	}
	if !ok {
		if ntasks%nnodes != 0 {
			return c, fmt.Errorf("launcher: SLURM_NTASKS=%d is not a multiple of SLURM_NNODES=%d and SLURM_NTASKS_PER_NODE is unset", ntasks, nnodes)
		}
		perNode = ntasks / nnodes
	}
	if procID >= ntasks || localID >= perNode {
		return c, fmt.Errorf("launcher: SLURM_PROCID=%d / SLURM_LOCALID=%d out of range (SLURM_NTASKS=%d, %d per node)", procID, localID, ntasks, perNode)
	}
	c.NodeRank, c.NNodes = nodeID, nnodes
	c.Task = &TaskSlot{Rank: procID, WorldSize: ntasks, LocalRank: localID, LocalWorldSize: perNode}
	return c, nil
}

// envNum reads a non-negative integer variable; ok is false when unset.
func envNum(getenv func(string) string, name string) (n int, ok bool, err error) {
	v := getenv(name)
	if v == "" {
		return 0, false, nil
	}
	n, err = strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, false, fmt.Errorf("launcher: %s=%q is not a non-negative integer", name, v)
	}
	return n, true, nil
}
