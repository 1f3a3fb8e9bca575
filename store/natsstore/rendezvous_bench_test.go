package natsstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ranktree/ranktree/store"
)

// BenchmarkRendezvous simulates a job's start-up: n ranks (goroutines),
// each with its OWN NATS connection and Store, set their address, add to a
// counter, get rank 0's 128-byte ID (the NCCL unique ID) and pass the
// store-based barrier. The timed part starts after all connections are
// open; ns/op is the time for the whole job to rendezvous.
//
//	go test -run '^$' -bench Rendezvous -benchtime 3x ./store/natsstore/
func BenchmarkRendezvous(b *testing.B) {
	for _, n := range []int{256, 1024} {
		b.Run(fmt.Sprintf("ranks=%d", n), func(b *testing.B) {
			url := testURL(b)
			for b.Loop() {
				b.StopTimer()
				job := uniqueJob(b)
				stores := make([]*Store, n)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				var wg sync.WaitGroup
				connStart := time.Now()
				errs := make(chan error, n)
				for r := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						s, err := Connect(ctx, Options{URL: url, Job: job, Timeout: time.Minute, Name: fmt.Sprintf("rank-%d", r)})
						if err != nil {
							errs <- err
							return
						}
						stores[r] = s
					}()
				}
				wg.Wait()
				select {
				case err := <-errs:
					b.Fatal(err)
				default:
				}
				connTime := time.Since(connStart)
				id := make([]byte, 128)
				for i := range id {
					id[i] = byte(i * 31)
				}
				b.StartTimer()
				start := time.Now()
				for r := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := rendezvousRank(ctx, stores[r], r, n, id); err != nil {
							errs <- fmt.Errorf("rank %d: %w", r, err)
						}
					}()
				}
				wg.Wait()
				el := time.Since(start)
				b.StopTimer()
				select {
				case err := <-errs:
					b.Fatal(err)
				default:
				}
				b.ReportMetric(connTime.Seconds(), "connect-s")
				b.Logf("%d ranks, own connection each: connect %v, rendezvous %v", n, connTime.Round(time.Millisecond), el.Round(time.Millisecond))
				for _, s := range stores {
					s.Close()
				}
				cancel()
				b.StartTimer()
			}
		})
	}
}

func rendezvousRank(ctx context.Context, s store.Store, rank, n int, id []byte) error {
	if err := s.Set(ctx, fmt.Sprintf("addr/%d", rank), fmt.Appendf(nil, "10.0.%d.%d:29500", rank/256, rank%256)); err != nil {
		return err
	}
	if _, err := s.Add(ctx, "joined", 1); err != nil {
		return err
	}
	if rank == 0 {
		if err := s.Set(ctx, "nccl_unique_id/world", id); err != nil {
			return err
		}
	}
	got, err := s.Get(ctx, "nccl_unique_id/world")
	if err != nil {
		return err
	}
	if len(got) != len(id) || got[5] != id[5] {
		return fmt.Errorf("bad unique id (%d bytes)", len(got))
	}
	return store.Barrier(ctx, s, "rendezvous", rank, n, time.Minute)
}
