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
//	rankprog sleep DIR [ignore-term]       block; on SIGTERM write DIR/term-<rank> and exit 0
//	                                       (ignore-term: record it but keep running)
//	rankprog trace DIR                     ranks 0 and 1 of 3 write a flight-recorder dump to
//	                                       the job's store (rank 1 never reaches seq 5), then block
//	rankprog events DIR                    publish work events to the job's subjects until SIGTERM
//	                                       (rank 1 lags behind: a straggler)
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/store/natsstore"
	"github.com/ranktree/ranktree/supervisor"
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
	case "sleep":
		block(term, dir, rank, len(os.Args) > 3 && os.Args[3] == "ignore-term")
	case "events":
		publish(term)
	case "trace":
		writeTrace()
		block(term, dir, rank, false)
	default:
		fmt.Fprintf(os.Stderr, "rankprog: unknown mode %q\n", mode)
		os.Exit(64)
	}
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
			write(filepath.Join(dir, "term-"+rank), "")
			if !ignore {
				os.Exit(0)
			}
		case <-deadline:
			os.Exit(99)
		}
	}
}

// publish emits work events for rank RANK every 50 ms through the
// runtime's event publisher actor (actors.EventPublisher over NATS):
// scheduled and completed ALLREDUCEs with increasing seq; rank 1 advances
// at half speed, so it shows as a straggler.
func publish(term chan os.Signal) {
	rank, _ := strconv.Atoi(os.Getenv("RANK"))
	var opts []nats.Option
	if t := os.Getenv("RANKTREE_NATS_TOKEN"); t != "" {
		opts = append(opts, nats.Token(t))
	}
	nc, err := nats.Connect(os.Getenv("RANKTREE_NATS_URL"), opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rankprog:", err)
		os.Exit(66)
	}
	defer nc.Close()
	pub, err := actors.NewEventPublisher(nc, actors.PublisherConfig{Job: os.Getenv("RANKTREE_JOB"), Rank: rank})
	if err != nil {
		fmt.Fprintln(os.Stderr, "rankprog:", err)
		os.Exit(66)
	}
	pub.Start(actor.NewActorSystem(), nil)
	defer pub.Close(5 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(60 * time.Second)
	for i := 1; ; i++ {
		select {
		case <-term:
			return
		case <-deadline:
			os.Exit(99)
		case <-tick.C:
		}
		seq := uint64(i)
		if rank == 1 {
			seq = uint64(i/2 + 1)
		}
		for _, st := range []string{actors.StateScheduled, actors.StateCompleted} {
			pub.Emit(actors.Event{Kind: actors.KindWork, Group: "world", Seq: seq, Op: "ALLREDUCE",
				State: st, DType: "float32", Count: 1024})
		}
	}
}

// writeTrace writes a flight-recorder dump for ranks 0 and 1 under the
// attempt's store prefix: group "world" of 3 ranks, rank 0 launched seq 5,
// rank 1 stopped at seq 4; rank 2 writes nothing.
func writeTrace() {
	rank, _ := strconv.Atoi(os.Getenv("RANK"))
	if rank >= 2 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := natsstore.Connect(ctx, natsstore.Options{URL: os.Getenv("RANKTREE_NATS_URL"), Job: os.Getenv("RANKTREE_JOB"),
		Token: os.Getenv("RANKTREE_NATS_TOKEN")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "rankprog:", err)
		os.Exit(66)
	}
	defer st.Close()
	last := uint64(5 - rank)
	d := supervisor.Dump{Version: supervisor.DumpVersion, Job: os.Getenv("RANKTREE_JOB"), Rank: rank, WorldSize: 3,
		Groups: []supervisor.GroupStatus{{Group: "world", GroupRank: rank, Ranks: []int{0, 1, 2},
			LastEnqueued: last, LastStarted: last, LastCompleted: 4}}}
	for seq := uint64(1); seq <= last; seq++ {
		state := actors.StateCompleted
		if seq == 5 {
			state = actors.StateStarted
		}
		d.Entries = append(d.Entries, supervisor.Entry{RecordID: seq, Group: "world", Seq: seq, Op: "ALLREDUCE",
			DType: "float32", Count: 8, Root: -1, State: state, TimeStartedNS: int64(seq)})
	}
	prefix := "restart/" + os.Getenv("RANKTREE_RESTART_COUNT") + "/"
	if err := supervisor.WriteDump(ctx, d, "", store.WithPrefix(st, prefix)); err != nil {
		fmt.Fprintln(os.Stderr, "rankprog:", err)
		os.Exit(67)
	}
	fmt.Printf("rank %d wrote its dump\n", rank)
}
