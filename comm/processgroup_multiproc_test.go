package comm_test

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/internal/testrank"
)

// TestMultiProcess re-executes this test binary as 2 to 4 rank processes
// that rendezvous through a shared FileStore and run every rankChecks
// entry (c10d's expected values) over the CPU engine's real transports:
// shared memory, TCP, and auto selection.
func TestMultiProcess(t *testing.T) {
	cases := []struct {
		transport string
		n         int
	}{{cpu.TransportSHM, 3}, {cpu.TransportTCP, 2}, {cpu.TransportAuto, 4}}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s-n=%d", c.transport, c.n), func(t *testing.T) {
			if p, ok := testrank.Current(t); ok {
				runRank(t, p, c.transport)
				return
			}
			if testing.Short() {
				t.Skip("multi-process test skipped with -short")
			}
			testrank.Spawn(t, c.n, 3*time.Minute)
		})
	}
}

func runRank(t *testing.T, p testrank.Proc, transport string) {
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	pg, err := p.World(ctx, "cpu", cpu.Factory(cpu.Options{Transport: transport}), zerolog.New(io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Destroy(ctx)
	for _, c := range rankChecks {
		start := time.Now()
		if err := c.fn(ctx, pg); err != nil {
			t.Fatalf("rank %d: %s: %v", p.Rank, c.name, err)
		}
		t.Logf("rank %d: %s ok (%v)", p.Rank, c.name, time.Since(start).Round(time.Millisecond))
	}
}
