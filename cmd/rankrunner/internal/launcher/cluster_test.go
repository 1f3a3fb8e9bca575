package launcher

import (
	"reflect"
	"strings"
	"testing"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestDetectCluster(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		want Cluster
		err  string
	}{
		{"none", nil, Cluster{NodeRank: -1, NNodes: -1}, ""},
		{"slurm task per node", map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "77"},
			Cluster{Kind: "slurm", NodeRank: 1, NNodes: 2, JobID: "slurm-77"}, ""},
		{"slurm task per rank", map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_LOCALID": "1"},
			Cluster{Kind: "slurm", NodeRank: 1, NNodes: 2, Task: &TaskSlot{Rank: 5, WorldSize: 8, LocalRank: 1, LocalWorldSize: 4}}, ""},
		{"slurm explicit per node", map[string]string{"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "2"},
			Cluster{Kind: "slurm", NodeRank: 1, NNodes: 2, Task: &TaskSlot{Rank: 2, WorldSize: 3, LocalRank: 0, LocalWorldSize: 2}}, ""},
		{"slurm uneven", map[string]string{"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_NNODES": "2", "SLURM_LOCALID": "0"}, Cluster{}, "not a multiple"},
		{"slurm bad", map[string]string{"SLURM_PROCID": "x", "SLURM_NTASKS": "3"}, Cluster{}, "SLURM_PROCID"},
		{"kubernetes", map[string]string{"JOB_COMPLETION_INDEX": "3"}, Cluster{Kind: "kubernetes", NodeRank: 3, NNodes: -1}, ""},
		{"kubernetes bad", map[string]string{"JOB_COMPLETION_INDEX": "-1"}, Cluster{}, "JOB_COMPLETION_INDEX"},
	}
	for _, c := range cases {
		got, err := DetectCluster(envOf(c.env))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err %v, want one naming %s", c.name, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %+v (task %+v), %v; want %+v", c.name, got, got.Task, err, c.want)
		}
	}
}
