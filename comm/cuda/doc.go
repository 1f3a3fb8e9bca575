// Package cuda is a run-time binding of the CUDA driver API (libcuda.so.1)
// made with purego: no CUDA headers or toolkit are needed to build, and a
// binary that imports it runs on machines without a GPU (Load then returns
// an error wrapping ErrNoLibrary and comm.ErrUnsupported).
//
// It covers what the NCCL engine (comm/nccl) and its tests need: init,
// device count and handles, primary context retain/release/set-current,
// streams (with priority, wait-on-event), events with timing disabled
// (record, query, synchronize), device memory (alloc, free, async copies in
// every direction, memset) and cuStreamWaitValue32, which tests use to hang
// a stream on purpose.
//
// The caller's duties:
//
//  1. Call Load (or Open) once; the *Lib is safe for concurrent use.
//  2. Call Init before any other call (cuInit).
//  3. Make a context current on the OS thread that calls stream, event and
//     memory functions: runtime.LockOSThread, then CtxSetCurrent with the
//     device's primary context (PrimaryCtxRetain). Contexts are per OS
//     thread, so a goroutine that is not locked may lose it.
//  4. Keep host memory given to async copies alive and untouched until the
//     stream has passed the copy (an event query says so).
//  5. Release what you create: StreamDestroy, EventDestroy, MemFree,
//     PrimaryCtxRelease.
//
// Every failed call returns a *Error carrying the CUresult, its name and
// text (cuGetErrorName, cuGetErrorString) and the function called; it
// unwraps to comm.ErrEngine. The subpackage nvmlinfo reports NVML device
// UUIDs and PCI bus ids (NVML loaded at run time, no cgo).
package cuda
