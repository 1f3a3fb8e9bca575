package testrank

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
)

// Environment of a child rank process started by Spawn.
const (
	EnvRank = "RANKTREE_TESTRANK_RANK" // this process's rank
	EnvSize = "RANKTREE_TESTRANK_SIZE" // the number of rank processes
	EnvDir  = "RANKTREE_TESTRANK_DIR"  // a directory shared by the ranks (FileStore)
	EnvTest = "RANKTREE_TESTRANK_TEST" // the full name of the test the child runs
)

// Proc identifies a child rank process.
type Proc struct {
	Rank, Size int
	Dir        string // shared by every rank of the run
}

// Current reports whether this process is a rank started by Spawn for the
// test t (Gloo's multiproc_test pattern: the test re-executes its own
// binary). A test calls it first and, when true, runs its rank's part.
func Current(t testing.TB) (Proc, bool) {
	if os.Getenv(EnvTest) != t.Name() {
		return Proc{}, false
	}
	r, err1 := strconv.Atoi(os.Getenv(EnvRank))
	n, err2 := strconv.Atoi(os.Getenv(EnvSize))
	if err1 != nil || err2 != nil || r < 0 || r >= n {
		t.Fatalf("testrank: bad child environment %s=%q %s=%q", EnvRank, os.Getenv(EnvRank), EnvSize, os.Getenv(EnvSize))
	}
	return Proc{Rank: r, Size: n, Dir: os.Getenv(EnvDir)}, true
}

// runPattern anchors every element of a (sub)test name for -test.run.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// Spawn runs the current test binary as n rank processes that each run
// only test t (which must call Current), with env added to their
// environment, and waits for them. Every rank's output is logged; a rank
// that fails or exits non-zero fails t. Once one rank has failed the others
// get 10 s to finish before they are killed; all are killed after timeout.
func Spawn(t *testing.T, n int, timeout time.Duration, env ...string) {
	t.Helper()
	outs, err := RunRanks(t.Name(), t.TempDir(), n, timeout, env...)
	if err != nil {
		t.Error(err)
	}
	for r, out := range outs {
		if err != nil {
			t.Logf("rank %d of %d output:\n%s", r, n, tail(out, 6000))
		} else if testing.Verbose() {
			t.Logf("rank %d of %d:\n%s", r, n, tail(out, 2000))
		}
	}
}

// RunRanks is Spawn's engine: it runs n ranks of the test named test with
// dir shared, and returns each rank's output and an error naming every
// rank that failed (exit status, a "--- FAIL" line, or no "PASS").
func RunRanks(test, dir string, n int, timeout time.Duration, env ...string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	type result struct {
		out bytes.Buffer
		err error
	}
	res := make([]*result, n)
	var wg sync.WaitGroup
	var failOnce sync.Once
	for r := 0; r < n; r++ {
		res[r] = &result{}
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", runPattern(test), "-test.count=1", "-test.v",
			"-test.timeout", timeout.String())
		cmd.Env = append(os.Environ(), EnvRank+"="+strconv.Itoa(r), EnvSize+"="+strconv.Itoa(n), EnvDir+"="+dir, EnvTest+"="+test)
		cmd.Env = append(cmd.Env, env...)
		cmd.Stdout = &res[r].out
		cmd.Stderr = &res[r].out
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Start(); err != nil {
			cancel()
			wg.Wait()
			return nil, fmt.Errorf("starting rank %d: %w", r, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[r].err = cmd.Wait()
			if res[r].err != nil {
				failOnce.Do(func() { time.AfterFunc(10*time.Second, cancel) })
			}
		}()
	}
	wg.Wait()
	outs := make([]string, n)
	var failed []string
	for r, rs := range res {
		outs[r] = rs.out.String()
		switch {
		case rs.err != nil:
			failed = append(failed, fmt.Sprintf("rank %d (%v)", r, rs.err))
		case strings.Contains(outs[r], "--- FAIL") || !strings.Contains(outs[r], "PASS"):
			failed = append(failed, fmt.Sprintf("rank %d (test failed)", r))
		}
	}
	if len(failed) > 0 {
		return outs, fmt.Errorf("testrank: %d of %d ranks of %s failed: %s", len(failed), n, test, strings.Join(failed, ", "))
	}
	return outs, nil
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "...\n" + s[len(s)-n:]
}

// Store opens the run's shared FileStore.
func (p Proc) Store() (*FileStore, error) { return NewFileStore(p.Dir+"/store", 60*time.Second) }

// World creates this rank's world group over the shared FileStore with
// engines from bf (e.g. cpu.Factory(opts)), through a communicator actor.
func (p Proc) World(ctx context.Context, engine string, bf comm.BackendFactory, log zerolog.Logger) (*comm.ProcessGroup, error) {
	st, err := p.Store()
	if err != nil {
		return nil, err
	}
	f := BackendFactoryFactory(QuietSystem(), engine, bf, st, log.With().Int("rank", p.Rank).Logger())
	pg, err := f.World(ctx, p.Rank, p.Size)
	if err != nil {
		return nil, fmt.Errorf("rank %d of %d: %w", p.Rank, p.Size, err)
	}
	return pg, nil
}
