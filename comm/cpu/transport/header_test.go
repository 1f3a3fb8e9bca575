package transport

import (
	"errors"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

func TestHeaderRoundTrip(t *testing.T) {
	h := Header{Kind: kindP2P, Sender: 3, Step: 9, Tag: -4, Len: 1 << 33,
		FP: comm.Fingerprint{Group: comm.GroupHash("pg1"), Epoch: 2, Seq: 77, Op: comm.OpReduceScatterV, DType: comm.BFloat16, RedOp: comm.RedPreMulSum, Count: 123456789, Root: -1}}
	var b [HeaderSize]byte
	h.encode(b[:])
	got, err := decodeHeader(b[:])
	if err != nil {
		t.Fatal(err)
	}
	if got != h {
		t.Fatalf("round trip: got %+v, want %+v", got, h)
	}
	// A collective message carries the fingerprint's shape key where a
	// P2P message carries its tag.
	hc := Header{Kind: kindColl, Sender: 1, Step: 2, Len: 48,
		FP: comm.Fingerprint{Group: 5, Seq: 8, Op: comm.OpAllReduce, DType: comm.Complex128, RedOp: comm.RedSum, Count: 12, Root: -1, Shape: comm.ShapeKeyOf([]int{3, 4})}}
	hc.encode(b[:])
	if got, err := decodeHeader(b[:]); err != nil || got != hc || got.FP.Shape == 0 {
		t.Fatalf("collective round trip: got %+v (%v), want %+v", got, err, hc)
	}
	for _, bad := range []func(b []byte){
		func(b []byte) { b[0] ^= 1 },    // magic
		func(b []byte) { b[2] = 9 },     // version
		func(b []byte) { b[3] = 0 },     // kind
		func(b []byte) { b[40] = 99 },   // op
		func(b []byte) { b[41] = 99 },   // dtype
		func(b []byte) { b[63] = 0xff }, // length
		func(b []byte) { b[39] = 0x80 }, // negative count
		func(b []byte) { b[7] = 0x7f },  // sender
	} {
		c := b
		bad(c[:])
		if _, err := decodeHeader(c[:]); !errors.Is(err, errBadHeader) {
			t.Fatalf("corrupt header accepted: %v", err)
		}
	}
	if _, err := decodeHeader(b[:10]); !errors.Is(err, errBadHeader) {
		t.Fatal("short header accepted")
	}
}

// FuzzDecodeHeader: the decoder never panics, and whatever it accepts
// re-encodes to the same bytes (except the ignored pad byte).
func FuzzDecodeHeader(f *testing.F) {
	var b [HeaderSize]byte
	(&Header{Kind: kindColl, FP: comm.Fingerprint{Op: comm.OpAllReduce, DType: comm.Float32, Count: 4}, Len: 16}).encode(b[:])
	f.Add(b[:])
	(&Header{Kind: kindNotice, FP: comm.Fingerprint{Op: comm.OpBarrier}, Len: HeaderSize}).encode(b[:])
	f.Add(b[:])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		h, err := decodeHeader(in)
		if err != nil {
			return
		}
		var out [HeaderSize]byte
		h.encode(out[:])
		in2 := append([]byte(nil), in[:HeaderSize]...)
		in2[43] = 0
		if string(out[:]) != string(in2) {
			t.Fatalf("re-encoding differs:\n in  %x\n out %x", in2, out)
		}
	})
}
