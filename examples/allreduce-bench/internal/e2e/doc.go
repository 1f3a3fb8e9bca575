// Package e2e runs allreduce-bench's measurement loop (package bench) over
// real process groups of the CPU engine, with the ranks as goroutines of one
// test process joined through an in-memory store: a check of the loop
// against a real engine that needs no launcher (the program itself runs
// under rankrunner, one process per rank). It holds only tests:
//
//	go test ./examples/allreduce-bench/internal/e2e/
//	go test ./examples/allreduce-bench/internal/e2e/ -run TestSweep -v \
//	    -args -sweep 4,4KiB,1MiB,64MiB -ranks 2 -transport shm -iters 20
//
// The second form prints the nccl-tests style table for a sweep; it is
// skipped unless -sweep is given.
package e2e
