package nccl

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cuda"
)

// ErrorString is ncclGetErrorString(r).
func (l *Lib) ErrorString(r Result) string {
	p, _, _ := purego.SyscallN(l.fn.getErrorString, uintptr(r))
	return cString(p)
}

// LastError is ncclGetLastError(c): the last error message NCCL logged
// (c may be 0). Empty if the library lacks the function.
func (l *Lib) LastError(c Comm) string {
	if l.fn.getLastError == 0 {
		return ""
	}
	p, _, _ := purego.SyscallN(l.fn.getLastError, uintptr(c))
	return cString(p)
}

// check turns r into nil or an *Error for call name on communicator c.
func (l *Lib) check(name string, r Result, c Comm) error {
	if r == Success {
		return nil
	}
	return &Error{Call: name, Code: r, Msg: l.ErrorString(r), Last: l.LastError(c)}
}

// GetUniqueID creates a new unique id (ncclGetUniqueId); rank 0 calls it
// and shares the bytes with the other ranks.
func (l *Lib) GetUniqueID() (UniqueID, error) {
	id := new(UniqueID)
	err := l.check("ncclGetUniqueId", call(l.fn.getUniqueID, uintptr(unsafe.Pointer(id))), 0)
	return *id, err
}

// CommInitRankConfig starts creating rank's member of an nranks
// communicator identified by id (ncclCommInitRankConfig; the calling
// thread's current CUDA device/context selects the GPU). With
// cfg.Blocking = 0 it returns (comm, InProgress, nil) at once: poll
// CommGetAsyncError until it is not InProgress. Any other failure is an
// *Error.
func (l *Lib) CommInitRankConfig(nranks int, id UniqueID, rank int, cfg *Config) (Comm, Result, error) {
	c := new(uintptr)
	r := Result(l.commInitRankConfig(c, int32(nranks), id, int32(rank), cfg))
	if r == Success || r == InProgress {
		return Comm(*c), r, nil
	}
	return Comm(*c), r, l.check("ncclCommInitRankConfig", r, Comm(*c))
}

// CommGetAsyncError is the communicator's state: Success, InProgress (a
// nonblocking call still runs) or the asynchronous error it hit
// (ncclCommGetAsyncError). err is set only if the query itself failed.
func (l *Lib) CommGetAsyncError(c Comm) (Result, error) {
	r := new(int32)
	if rc := call(l.fn.commGetAsyncError, uintptr(c), uintptr(unsafe.Pointer(r))); rc != Success {
		return rc, l.check("ncclCommGetAsyncError", rc, c)
	}
	return Result(*r), nil
}

// CommAbort frees the communicator and stops its in-flight operations
// (ncclCommAbort); it may be called from another thread while a call on c
// is blocked.
func (l *Lib) CommAbort(c Comm) error {
	return l.check("ncclCommAbort", call(l.fn.commAbort, uintptr(c)), 0)
}

// CommFinalize flushes c's operations (ncclCommFinalize, NCCL 2.14+); for a
// nonblocking communicator poll CommGetAsyncError until not InProgress,
// then CommDestroy.
func (l *Lib) CommFinalize(c Comm) (Result, error) {
	if l.fn.commFinalize == 0 {
		return 0, fmt.Errorf("%w: ncclCommFinalize needs NCCL 2.14+ (loaded %s)", comm.ErrUnsupported, VersionString(l.version))
	}
	r := call(l.fn.commFinalize, uintptr(c))
	if r == InProgress {
		return r, nil
	}
	return r, l.check("ncclCommFinalize", r, c)
}

// CommDestroy frees c's local resources (ncclCommDestroy).
func (l *Lib) CommDestroy(c Comm) error {
	return l.check("ncclCommDestroy", call(l.fn.commDestroy, uintptr(c)), 0)
}

// CommSplit makes a new communicator from c's ranks with the same color,
// ordered by key (ncclCommSplit, NCCL 2.18+); color -1 (NCCL_SPLIT_NOCOLOR)
// returns 0. cfg nil inherits c's config.
//
// NCCL writes the new handle only when the child's initialisation ends
// (ncclCommInitRankFunc's exit), which for a nonblocking communicator is
// after ncclCommSplit has returned, from NCCL's own thread: seen on an
// H200 with NCCL 2.28.3, where the call returned ncclSuccess with the
// handle still unset. So CommSplit waits for the handle up to wait (every
// member of the split must have called it by then), and the slot NCCL
// writes into lives in memory kept reachable for the process's life if
// the wait runs out (the error then wraps comm.ErrTimeout), so that a
// late write never lands in freed memory.
func (l *Lib) CommSplit(c Comm, color, key int, cfg *Config, wait time.Duration) (Comm, Result, error) {
	if l.fn.commSplit == 0 {
		return 0, 0, fmt.Errorf("%w: ncclCommSplit needs NCCL 2.18+ (loaded %s)", comm.ErrUnsupported, VersionString(l.version))
	}
	out := new(uintptr)
	r := call(l.fn.commSplit, uintptr(c), uintptr(int64(color)), uintptr(int64(key)), uintptr(unsafe.Pointer(out)), uintptr(unsafe.Pointer(cfg)))
	if r != Success && r != InProgress {
		return Comm(atomic.LoadUintptr(out)), r, l.check("ncclCommSplit", r, c)
	}
	h := atomic.LoadUintptr(out)
	if h != 0 || color == -1 {
		return Comm(h), r, nil
	}
	deadline := time.Now().Add(wait)
	for h == 0 {
		if time.Now().After(deadline) {
			lateSlots.Lock()
			lateSlots.keep = append(lateSlots.keep, out)
			lateSlots.Unlock()
			return 0, r, fmt.Errorf("%w: ncclCommSplit: no communicator handle within %v (have all members split?)", comm.ErrTimeout, wait)
		}
		time.Sleep(100 * time.Microsecond)
		h = atomic.LoadUintptr(out)
	}
	// The handle is written at the end of the child's init: its state is
	// the child's own (ncclCommGetAsyncError), success or the init error.
	cr, err := l.CommGetAsyncError(Comm(h))
	return Comm(h), cr, err
}

// lateSlots keeps the handle slots of splits whose handle did not arrive
// within CommSplit's wait: NCCL may still write them.
var lateSlots struct {
	sync.Mutex
	keep []*uintptr
}

// CommCount is the number of ranks in c.
func (l *Lib) CommCount(c Comm) (int, error) {
	n := new(int32)
	err := l.check("ncclCommCount", call(l.fn.commCount, uintptr(c), uintptr(unsafe.Pointer(n))), c)
	return int(*n), err
}

// CommUserRank is this member's rank in c.
func (l *Lib) CommUserRank(c Comm) (int, error) {
	n := new(int32)
	err := l.check("ncclCommUserRank", call(l.fn.commUserRank, uintptr(c), uintptr(unsafe.Pointer(n))), c)
	return int(*n), err
}

// CommCuDevice is the CUDA device ordinal c uses.
func (l *Lib) CommCuDevice(c Comm) (int, error) {
	n := new(int32)
	err := l.check("ncclCommCuDevice", call(l.fn.commCuDevice, uintptr(c), uintptr(unsafe.Pointer(n))), c)
	return int(*n), err
}

// The collectives below enqueue on stream s and return at once; counts are
// in elements; buffers are device addresses (0 where NCCL allows NULL).
// A nonblocking communicator may return InProgress (not an error): poll
// CommGetAsyncError before the next call. Errors are *Error.

// AllReduce is ncclAllReduce (in place when send == recv).
func (l *Lib) AllReduce(send, recv cuda.DevicePtr, count int, dt DataType, op RedOp, c Comm, s cuda.Stream) (Result, error) {
	r := call(l.fn.allReduce, uintptr(send), uintptr(recv), uintptr(count), uintptr(dt), uintptr(op), uintptr(c), uintptr(s))
	return r, l.collErr("ncclAllReduce", r, c)
}

// Broadcast is ncclBroadcast from root (in place when send == recv).
func (l *Lib) Broadcast(send, recv cuda.DevicePtr, count int, dt DataType, root int, c Comm, s cuda.Stream) (Result, error) {
	r := call(l.fn.broadcast, uintptr(send), uintptr(recv), uintptr(count), uintptr(dt), uintptr(root), uintptr(c), uintptr(s))
	return r, l.collErr("ncclBroadcast", r, c)
}

// Reduce is ncclReduce to root (recv may be 0 on non-roots).
func (l *Lib) Reduce(send, recv cuda.DevicePtr, count int, dt DataType, op RedOp, root int, c Comm, s cuda.Stream) (Result, error) {
	r := call(l.fn.reduce, uintptr(send), uintptr(recv), uintptr(count), uintptr(dt), uintptr(op), uintptr(root), uintptr(c), uintptr(s))
	return r, l.collErr("ncclReduce", r, c)
}

// AllGather is ncclAllGather: sendCount elements per rank into recv
// (nranks·sendCount elements, rank i's at offset i·sendCount).
func (l *Lib) AllGather(send, recv cuda.DevicePtr, sendCount int, dt DataType, c Comm, s cuda.Stream) (Result, error) {
	r := call(l.fn.allGather, uintptr(send), uintptr(recv), uintptr(sendCount), uintptr(dt), uintptr(c), uintptr(s))
	return r, l.collErr("ncclAllGather", r, c)
}

// ReduceScatter is ncclReduceScatter: send holds nranks·recvCount elements;
// rank i receives the reduction of block i.
func (l *Lib) ReduceScatter(send, recv cuda.DevicePtr, recvCount int, dt DataType, op RedOp, c Comm, s cuda.Stream) (Result, error) {
	r := call(l.fn.reduceScatter, uintptr(send), uintptr(recv), uintptr(recvCount), uintptr(dt), uintptr(op), uintptr(c), uintptr(s))
	return r, l.collErr("ncclReduceScatter", r, c)
}

// Send is ncclSend of count elements to peer.
func (l *Lib) Send(send cuda.DevicePtr, count int, dt DataType, peer int, c Comm, s cuda.Stream) (Result, error) {
	r := call(l.fn.send, uintptr(send), uintptr(count), uintptr(dt), uintptr(peer), uintptr(c), uintptr(s))
	return r, l.collErr("ncclSend", r, c)
}

// Recv is ncclRecv of count elements from peer.
func (l *Lib) Recv(recv cuda.DevicePtr, count int, dt DataType, peer int, c Comm, s cuda.Stream) (Result, error) {
	r := call(l.fn.recv, uintptr(recv), uintptr(count), uintptr(dt), uintptr(peer), uintptr(c), uintptr(s))
	return r, l.collErr("ncclRecv", r, c)
}

// GroupStart opens a group (ncclGroupStart): calls until GroupEnd are
// fused into one launch. Groups are per OS thread.
func (l *Lib) GroupStart() error {
	return l.check("ncclGroupStart", call(l.fn.groupStart), 0)
}

// GroupEnd closes the group and launches it (ncclGroupEnd); InProgress is
// returned (without error) for nonblocking communicators.
func (l *Lib) GroupEnd() (Result, error) {
	r := call(l.fn.groupEnd)
	return r, l.collErr("ncclGroupEnd", r, 0)
}

// RedOpCreatePreMulSum creates the reduction "multiply by *scalar, then
// sum" for dt on c (ncclRedOpCreatePreMulSum). scalar points to one dt
// element in host memory (ScalarHostImmediate: read before return) or
// device memory (ScalarDevice). Destroy it with RedOpDestroy after the last
// call (or GroupEnd) that uses it.
func (l *Lib) RedOpCreatePreMulSum(scalar unsafe.Pointer, dt DataType, res ScalarResidence, c Comm) (RedOp, error) {
	op := new(int32)
	err := l.check("ncclRedOpCreatePreMulSum", call(l.fn.redOpCreatePreMulSum, uintptr(unsafe.Pointer(op)), uintptr(scalar), uintptr(dt), uintptr(res), uintptr(c)), c)
	return RedOp(*op), err
}

// RedOpDestroy destroys an op from RedOpCreatePreMulSum.
func (l *Lib) RedOpDestroy(op RedOp, c Comm) error {
	return l.check("ncclRedOpDestroy", call(l.fn.redOpDestroy, uintptr(op), uintptr(c)), c)
}

func (l *Lib) collErr(name string, r Result, c Comm) error {
	if r == Success || r == InProgress {
		return nil
	}
	return l.check(name, r, c)
}
