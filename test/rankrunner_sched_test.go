package test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// rrReadEnvs reads the env-<rank>.json files of ranks 0..n-1.
func rrReadEnvs(t *testing.T, dir string, n int) []map[string]string {
	t.Helper()
	out := make([]map[string]string, n)
	for r := 0; r < n; r++ {
		b, err := os.ReadFile(filepath.Join(dir, "env-"+strconv.Itoa(r)+".json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &out[r]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestRankrunnerSlurmTaskPerRank: two runners started as Slurm tasks of one
// node (SLURM_NTASKS=2 > SLURM_NNODES=1) with one identical command line
// each run exactly their task's rank; task 0 serves NATS at --nats-listen.
func TestRankrunnerSlurmTaskPerRank(t *testing.T) {
	t.Parallel()
	_, prog := rrBuild(t)
	dir := t.TempDir()
	port := rrFreePort(t)
	args := []string{"--nats-listen", fmt.Sprintf("127.0.0.1:%d", port), "--nats", fmt.Sprintf("nats://127.0.0.1:%d", port), prog, "env", dir}
	var ps []*rrProc
	for task := 0; task < 2; task++ {
		ps = append(ps, rrStartRunnerEnv(t, []string{
			"SLURM_JOB_ID=4242", "SLURM_NTASKS=2", "SLURM_NNODES=1", "SLURM_NODEID=0",
			"SLURM_PROCID=" + strconv.Itoa(task), "SLURM_LOCALID=" + strconv.Itoa(task),
		}, args...))
	}
	for i, p := range ps {
		if c := p.wait(t, 90*time.Second); c != 0 {
			t.Errorf("task %d exit code %d", i, c)
		}
	}
	for r, env := range rrReadEnvs(t, dir, 2) {
		want := map[string]string{"RANK": strconv.Itoa(r), "WORLD_SIZE": "2", "LOCAL_RANK": strconv.Itoa(r),
			"LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "RANKTREE_JOB": "slurm-4242"}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("rank %d: %s=%q, want %q", r, k, env[k], v)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "env-2.json")); err == nil {
		t.Error("a third rank ran")
	}
}

// TestRankrunnerKubernetesIndexedJob: two pods of an indexed Job
// (JOB_COMPLETION_INDEX 0 and 1) with one identical command line form a
// 2-node job; the index is the node rank.
func TestRankrunnerKubernetesIndexedJob(t *testing.T) {
	t.Parallel()
	_, prog := rrBuild(t)
	dir := t.TempDir()
	port := rrFreePort(t)
	args := []string{"--nnodes", "2", "--nproc-per-node", "1", "--job-id", "k8sjob",
		"--nats-listen", fmt.Sprintf("127.0.0.1:%d", port), "--nats", fmt.Sprintf("nats://127.0.0.1:%d", port), prog, "env", dir}
	var ps []*rrProc
	for idx := 0; idx < 2; idx++ {
		ps = append(ps, rrStartRunnerEnv(t, []string{"JOB_COMPLETION_INDEX=" + strconv.Itoa(idx)}, args...))
	}
	for i, p := range ps {
		if c := p.wait(t, 90*time.Second); c != 0 {
			t.Errorf("pod %d exit code %d", i, c)
		}
	}
	for r, env := range rrReadEnvs(t, dir, 2) {
		want := map[string]string{"RANK": strconv.Itoa(r), "WORLD_SIZE": "2", "LOCAL_RANK": "0",
			"LOCAL_WORLD_SIZE": "1", "GROUP_RANK": strconv.Itoa(r), "RANKTREE_JOB": "k8sjob"}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("rank %d: %s=%q, want %q", r, k, env[k], v)
			}
		}
	}
}
