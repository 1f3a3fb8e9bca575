// Command rankprog is the rank program of rankrunner's end-to-end tests
// (test/rankrunner_*_test.go). Every mode first writes its pid to
// DIR/pid-<restart>-<rank> and DIR/attempt-<restart>-rank-<rank>, then:
//
//	rankprog env DIR                       write the env contract to DIR/env-<rank>.json, exit 0
//	rankprog fail DIR RANK CODE DELAY [OPT...]
//	                                       rank RANK writes DIR/failed-at (unix ns) and exits CODE
//	                                       after DELAY; the others block. OPT: ignore-term (the
//	                                       others ignore SIGTERM), until=N (from restart N on,
//	                                       every rank exits 0 at once)
//	rankprog sleep DIR [ignore-term]       block; on SIGTERM write DIR/term-<rank> (unix ns) and exit 0
//	                                       (ignore-term: record it but keep running)
//	rankprog crash DIR VICTIM REPORT [stay=R]
//	                                       rank VICTIM writes DIR/failed-at and kills itself with
//	                                       SIGKILL; every other rank waits for DIR/failed-at, then
//	                                       REPORT later prints "rankprog: rank R: error: lost rank
//	                                       VICTIM" to stderr, writes DIR/reported-<rank> and exits 12,
//	                                       except rank stay=R, which then blocks as sleep does
//
// It depends on nothing of ranktree, so the launcher's tests do not break
// while the runtime is being changed; obsprog and initprog use the runtime.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

var contract = []string{
	"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
	"RANKTREE_NATS_URL", "RANKTREE_JOB", "RANKTREE_RESTART_COUNT", "RANKTREE_TIMEOUT",
	"RANKTREE_NATS_TOKEN", "RANKTREE_NATS_USER", "RANKTREE_NATS_PASSWORD",
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: rankprog MODE DIR ...")
		os.Exit(64)
	}
	// The handler is installed before the pid file exists, so a test (or
	// the failing rank) that saw the file knows SIGTERM will be handled.
	term := make(chan os.Signal, 4)
	signal.Notify(term, syscall.SIGTERM)
	mode, dir := os.Args[1], os.Args[2]
	rank, restart := os.Getenv("RANK"), os.Getenv("RANKTREE_RESTART_COUNT")
	write(filepath.Join(dir, "attempt-"+restart+"-rank-"+rank), "")
	write(filepath.Join(dir, "pid-"+restart+"-"+rank), strconv.Itoa(os.Getpid()))
	switch mode {
	case "env":
		m := map[string]string{}
		for _, k := range contract {
			if v, ok := os.LookupEnv(k); ok {
				m[k] = v
			}
		}
		b, _ := json.Marshal(m)
		write(filepath.Join(dir, "env-"+rank+".json"), string(b))
		fmt.Printf("env written by rank %s\n", rank)
		fmt.Fprintf(os.Stderr, "stderr line of rank %s\n", rank)
	case "fail":
		code, _ := strconv.Atoi(os.Args[4])
		delay, _ := time.ParseDuration(os.Args[5])
		ignore := false
		for _, opt := range os.Args[6:] {
			if opt == "ignore-term" {
				ignore = true
			}
			if n, ok := strings.CutPrefix(opt, "until="); ok {
				r, _ := strconv.Atoi(restart)
				if u, _ := strconv.Atoi(n); r >= u {
					fmt.Printf("rank %s succeeds in attempt %d\n", rank, r)
					return
				}
			}
		}
		if rank == os.Args[3] {
			waitPeers(dir, restart)
			time.Sleep(delay)
			fmt.Fprintf(os.Stderr, "rank %s failing with code %d\n", rank, code)
			write(filepath.Join(dir, "failed-at"), strconv.FormatInt(time.Now().UnixNano(), 10))
			os.Exit(code)
		}
		block(term, dir, rank, ignore)
	case "crash":
		crash(term, dir, rank, restart)
	case "sleep":
		block(term, dir, rank, len(os.Args) > 3 && os.Args[3] == "ignore-term")
	default:
		fmt.Fprintf(os.Stderr, "rankprog: unknown mode %q\n", mode)
		os.Exit(64)
	}
}

// crash runs mode crash (see the command doc).
func crash(term chan os.Signal, dir, rank, restart string) {
	victim := os.Args[3]
	report, _ := time.ParseDuration(os.Args[4])
	stay := ""
	if len(os.Args) > 5 {
		stay, _ = strings.CutPrefix(os.Args[5], "stay=")
	}
	waitPeers(dir, restart)
	failedAt := filepath.Join(dir, "failed-at")
	if rank == victim {
		write(failedAt, strconv.FormatInt(time.Now().UnixNano(), 10))
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(failedAt); err == nil {
			break
		}
		if time.Now().After(deadline) {
			os.Exit(99)
		}
	}
	time.Sleep(report) // the time it takes to notice, as a real rank's transport error
	fmt.Fprintf(os.Stderr, "rankprog: rank %s: error: lost rank %s (connection reset by peer)\n", rank, victim)
	write(filepath.Join(dir, "reported-"+rank), strconv.FormatInt(time.Now().UnixNano(), 10))
	if rank == stay {
		block(term, dir, rank, false)
	}
	os.Exit(12)
}

// waitPeers waits (at most 30 s) until every rank of this attempt wrote
// its pid file, i.e. has its SIGTERM handler installed.
func waitPeers(dir, restart string) {
	world, _ := strconv.Atoi(os.Getenv("WORLD_SIZE"))
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		n := 0
		for r := 0; r < world; r++ {
			if _, err := os.Stat(filepath.Join(dir, "pid-"+restart+"-"+strconv.Itoa(r))); err == nil {
				n++
			}
		}
		if n == world {
			return
		}
	}
}

// write creates path with content s atomically (rename), so readers never
// see a partial file.
func write(path, s string) {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "rankprog:", err)
		os.Exit(65)
	}
	if err := os.Rename(tmp, path); err != nil {
		fmt.Fprintln(os.Stderr, "rankprog:", err)
		os.Exit(65)
	}
}

// block waits for SIGTERM (at most 60 s, then exits 99 so a lost signal is
// visible as a wrong exit code rather than a hang).
func block(term chan os.Signal, dir, rank string, ignore bool) {
	fmt.Printf("rank %s blocking\n", rank)
	deadline := time.After(60 * time.Second)
	for {
		select {
		case <-term:
			write(filepath.Join(dir, "term-"+rank), strconv.FormatInt(time.Now().UnixNano(), 10))
			if !ignore {
				os.Exit(0)
			}
		case <-deadline:
			os.Exit(99)
		}
	}
}
