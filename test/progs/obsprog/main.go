// Command obsprog is a rank program of rankrunner's end-to-end tests for
// the observing subcommands; it uses the runtime's event publisher and
// flight-recorder dump format. It writes DIR/pid-<restart>-<rank>, then:
//
//	obsprog events DIR   emit work events through actors.EventPublisher until SIGTERM
//	                     (rank 1 lags behind: a straggler)
//	obsprog trace DIR    ranks 0 and 1 of 3 write a flight-recorder dump to the job's
//	                     store (rank 1 never reaches seq 5), then wait for SIGTERM
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/store/natsstore"
	"github.com/ranktree/ranktree/supervisor"
)

func main() {
	term := make(chan os.Signal, 4)
	signal.Notify(term, syscall.SIGTERM)
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: obsprog events|trace DIR")
		os.Exit(64)
	}
	mode, dir := os.Args[1], os.Args[2]
	pidFile := filepath.Join(dir, "pid-"+os.Getenv("RANKTREE_RESTART_COUNT")+"-"+os.Getenv("RANK"))
	err := os.WriteFile(pidFile+".tmp", []byte(strconv.Itoa(os.Getpid())), 0o644)
	if err == nil {
		err = os.Rename(pidFile+".tmp", pidFile)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "obsprog:", err)
		os.Exit(65)
	}
	switch mode {
	case "events":
		publish(term)
	case "trace":
		writeTrace()
		select {
		case <-term:
		case <-time.After(60 * time.Second):
			os.Exit(99)
		}
	default:
		fmt.Fprintf(os.Stderr, "obsprog: unknown mode %q\n", mode)
		os.Exit(64)
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
		Credentials: natsstore.Credentials{Token: os.Getenv("RANKTREE_NATS_TOKEN")}})
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
