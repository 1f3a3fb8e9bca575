package test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ranktree/ranktree/store/natsstore"
)

// Helpers of the supervision end-to-end tests (issue 4): each test starts
// an embedded NATS server and runs its ranks as real processes of
// test/progs/superprog, launched directly with the env contract (so that a
// test sees each rank's exit code and can SIGKILL one), and reads the
// "RESULT {json}" lines they print.

// spResult mirrors superprog's Result.
type spResult struct {
	Rank  int      `json:"rank"`
	Step  string   `json:"step"`
	Seq   uint64   `json:"seq"`
	Epoch uint32   `json:"epoch"`
	OK    bool     `json:"ok"`
	Err   string   `json:"err"`
	Is    []string `json:"is"`
	MS    float64  `json:"ms"`
	At    int64    `json:"at"`
}

func (r spResult) is(name string) bool {
	for _, s := range r.Is {
		if s == name {
			return true
		}
	}
	return false
}

// spRank is one running rank process.
type spRank struct {
	rank           int
	cmd            *exec.Cmd
	stdout, stderr *rrSyncBuffer
	done           chan struct{}
	code           int // exit code; 128+signal if killed
}

// spNATS starts an embedded NATS server for one test and returns its URL.
func spNATS(t *testing.T) string {
	t.Helper()
	url, shutdown, err := natsstore.StartEmbedded(natsstore.EmbeddedOptions{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(shutdown)
	return url
}

// spLaunch starts n superprog ranks of job on the NATS server at url, with
// extra environment entries (RANKTREE_FAULT, ...) and superprog's args.
// Ranks still running at the end of the test are killed.
func spLaunch(t *testing.T, url, job string, n int, extra []string, args ...string) []*spRank {
	t.Helper()
	prog := rrBuildProg(t, "superprog")
	ranks := make([]*spRank, n)
	for r := range ranks {
		p := &spRank{rank: r, stdout: &rrSyncBuffer{}, stderr: &rrSyncBuffer{}, done: make(chan struct{})}
		p.cmd = exec.Command(prog, args...)
		p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
		p.cmd.Env = append(rrCleanEnv(),
			fmt.Sprintf("RANK=%d", r), fmt.Sprintf("WORLD_SIZE=%d", n), fmt.Sprintf("LOCAL_RANK=%d", r),
			fmt.Sprintf("LOCAL_WORLD_SIZE=%d", n), "GROUP_RANK=0", "RANKTREE_NATS_URL="+url, "RANKTREE_JOB="+job)
		p.cmd.Env = append(p.cmd.Env, extra...)
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			err := p.cmd.Wait()
			if ee, ok := err.(*exec.ExitError); ok {
				p.code = ee.ExitCode()
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					p.code = 128 + int(ws.Signal())
				}
			} else if err != nil {
				p.code = -1
			}
			close(p.done)
		}()
		ranks[r] = p
	}
	t.Cleanup(func() {
		for _, p := range ranks {
			select {
			case <-p.done:
			default:
				p.cmd.Process.Kill()
				<-p.done
			}
			if t.Failed() {
				t.Logf("rank %d (exit %d) stdout:\n%s\nstderr:\n%s", p.rank, p.code, p.stdout, tail(p.stderr.String(), 4000))
			}
		}
	})
	return ranks
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// spWait waits up to d for every rank to exit and returns their exit codes.
func spWait(t *testing.T, ranks []*spRank, d time.Duration) []int {
	t.Helper()
	deadline := time.After(d)
	codes := make([]int, len(ranks))
	for i, p := range ranks {
		select {
		case <-p.done:
			codes[i] = p.code
		case <-deadline:
			t.Fatalf("rank %d still running after %v", p.rank, d)
		}
	}
	return codes
}

// results parses the rank's RESULT lines so far.
func (p *spRank) results(t *testing.T) []spResult {
	t.Helper()
	var out []spResult
	sc := bufio.NewScanner(strings.NewReader(p.stdout.String()))
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "RESULT ")
		if !ok {
			continue
		}
		var r spResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("rank %d: bad RESULT line %q: %v", p.rank, line, err)
		}
		out = append(out, r)
	}
	return out
}

// step returns the rank's first result of step (and whether there is one).
func (p *spRank) step(t *testing.T, step string) (spResult, bool) {
	t.Helper()
	for _, r := range p.results(t) {
		if r.Step == step {
			return r, true
		}
	}
	return spResult{}, false
}

// mustStep is step, failing the test when the rank printed none.
func (p *spRank) mustStep(t *testing.T, step string) spResult {
	t.Helper()
	r, ok := p.step(t, step)
	if !ok {
		t.Fatalf("rank %d printed no %q result", p.rank, step)
	}
	return r
}

// firstFailure returns the rank's first failed "op" result.
func (p *spRank) firstFailure(t *testing.T) spResult {
	t.Helper()
	for _, r := range p.results(t) {
		if r.Step == "op" && !r.OK {
			return r
		}
	}
	t.Fatalf("rank %d: no op failed", p.rank)
	return spResult{}
}
