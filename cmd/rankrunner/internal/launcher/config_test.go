package launcher

import (
	"errors"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

func TestParseStdSpec(t *testing.T) {
	s, err := ParseStdSpec("3")
	if err != nil || s.For(0) != StdAll || s.For(7) != StdAll {
		t.Fatalf("3: %+v %v", s, err)
	}
	s, err = ParseStdSpec("0:1,2:2")
	if err != nil || s.For(0) != StdOut || s.For(1) != StdNone || s.For(2) != StdErr || s.IsZero() {
		t.Fatalf("0:1,2:2: %+v %v", s, err)
	}
	if s, _ := ParseStdSpec(""); !s.IsZero() {
		t.Fatal("empty spec selects streams")
	}
	for _, bad := range []string{"4", "x", "0:9", "a:1", "1"[:0] + "0:"} {
		if _, err := ParseStdSpec(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []struct {
		cfg  Config
		flag string
	}{
		{Config{}, "PROGRAM"},
		{Config{Program: "p", NNodes: 2, NodeRank: 2, JobID: "j"}, "--node-rank"},
		{Config{Program: "p", NNodes: 2, NodeRank: 1, JobID: "j"}, "--nats"},
		{Config{Program: "p", NNodes: 2}, "--job-id"},
		{Config{Program: "p", JobID: "a.b"}, "--job-id"},
		{Config{Program: "p", NProcPerNode: -1}, "--nproc-per-node"},
		{Config{Program: "p", MaxRestarts: -1}, "--max-restarts"},
		{Config{Program: "p", Tee: StdSpec{All: StdAll}}, "--log-dir"},
		{Config{Program: "p"}.withCreds("", "pw"), "--nats-password"},
		{Config{Program: "p", RunnerHeartbeat: -1}, "--runner-heartbeat"},
		{Config{Program: "p", RunnerHeartbeat: 5e9, RunnerTimeout: 9e9}, "--runner-timeout"},
	}
	for _, c := range bad {
		err := c.cfg.validate()
		var fe *FlagError
		if !errors.As(err, &fe) || fe.Flag != c.flag {
			t.Errorf("%+v: err %v, want a FlagError for %s", c.cfg, err, c.flag)
		}
	}
	c := Config{Program: "p", LogDir: "/tmp/x"}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	if c.NNodes != 1 || c.NProcPerNode != 1 || c.NATSListen != "127.0.0.1:0" || !strings.HasPrefix(c.JobID, "job-") ||
		c.Tee.All != StdAll || c.StopGrace <= 0 || c.FailureGrace != 3e9 || c.MonitorInterval <= 0 || c.RunnerHeartbeat != 5e9 || c.RunnerTimeout != 30e9 {
		t.Fatalf("defaults not filled: %+v", c)
	}
	ranks, world, local := (&Config{NProcPerNode: 2, NNodes: 3, NodeRank: 2}).slots()
	if !reflect.DeepEqual(ranks, []RankSlot{{4, 0}, {5, 1}}) || world != 6 || local != 2 {
		t.Fatalf("slots: %v %d %d", ranks, world, local)
	}
	task := &Config{Task: &TaskSlot{Rank: 5, WorldSize: 8, LocalRank: 1, LocalWorldSize: 4}}
	ranks, world, local = task.slots()
	if id, n := task.runnerID(); !reflect.DeepEqual(ranks, []RankSlot{{5, 1}}) || world != 8 || local != 4 || id != "task5" || n != 8 {
		t.Fatalf("task slots: %v %d %d %s %d", ranks, world, local, id, n)
	}
}

func (c Config) withCreds(user, pw string) Config {
	c.Creds.User, c.Creds.Password = user, pw
	return c
}

func TestRankEnv(t *testing.T) {
	c := &Config{NodeRank: 1, JobID: "j1", Env: []string{"PATH=/bin", "RANK=99"}}
	env := rankEnv(c, "nats://h:1", RankSlot{Rank: 3, LocalRank: 1}, 4, 2, 2, "")
	got := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		got[k] = v // later entries win, as in os/exec
	}
	want := map[string]string{"PATH": "/bin", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
		"GROUP_RANK": "1", "RANKTREE_RESTART_COUNT": "2", "RANKTREE_NATS_URL": "nats://h:1", "RANKTREE_JOB": "j1",
		"GOMAXPROCS": strconv.Itoa(max(1, runtime.NumCPU()/2))}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("env %v, want %v", got, want)
	}
	// A GOMAXPROCS the user set is kept.
	c.Env = append(c.Env, "GOMAXPROCS=7")
	for _, kv := range rankEnv(c, "nats://h:1", RankSlot{Rank: 3, LocalRank: 1}, 4, 2, 2, "") {
		if k, v, _ := strings.Cut(kv, "="); k == "GOMAXPROCS" && v != "7" {
			t.Fatalf("GOMAXPROCS=%s overrides the user's 7", v)
		}
	}
}
