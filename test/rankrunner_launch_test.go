package test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRankrunnerEnvContract launches a Go package (built by rankrunner)
// with 3 ranks and checks every rank's env contract, the "[rank N]" line
// prefixes on stdout and stderr, and the per-rank log files.
func TestRankrunnerEnvContract(t *testing.T) {
	t.Parallel()
	rrBuild(t)
	dir, logs := t.TempDir(), t.TempDir()
	p := rrRunRunner(t, 120*time.Second, "--nproc-per-node", "3", "--job-id", "envjob", "--timeout", "90s",
		"--nats-token", "s3cret", "--log-dir", logs, "./test/progs/rankprog", "env", dir)
	if p.code != 0 {
		t.Fatalf("exit code %d, want 0", p.code)
	}
	var url string
	for r := 0; r < 3; r++ {
		b, err := os.ReadFile(filepath.Join(dir, "env-"+strconv.Itoa(r)+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var env map[string]string
		if err := json.Unmarshal(b, &env); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{
			"RANK": strconv.Itoa(r), "WORLD_SIZE": "3", "LOCAL_RANK": strconv.Itoa(r), "LOCAL_WORLD_SIZE": "3",
			"GROUP_RANK": "0", "RANKTREE_JOB": "envjob", "RANKTREE_RESTART_COUNT": "0",
			"RANKTREE_TIMEOUT": "1m30s", "RANKTREE_NATS_TOKEN": "s3cret",
		}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("rank %d: %s=%q, want %q", r, k, env[k], v)
			}
		}
		if !strings.HasPrefix(env["RANKTREE_NATS_URL"], "nats://127.0.0.1:") {
			t.Errorf("rank %d: RANKTREE_NATS_URL=%q, want the embedded server's", r, env["RANKTREE_NATS_URL"])
		}
		if url == "" {
			url = env["RANKTREE_NATS_URL"]
		} else if env["RANKTREE_NATS_URL"] != url {
			t.Errorf("rank %d: RANKTREE_NATS_URL=%q differs from rank 0's %q", r, env["RANKTREE_NATS_URL"], url)
		}
		if !strings.Contains(p.stdout.String(), "[rank "+strconv.Itoa(r)+"] env written by rank "+strconv.Itoa(r)+"\n") {
			t.Errorf("stdout lacks rank %d's prefixed line", r)
		}
		if !strings.Contains(p.stderr.String(), "[rank "+strconv.Itoa(r)+"] stderr line of rank "+strconv.Itoa(r)+"\n") {
			t.Errorf("stderr lacks rank %d's prefixed line", r)
		}
		out, err := os.ReadFile(filepath.Join(logs, "envjob", "attempt_0", strconv.Itoa(r), "stdout.log"))
		if err != nil {
			t.Fatal(err)
		}
		if string(out) != "env written by rank "+strconv.Itoa(r)+"\n" {
			t.Errorf("rank %d stdout.log = %q", r, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "env-3.json")); err == nil {
		t.Error("a fourth rank ran")
	}
}

// TestRankrunnerRedirects checks --redirects: rank 0's stdout goes to its
// log file only, rank 1's stays on the console.
func TestRankrunnerRedirects(t *testing.T) {
	t.Parallel()
	_, prog := rrBuild(t)
	dir, logs := t.TempDir(), t.TempDir()
	p := rrRunRunner(t, 60*time.Second, "--nproc-per-node", "2", "--job-id", "redir", "--log-dir", logs,
		"--redirects", "0:1", prog, "env", dir)
	if p.code != 0 {
		t.Fatalf("exit code %d, want 0", p.code)
	}
	if strings.Contains(p.stdout.String(), "[rank 0]") {
		t.Errorf("rank 0's stdout reached the console despite --redirects 0:1:\n%s", p.stdout)
	}
	if !strings.Contains(p.stdout.String(), "[rank 1] env written by rank 1") {
		t.Errorf("rank 1's stdout missing from the console:\n%s", p.stdout)
	}
	b, err := os.ReadFile(filepath.Join(logs, "redir", "attempt_0", "0", "stdout.log"))
	if err != nil || string(b) != "env written by rank 0\n" {
		t.Errorf("rank 0 stdout.log = %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(logs, "redir", "attempt_0", "1")); err == nil {
		t.Error("rank 1 got a log directory though --redirects selected only local rank 0")
	}
}

// TestRankrunnerBadFlags checks that command-line mistakes exit 2 with a
// message naming the flag.
func TestRankrunnerBadFlags(t *testing.T) {
	t.Parallel()
	_, prog := rrBuild(t)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--nproc-per-node", "abc", prog}, "--nproc-per-node"},
		{[]string{"--bogus", prog}, "--bogus"},
		{[]string{"--nnodes", "2", "--node-rank", "2", "--job-id", "x", prog}, "--node-rank"},
		{[]string{"--nnodes", "2", "--node-rank", "1", "--job-id", "x", prog}, "--nats"},
		{[]string{"--nnodes", "2", prog}, "--job-id"},
		{[]string{"--max-restarts", "-1", prog}, "--max-restarts"},
		{[]string{"--monitor-interval", "soon", prog}, "--monitor-interval"},
		{[]string{"--tee", "7", "--log-dir", t.TempDir(), prog}, "--tee"},
		{[]string{"--job-id", "bad.id", prog}, "--job-id"},
		{[]string{"--nnodes", "1"}, "PROGRAM"},
		{[]string{"--standalone", "--nnodes", "2", "--job-id", "x", prog}, "--standalone"},
		{[]string{"events", "--job", "bad.job"}, "--job"},
		{[]string{"events", "--job", "j", "--duration", "x"}, "--duration"},
	}
	for _, c := range cases {
		p := rrRunRunner(t, 60*time.Second, c.args...)
		if p.code != 2 {
			t.Errorf("rankrunner %v: exit code %d, want 2 (usage error); stderr:\n%s", c.args, p.code, p.stderr)
			continue
		}
		if !strings.Contains(p.stderr.String(), c.want) {
			t.Errorf("rankrunner %v: stderr does not name %s:\n%s", c.args, c.want, p.stderr)
		}
	}
}

// TestRankrunnerMissingProgram checks a program that does not exist is a
// clear error, not a usage error or a hang.
func TestRankrunnerMissingProgram(t *testing.T) {
	t.Parallel()
	p := rrRunRunner(t, 60*time.Second, "./no/such/program")
	if p.code != 1 || !strings.Contains(p.stderr.String(), "no such file") {
		t.Fatalf("exit code %d, stderr:\n%s", p.code, p.stderr)
	}
}

// TestRankrunnerColorOnTerminal: on a terminal (script(1) provides a pty)
// the "[rank N]" prefixes are coloured; TestRankrunnerEnvContract shows
// they are plain on a pipe.
func TestRankrunnerColorOnTerminal(t *testing.T) {
	t.Parallel()
	script, err := exec.LookPath("script")
	if err != nil {
		t.Skip("script(1) not installed: no pty to test with")
	}
	runner, prog := rrBuild(t)
	dir := t.TempDir()
	cmd := exec.Command(script, "-qec", runner+" --nproc-per-node 2 "+prog+" env "+dir, "/dev/null")
	cmd.Env = rrCleanEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(string(out), "\x1b[36m[rank 0]\x1b[0m env written by rank 0") {
		t.Fatalf("no coloured prefix on a terminal:\n%q", out)
	}
}
