package nccl

import (
	"fmt"
	"runtime"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// Options configures an Engine. The zero value is valid: lazy init, a
// normal-priority stream, init bounded by BackendConfig.Timeout.
type Options struct {
	// EagerInit creates the NCCL communicator inside New, so New returns
	// only once every rank has joined (or fails with an *InitTimeoutError).
	// Otherwise the communicator is created by the first op, as c10d's
	// ProcessGroupNCCL does without device_id.
	EagerInit bool
	// InitTimeout bounds one communicator's creation: waiting for rank 0's
	// unique id in the store plus the nonblocking ncclCommInitRankConfig.
	// 0 means BackendConfig.Timeout (or 5 min if that is 0 too).
	InitTimeout time.Duration
	// HighPriorityStream creates the communicator's stream with the
	// greatest priority (c10d: NCCL_HIGH_PRIORITY / is_high_priority_stream).
	HighPriorityStream bool
	// PollInterval is the sleep between two cuEventQuery rounds while ops
	// are in flight, once SpinPoll has passed. 0 means 50 µs.
	PollInterval time.Duration
	// SpinPoll is how long after a launch the launch goroutine queries end
	// events without sleeping (small ops finish within it, and a sleeping
	// locked thread adds an OS wake-up). 0 means 100 µs; negative: never spin.
	SpinPoll time.Duration
	// SpinIdle is how long the idle launch goroutine polls its queue before
	// blocking: it saves the OS wake-up of a parked thread when the next op
	// follows within SpinIdle, at the price of a busy core meanwhile. 0
	// means auto: 100 µs where GOMAXPROCS is at least 4 (a GPU host's
	// rank), else never (a small or shared machine, where the spinning
	// thread would take the core the next op needs). Negative: never.
	SpinIdle time.Duration
	// SpinWait is how long a Work's Wait polls for completion before it
	// blocks (comm.Work.SetSpinWait), so that a small op's waiter is not
	// woken by the OS (CUDA's cudaDeviceScheduleSpin, which PyTorch's
	// default synchronize behaves as on hosts with more cores than GPUs).
	// 0 means auto: 200 µs where GOMAXPROCS is at least 4, else never.
	// Negative: never.
	SpinWait time.Duration
	// AsyncErrorInterval is how often the engine polls
	// ncclCommGetAsyncError while ops are in flight. 0 means 10 ms.
	AsyncErrorInterval time.Duration
	// FinalizeTimeout bounds Close's ncclCommFinalize wait before it falls
	// back to ncclCommAbort. 0 means 10 s.
	FinalizeTimeout time.Duration
	// AbortTimeout bounds how long Abort (and so the watchdog that calls
	// it) waits for ncclCommAbort. The real call can block for as long as
	// a stream ahead of NCCL's kernel does not move; past the bound the
	// engine's Works fail anyway and AsyncError reports the communicator
	// left aborting (see Engine.Abort). 0 means 10 s.
	AbortTimeout time.Duration
}

// spinMinProcs is the GOMAXPROCS from which SpinIdle and SpinWait spin by
// default: the launch thread and a waiter may then each hold a core while
// the actor and the program keep two more.
const spinMinProcs = 4

// validate fills defaults and rejects negative durations (error wrapping
// comm.ErrInvalidArgument).
func (o *Options) validate(cfg comm.BackendConfig) error {
	if o.SpinPoll == 0 {
		o.SpinPoll = 100 * time.Microsecond
	}
	spin := runtime.GOMAXPROCS(0) >= spinMinProcs
	if o.SpinIdle == 0 && spin {
		o.SpinIdle = 100 * time.Microsecond
	}
	if o.SpinWait == 0 && spin {
		o.SpinWait = 200 * time.Microsecond
	}
	for name, d := range map[string]time.Duration{"InitTimeout": o.InitTimeout, "PollInterval": o.PollInterval,
		"AsyncErrorInterval": o.AsyncErrorInterval, "FinalizeTimeout": o.FinalizeTimeout, "AbortTimeout": o.AbortTimeout} {
		if d < 0 {
			return fmt.Errorf("%w: nccl: Options.%s is negative (%v)", comm.ErrInvalidArgument, name, d)
		}
	}
	if o.InitTimeout == 0 {
		o.InitTimeout = cfg.Timeout
	}
	if o.InitTimeout == 0 {
		o.InitTimeout = 5 * time.Minute
	}
	if o.PollInterval == 0 {
		o.PollInterval = 50 * time.Microsecond
	}
	if o.AsyncErrorInterval == 0 {
		o.AsyncErrorInterval = 10 * time.Millisecond
	}
	if o.FinalizeTimeout == 0 {
		o.FinalizeTimeout = 10 * time.Second
	}
	if o.AbortTimeout == 0 {
		o.AbortTimeout = 10 * time.Second
	}
	return nil
}
