// Command initprog is a rank program of rankrunner's end-to-end tests that
// joins the job through the real runtime: ranktree.Init reads the env
// contract rankrunner set, connects to the job's NATS store with the
// credentials and passes the all-ranks init barrier under
// restart/<RANKTREE_RESTART_COUNT>/.
//
//	initprog [FAILRANK]
//	initprog die-before-init RANK
//
// prints "init ok rank=R world=W local=L group=G restart=N" and exits 0. In
// attempt 0, rank FAILRANK exits 3 after the barrier and the other ranks
// wait for SIGTERM, so the job restarts once. With die-before-init, rank
// RANK kills itself with SIGKILL before calling Init. A failing Init
// prints "initprog: <error>" and exits 70.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/ranktree/ranktree"
)

func main() {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	if len(os.Args) > 2 && os.Args[1] == "die-before-init" {
		if os.Getenv(ranktree.EnvRank) == os.Args[2] {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		os.Args = os.Args[:1]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rt, err := ranktree.Init(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "initprog:", err)
		os.Exit(70)
	}
	fmt.Printf("init ok rank=%d world=%d local=%d group=%d restart=%d\n",
		rt.Rank(), rt.WorldSize(), rt.LocalRank(), rt.NodeRank(), rt.RestartCount())
	code := 0
	if len(os.Args) > 1 && rt.RestartCount() == 0 {
		if fail, _ := strconv.Atoi(os.Args[1]); fail == rt.Rank() {
			code = 3
		} else {
			select {
			case <-term:
			case <-time.After(60 * time.Second):
				code = 99
			}
		}
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	if err := rt.Close(cctx); err != nil {
		fmt.Fprintln(os.Stderr, "initprog: close:", err)
	}
	os.Exit(code)
}
