package transport

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/ranktree/ranktree/comm"
)

// headerSize is the size of every message header on the wire, in bytes.
const HeaderSize = 64

const (
	headerMagic   = 0x5254 // "RT"
	headerVersion = 2
)

// msgKind says what a message carries.
type msgKind uint8

const (
	// kindColl is one piece of a collective's data; its fingerprint must
	// match the receiver's current op.
	kindColl msgKind = iota + 1
	// kindP2P is a Send's payload, matched by tag (and peer).
	kindP2P
	// kindNotice tells the receiver that the sender's communicator broke
	// (a mismatch it found, an abort, a dead peer) or is closing; its
	// payload is a failNotice (comm/cpu/failure.go), at most maxNotice bytes.
	kindNotice
	// kindWake (control connection of an shm pair, no payload) wakes a
	// rank that went to sleep waiting on its rings.
	kindWake
	// kindAck (no payload) acknowledges a notice that asked for one: the
	// receiver has recorded the failure (comm/cpu/failure.go).
	kindAck
)

// maxNotice bounds a notice's payload.
const MaxNotice = 16 << 10

// Header is the fixed 64-byte prefix of every message. Layout (little endian):
//
//	0  magic u16 | 2 version u8 | 3 kind u8 | 4 sender rank u32
//	8  group u64
//	16 epoch u32 | 20 root i32
//	24 seq u64
//	32 count i64
//	40 op u8 | 41 dtype u8 | 42 redop u8 | 43 pad u8 | 44 step u32
//	48 tag i64 (kindP2P) | shape key u64 (every other kind: FP.Shape)
//	56 payload length u64
//
// Bytes 48-55 hold a Send's tag in a P2P message and the fingerprint's
// shape key in every other message (P2P fingerprints carry no shape, and
// collectives no tag).
type Header struct {
	Kind   msgKind          // what the message carries
	Sender int              // the sender's group rank
	FP     comm.Fingerprint // the op the message belongs to
	Step   uint32           // algorithm step that sent it, for diagnostics and matching
	Tag    int64            // Send/Recv tag
	Len    uint64           // payload bytes following the header (padded to 8 on shm)
}

// errBadHeader is wrapped by decodeHeader's errors.
var errBadHeader = errors.New("cpu: malformed message header")

// encode writes h into b, which must hold headerSize bytes.
func (h *Header) encode(b []byte) {
	_ = b[HeaderSize-1]
	le := binary.LittleEndian
	le.PutUint16(b[0:], headerMagic)
	b[2] = headerVersion
	b[3] = byte(h.Kind)
	le.PutUint32(b[4:], uint32(h.Sender))
	le.PutUint64(b[8:], h.FP.Group)
	le.PutUint32(b[16:], h.FP.Epoch)
	le.PutUint32(b[20:], uint32(h.FP.Root))
	le.PutUint64(b[24:], h.FP.Seq)
	le.PutUint64(b[32:], uint64(h.FP.Count))
	b[40] = byte(h.FP.Op)
	b[41] = byte(h.FP.DType)
	b[42] = byte(h.FP.RedOp)
	b[43] = 0
	le.PutUint32(b[44:], h.Step)
	if h.Kind == kindP2P {
		le.PutUint64(b[48:], uint64(h.Tag))
	} else {
		le.PutUint64(b[48:], uint64(h.FP.Shape))
	}
	le.PutUint64(b[56:], h.Len)
}

// maxPayload bounds a message's payload so that a corrupt length cannot make
// a receiver allocate without limit (1 TiB).
const maxPayload = 1 << 40

// decodeHeader parses b (at least headerSize bytes). It rejects a wrong
// magic or version, an unknown kind, op or dtype, and absurd lengths; the
// error wraps errBadHeader.
func decodeHeader(b []byte) (Header, error) {
	var h Header
	if len(b) < HeaderSize {
		return h, fmt.Errorf("%w: %d bytes, want %d", errBadHeader, len(b), HeaderSize)
	}
	le := binary.LittleEndian
	if m := le.Uint16(b[0:]); m != headerMagic {
		return h, fmt.Errorf("%w: magic %#04x, want %#04x", errBadHeader, m, headerMagic)
	}
	if b[2] != headerVersion {
		return h, fmt.Errorf("%w: version %d, want %d", errBadHeader, b[2], headerVersion)
	}
	h.Kind = msgKind(b[3])
	if h.Kind < kindColl || h.Kind > kindAck {
		return h, fmt.Errorf("%w: unknown kind %d", errBadHeader, b[3])
	}
	sender := le.Uint32(b[4:])
	if sender > 1<<24 {
		return h, fmt.Errorf("%w: sender rank %d", errBadHeader, sender)
	}
	h.Sender = int(sender)
	h.FP.Group = le.Uint64(b[8:])
	h.FP.Epoch = le.Uint32(b[16:])
	h.FP.Root = int32(le.Uint32(b[20:]))
	h.FP.Seq = le.Uint64(b[24:])
	h.FP.Count = int64(le.Uint64(b[32:]))
	h.FP.Op = comm.OpType(b[40])
	if h.FP.Op < comm.OpAllReduce || h.FP.Op > comm.OpCoalesced {
		return h, fmt.Errorf("%w: unknown op %d", errBadHeader, b[40])
	}
	h.FP.DType = comm.DType(b[41])
	if h.FP.DType != 0 && !h.FP.DType.Valid() {
		return h, fmt.Errorf("%w: unknown dtype %d", errBadHeader, b[41])
	}
	h.FP.RedOp = comm.RedOpType(b[42])
	if h.FP.RedOp > comm.RedBXor {
		return h, fmt.Errorf("%w: unknown reduce op %d", errBadHeader, b[42])
	}
	if h.FP.Count < 0 {
		return h, fmt.Errorf("%w: negative count %d", errBadHeader, h.FP.Count)
	}
	h.Step = le.Uint32(b[44:])
	if h.Kind == kindP2P {
		h.Tag = int64(le.Uint64(b[48:]))
	} else {
		h.FP.Shape = comm.ShapeKey(le.Uint64(b[48:]))
	}
	h.Len = le.Uint64(b[56:])
	if h.Len > maxPayload {
		return h, fmt.Errorf("%w: payload length %d exceeds %d", errBadHeader, h.Len, uint64(maxPayload))
	}
	if h.Kind == kindNotice && h.Len > MaxNotice {
		return h, fmt.Errorf("%w: notice payload %d bytes, at most %d", errBadHeader, h.Len, MaxNotice)
	}
	if (h.Kind == kindWake || h.Kind == kindAck) && h.Len != 0 {
		return h, fmt.Errorf("%w: control message with a %d-byte payload", errBadHeader, h.Len)
	}
	return h, nil
}
