package nccl

import (
	"fmt"
	"structs"

	"github.com/ranktree/ranktree/comm"
)

// Result is an ncclResult_t.
type Result int32

// ncclResult_t values (nccl.h).
const (
	Success            Result = 0 // ncclSuccess
	UnhandledCudaError Result = 1 // ncclUnhandledCudaError
	SystemError        Result = 2 // ncclSystemError
	InternalError      Result = 3 // ncclInternalError
	InvalidArgument    Result = 4 // ncclInvalidArgument
	InvalidUsage       Result = 5 // ncclInvalidUsage
	RemoteError        Result = 6 // ncclRemoteError
	InProgress         Result = 7 // ncclInProgress: a nonblocking call is still running
	Timeout            Result = 8 // ncclTimeout (after NCCL 2.29; 2.29.7's nccl.h ends at ncclNumResults = 8)
)

var resultNames = [...]string{"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
	"ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress", "ncclTimeout"}

// String is the enum's name, e.g. "ncclSystemError".
func (r Result) String() string {
	if r >= 0 && int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("ncclResult(%d)", int32(r))
}

// DataType is an ncclDataType_t.
type DataType int32

// Every ncclDataType_t (nccl.h). Float8 types exist from NCCL 2.24 on
// sm_90+ builds.
const (
	Int8       DataType = 0 // ncclInt8 (ncclChar)
	Uint8      DataType = 1 // ncclUint8
	Int32      DataType = 2 // ncclInt32 (ncclInt)
	Uint32     DataType = 3 // ncclUint32
	Int64      DataType = 4 // ncclInt64
	Uint64     DataType = 5 // ncclUint64
	Float16    DataType = 6 // ncclFloat16 (ncclHalf)
	Float32    DataType = 7 // ncclFloat32 (ncclFloat)
	Float64    DataType = 8 // ncclFloat64 (ncclDouble)
	Bfloat16   DataType = 9 // ncclBfloat16
	Float8e4m3 DataType = 10
	Float8e5m2 DataType = 11
)

// AllDataTypes lists every ncclDataType_t.
var AllDataTypes = []DataType{Int8, Uint8, Int32, Uint32, Int64, Uint64, Float16, Float32, Float64, Bfloat16, Float8e4m3, Float8e5m2}

var dtNames = [...]string{"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
	"ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"}

var dtSizes = [...]int{1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1}

// String is the enum's name, e.g. "ncclBfloat16".
func (d DataType) String() string {
	if d >= 0 && int(d) < len(dtNames) {
		return dtNames[d]
	}
	return fmt.Sprintf("ncclDataType(%d)", int32(d))
}

// Size is the element size in bytes (0 if unknown).
func (d DataType) Size() int {
	if d >= 0 && int(d) < len(dtSizes) {
		return dtSizes[d]
	}
	return 0
}

// DataTypeOf maps a comm.DType to NCCL's type, as c10d's getNcclDataType:
// bool travels as ncclUint8 (0/1 bytes). NCCL has no complex types:
// complex64 and complex128 give an error wrapping comm.ErrUnsupported (the
// engine launches them as 2×count elements of DataTypeOf(dt.Real()), as
// c10d does with torch.view_as_real). An invalid dtype gives an error
// wrapping comm.ErrInvalidArgument.
func DataTypeOf(dt comm.DType) (DataType, error) {
	switch dt {
	case comm.Complex64, comm.Complex128:
		return 0, fmt.Errorf("%w: dtype %v has no NCCL type (launch it as 2×count %v: view_as_real)", comm.ErrUnsupported, dt, dt.Real())
	case comm.Float32:
		return Float32, nil
	case comm.Float64:
		return Float64, nil
	case comm.Float16:
		return Float16, nil
	case comm.BFloat16:
		return Bfloat16, nil
	case comm.Int8:
		return Int8, nil
	case comm.Uint8, comm.Bool:
		return Uint8, nil
	case comm.Int32:
		return Int32, nil
	case comm.Int64:
		return Int64, nil
	}
	return 0, fmt.Errorf("%w: dtype %v has no NCCL type", comm.ErrInvalidArgument, dt)
}

// RedOp is an ncclRedOp_t: a built-in reduction or one made by
// RedOpCreatePreMulSum.
type RedOp int32

// Built-in ncclRedOp_t values (nccl.h). Avg needs NCCL 2.10+.
const (
	Sum  RedOp = 0 // ncclSum
	Prod RedOp = 1 // ncclProd
	Max  RedOp = 2 // ncclMax
	Min  RedOp = 3 // ncclMin
	Avg  RedOp = 4 // ncclAvg
)

// ScalarResidence is an ncclScalarResidence_t.
type ScalarResidence int32

// ncclScalarResidence_t values.
const (
	ScalarDevice        ScalarResidence = 0 // scalar in device memory, read while the collective runs
	ScalarHostImmediate ScalarResidence = 1 // scalar in host memory, read before the create call returns
)

// UniqueIDBytes is NCCL_UNIQUE_ID_BYTES.
const UniqueIDBytes = 128

// UniqueID is an ncclUniqueId: rank 0 creates it and every rank passes it
// to CommInitRankConfig. It travels through the store as 128 raw bytes.
type UniqueID struct {
	_        structs.HostLayout
	Internal [UniqueIDBytes]byte
}

// Comm is an ncclComm_t handle.
type Comm uintptr

// configUndefInt is NCCL_CONFIG_UNDEF_INT (INT_MIN).
const configUndefInt = int32(-1 << 31)

// apiMagic is NCCL_API_MAGIC, which ncclConfig_t's magic field must hold.
const apiMagic = 0xcafebeef

// Config mirrors ncclConfig_t as of NCCL 2.31 (the layout only grows at
// the end; NCCL copies min(size, its own size) bytes, so a longer struct is
// accepted by older libraries and a newer library defaults the tail).
// NewConfig fills it as NCCL_CONFIG_INITIALIZER does; set Blocking etc.
// after.
type Config struct {
	_                   structs.HostLayout
	Size                uintptr // sizeof(ncclConfig_t)
	Magic               uint32  // NCCL_API_MAGIC
	Version             uint32  // NCCL version code the struct is for
	Blocking            int32   // 0: nonblocking calls return ncclInProgress
	CgaClusterSize      int32
	MinCTAs             int32
	MaxCTAs             int32
	NetName             uintptr // const char*
	SplitShare          int32
	TrafficClass        int32
	CommName            uintptr // const char*
	CollnetEnable       int32
	CTAPolicy           int32
	ShrinkShare         int32
	NvlsCTAs            int32
	NChannelsPerNetPeer int32
	NvlinkCentricSched  int32
	GraphUsageMode      int32
	NumRmaCtx           int32
	MaxP2pPeers         int32
	GraphStreamOrdering int32
	LaunchOrderImplicit int32
	NumRmaSig           int32
	RmaEagerInit        int32
	HostCftMode         int32
	NvlsHostMode        int32
}

// NewConfig returns a Config as NCCL_CONFIG_INITIALIZER makes it, with
// Version set to version (pass the loaded library's Version()).
func NewConfig(version int) *Config {
	u := configUndefInt
	c := &Config{Magic: apiMagic, Version: uint32(version),
		Blocking: u, CgaClusterSize: u, MinCTAs: u, MaxCTAs: u, SplitShare: u, TrafficClass: u,
		CollnetEnable: u, CTAPolicy: u, ShrinkShare: u, NvlsCTAs: u, NChannelsPerNetPeer: u,
		NvlinkCentricSched: u, GraphUsageMode: u, NumRmaCtx: u, MaxP2pPeers: u, GraphStreamOrdering: u,
		LaunchOrderImplicit: u, NumRmaSig: u, RmaEagerInit: u, HostCftMode: u, NvlsHostMode: u}
	c.Size = configSize
	return c
}
