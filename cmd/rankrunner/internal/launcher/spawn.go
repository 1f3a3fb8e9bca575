package launcher

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
)

// Rank processes are started with Setpgid (each rank leads its own process
// group, so a signal reaches the rank and anything it spawned, and a
// terminal's Ctrl-C reaches only the runner, which forwards it) and
// Pdeathsig SIGKILL (the kernel kills the rank when the runner dies, even by
// SIGKILL, so no rank is ever orphaned).
//
// Pdeathsig fires when the *thread* that forked the child exits, not the
// process. Go may retire OS threads, so every rank is forked from one
// goroutine locked to its OS thread for the life of the runner process:
// spawnLoop never returns and never unlocks.

type spawnReq struct {
	cmd  *exec.Cmd
	cpus []int // bind the child to these CPUs (nil: inherit)
	done chan error
}

var (
	spawnOnce sync.Once
	spawnCh   chan spawnReq
)

func spawnLoop(ch <-chan spawnReq) {
	runtime.LockOSThread() // never unlocked: the thread must outlive every rank
	for r := range ch {
		r.done <- withAffinity(r.cpus, r.cmd.Start)
	}
}

// startPinned starts cmd from the runner's pinned spawner thread, bound to
// cpus unless nil (see withAffinity).
func startPinned(cmd *exec.Cmd, cpus []int) error {
	spawnOnce.Do(func() {
		spawnCh = make(chan spawnReq)
		go spawnLoop(spawnCh)
	})
	req := spawnReq{cmd: cmd, cpus: cpus, done: make(chan error, 1)}
	spawnCh <- req
	return <-req.done
}

// proc is one started rank process.
type proc struct {
	slot   RankSlot
	local  int // index in the attempt's slot list
	cmd    *exec.Cmd
	pid    int
	reaped atomic.Bool
	pumps  sync.WaitGroup
	out    *rankOutput
}

// startRank starts one rank with env, its streams pumped to out, bound to
// cpus unless nil.
func startRank(path string, args, env []string, local int, slot RankSlot, out *rankOutput, cpus []int) (*proc, error) {
	cmd := exec.Command(path, args...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	cmd.Stdin = nil // /dev/null, as torchrun
	cmd.Stdout, cmd.Stderr = outW, errW
	err = startPinned(cmd, cpus)
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return nil, fmt.Errorf("launcher: start rank %d: %w", slot.Rank, err)
	}
	p := &proc{slot: slot, local: local, cmd: cmd, pid: cmd.Process.Pid, out: out}
	p.pumps.Add(2)
	go func() { defer p.pumps.Done(); defer outR.Close(); out.stdout.run(outR) }()
	go func() { defer p.pumps.Done(); defer errR.Close(); out.stderr.run(errR) }()
	return p, nil
}

// wait reaps the process and returns its exit code: the status, or
// 128+signal for a signal death (the shell's convention), with the signal.
func (p *proc) wait() (int, syscall.Signal) {
	err := p.cmd.Wait()
	p.reaped.Store(true)
	if err == nil {
		return 0, 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), ws.Signal()
		}
		if c := ee.ExitCode(); c > 0 {
			return c, 0
		}
	}
	return 1, 0
}

// signal sends sig to the rank's process group (and to the rank itself,
// should it have left the group).
func (p *proc) signal(sig syscall.Signal) error {
	if p.reaped.Load() {
		return nil
	}
	err := syscall.Kill(-p.pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		err = syscall.Kill(p.pid, sig)
	}
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("launcher: signal %v to rank %d (pid %s): %w", sig, p.slot.Rank, strconv.Itoa(p.pid), err)
	}
	return nil
}
