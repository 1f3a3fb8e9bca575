package test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Helpers of the rankrunner end-to-end tests. The rankrunner and rankprog
// binaries are built once per test binary run into a temporary directory
// (no TestMain, so other end-to-end tests in this package keep theirs).

var rrBins struct {
	once         sync.Once
	dir          string
	runner, prog string
	err          error
}

// rrBuild returns the paths of the rankrunner and rankprog binaries.
func rrBuild(t *testing.T) (runner, prog string) {
	t.Helper()
	rrBins.once.Do(func() {
		// Remove directories left by earlier runs (a test binary has no
		// end-of-package hook without TestMain).
		old, _ := filepath.Glob(filepath.Join(os.TempDir(), "ranktree-rankrunner-e2e-*"))
		for _, d := range old {
			if st, err := os.Stat(d); err == nil && time.Since(st.ModTime()) > time.Hour {
				os.RemoveAll(d)
			}
		}
		dir, err := os.MkdirTemp("", "ranktree-rankrunner-e2e-")
		if err != nil {
			rrBins.err = err
			return
		}
		rrBins.dir = dir
		rrBins.runner = filepath.Join(dir, "rankrunner")
		rrBins.prog = filepath.Join(dir, "rankprog")
		for _, b := range [][2]string{{rrBins.runner, "./cmd/rankrunner"}, {rrBins.prog, "./test/progs/rankprog"}} {
			cmd := exec.Command("go", "build", "-o", b[0], b[1])
			cmd.Dir = ".."
			if out, err := cmd.CombinedOutput(); err != nil {
				rrBins.err = fmt.Errorf("go build %s: %v\n%s", b[1], err, out)
				return
			}
		}
	})
	if rrBins.err != nil {
		t.Fatal(rrBins.err)
	}
	return rrBins.runner, rrBins.prog
}

// rrProgs are the test programs that link the runtime (initprog, obsprog),
// built on first use so that only the tests using them depend on it.
var rrProgs struct {
	mu    sync.Mutex
	built map[string]string
	errs  map[string]error
}

// rrBuildProg builds ./test/progs/<name> once per test binary run.
func rrBuildProg(t *testing.T, name string) string {
	t.Helper()
	rrBuild(t)
	rrProgs.mu.Lock()
	defer rrProgs.mu.Unlock()
	if rrProgs.built == nil {
		rrProgs.built, rrProgs.errs = map[string]string{}, map[string]error{}
	}
	if _, ok := rrProgs.built[name]; !ok {
		path := filepath.Join(rrBins.dir, name)
		cmd := exec.Command("go", "build", "-o", path, "./test/progs/"+name)
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			rrProgs.errs[name] = fmt.Errorf("go build ./test/progs/%s: %v\n%s", name, err, out)
		}
		rrProgs.built[name] = path
	}
	if err := rrProgs.errs[name]; err != nil {
		t.Fatal(err)
	}
	return rrProgs.built[name]
}

// rrSyncBuffer is a bytes.Buffer safe for a process's output goroutine and the test.
type rrSyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *rrSyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *rrSyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// rrProc is a running rankrunner.
type rrProc struct {
	cmd            *exec.Cmd
	stdout, stderr *rrSyncBuffer
	done           chan struct{}
	code           int
	exited         time.Time
}

// rrStartRunner starts the rankrunner binary with args (in the module root).
// It is killed at the end of the test if still running.
func rrStartRunner(t *testing.T, args ...string) *rrProc {
	t.Helper()
	return rrStartRunnerEnv(t, nil, args...)
}

// rrStartRunnerEnv is rrStartRunner with extra environment entries (scheduler
// variables).
func rrStartRunnerEnv(t *testing.T, extra []string, args ...string) *rrProc {
	t.Helper()
	runner, _ := rrBuild(t)
	p := &rrProc{stdout: &rrSyncBuffer{}, stderr: &rrSyncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(runner, args...)
	p.cmd.Dir = ".."
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	p.cmd.Env = append(rrCleanEnv(), extra...)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := p.cmd.Wait()
		p.exited = time.Now()
		p.code = 0
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
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("rankrunner %v\nstdout:\n%s\nstderr:\n%s", args, p.stdout, p.stderr)
		}
	})
	return p
}

// rrCleanEnv is the test's environment without scheduler or contract
// variables that would change rankrunner's behaviour.
func rrCleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "SLURM_") || strings.HasPrefix(k, "RANKTREE_") || k == "JOB_COMPLETION_INDEX" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// wait waits up to d for the runner to exit and returns its exit code.
func (p *rrProc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(d):
		t.Fatalf("rankrunner still running after %v", d)
		return -1
	}
}

// rrRunRunner runs rankrunner to completion (bounded by d).
func rrRunRunner(t *testing.T, d time.Duration, args ...string) *rrProc {
	t.Helper()
	p := rrStartRunner(t, args...)
	p.wait(t, d)
	return p
}

// rrFreePort returns a TCP port that was free a moment ago on 127.0.0.1.
func rrFreePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// rrWaitFiles waits up to d until every path exists.
func rrWaitFiles(t *testing.T, d time.Duration, paths ...string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for _, p := range paths {
		for {
			if _, err := os.Stat(p); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s did not appear within %v", p, d)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// rrReadPID reads a pid file written by rankprog.
func rrReadPID(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(string(b))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return pid
}

// rrPidAlive reports whether pid is a live (non-zombie) process, from /proc.
func rrPidAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// Fields after the parenthesised command name: state is the first.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	return s[i+2] != 'Z' && s[i+2] != 'X'
}

// rrAllPIDs reads every pid-* file in dir.
func rrAllPIDs(t *testing.T, dir string) map[string]int {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "pid-*"))
	out := map[string]int{}
	for _, f := range files {
		out[filepath.Base(f)] = rrReadPID(t, f)
	}
	return out
}

// rrAssertNoOrphans fails if any rank process recorded in dir is still alive
// within d (a rank reparented to init after the runner's exit would be).
func rrAssertNoOrphans(t *testing.T, dir string, d time.Duration) {
	t.Helper()
	pids := rrAllPIDs(t, dir)
	if len(pids) == 0 {
		t.Fatal("no pid files: ranks never started")
	}
	deadline := time.Now().Add(d)
	for name, pid := range pids {
		for rrPidAlive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("rank process %s (pid %d) still alive %v after the runner exited", name, pid, d)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// rrRanksGone polls /proc until every rank process recorded in dir is gone
// and returns when that happened (it gives up after limit).
func rrRanksGone(t *testing.T, dir string, limit time.Duration) time.Time {
	t.Helper()
	pids := rrAllPIDs(t, dir)
	deadline := time.Now().Add(limit)
	for {
		alive := 0
		for _, pid := range pids {
			if rrPidAlive(pid) {
				alive++
			}
		}
		if alive == 0 {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rank processes still alive after %v", alive, limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
