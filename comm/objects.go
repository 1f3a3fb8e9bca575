package comm

import (
	"context"
	"fmt"
)

// Object collectives move opaque byte blobs (Go values the caller has
// encoded, e.g. with encoding/gob or JSON) of different sizes per rank:
// c10d's all_gather_object, broadcast_object_list, gather_object and
// scatter_object_list. Like c10d they run in two steps (sizes, then the
// padded payload), each a collective of this group, and they block until
// done. They need a host engine; on a device engine they return an error
// wrapping ErrUnsupported. A non-member gets nil results and no error.
// SendObjectList and RecvObjectList are their point-to-point counterparts
// (c10d send_object_list, recv_object_list): two messages from sender to
// receiver on the P2P sequence.

func (pg *ProcessGroup) objectsOK(op OpType) error {
	if pg.device {
		return fmt.Errorf("%w: object collectives (%v) on engine %q: not built; use a host (cpu) group", ErrUnsupported, op, pg.engine)
	}
	return nil
}

// AllGatherBytes gathers every rank's b; the result's element i is rank i's
// blob (c10d all_gather_object). Blobs may differ in size.
func (pg *ProcessGroup) AllGatherBytes(ctx context.Context, b []byte) ([][]byte, error) {
	if pg.rank < 0 {
		pg.precheck(ctx, OpAllGather)
		return nil, nil
	}
	if err := pg.objectsOK(OpAllGather); err != nil {
		return nil, err
	}
	sizes := make([]int64, pg.size)
	if err := pg.AllGatherInto(ctx, HostBuffer(sizes), HostBuffer([]int64{int64(len(b))})).Wait(ctx); err != nil {
		return nil, err
	}
	counts := make([]int, pg.size)
	total := 0
	for i, s := range sizes {
		counts[i] = int(s)
		total += int(s)
	}
	all := make([]byte, total)
	if err := pg.AllGatherV(ctx, HostBuffer(all), HostBuffer(b), counts).Wait(ctx); err != nil {
		return nil, err
	}
	out := make([][]byte, pg.size)
	off := 0
	for i, c := range counts {
		out[i] = all[off : off+c : off+c]
		off += c
	}
	return out, nil
}

// BroadcastBytes returns root's b on every rank (c10d
// broadcast_object_list); b is ignored on other ranks.
func (pg *ProcessGroup) BroadcastBytes(ctx context.Context, b []byte, root int) ([]byte, error) {
	if pg.rank < 0 {
		pg.precheck(ctx, OpBroadcast)
		return nil, nil
	}
	if err := pg.objectsOK(OpBroadcast); err != nil {
		return nil, err
	}
	if err := pg.checkRoot(OpBroadcast, root); err != nil {
		return nil, err
	}
	size := []int64{int64(len(b))}
	if err := pg.Broadcast(ctx, HostBuffer(size), root).Wait(ctx); err != nil {
		return nil, err
	}
	buf := b
	if pg.rank != root {
		buf = make([]byte, size[0])
	}
	if err := pg.Broadcast(ctx, HostBuffer(buf), root).Wait(ctx); err != nil {
		return nil, err
	}
	return buf, nil
}

// GatherBytes collects every rank's b on root: the result's element i is
// rank i's blob on root, nil elsewhere (c10d gather_object).
func (pg *ProcessGroup) GatherBytes(ctx context.Context, b []byte, root int) ([][]byte, error) {
	if pg.rank < 0 {
		pg.precheck(ctx, OpGather)
		return nil, nil
	}
	if err := pg.objectsOK(OpGather); err != nil {
		return nil, err
	}
	if err := pg.checkRoot(OpGather, root); err != nil {
		return nil, err
	}
	// As c10d: all-gather the sizes, pad every blob to the largest, gather.
	sizes := make([]int64, pg.size)
	if err := pg.AllGatherInto(ctx, HostBuffer(sizes), HostBuffer([]int64{int64(len(b))})).Wait(ctx); err != nil {
		return nil, err
	}
	maxLen := 0
	for _, s := range sizes {
		maxLen = max(maxLen, int(s))
	}
	padded := make([]byte, maxLen)
	copy(padded, b)
	var outs []Buffer
	var all []byte
	if pg.rank == root {
		all = make([]byte, maxLen*pg.size)
		outs = make([]Buffer, pg.size)
		for i := range outs {
			outs[i] = HostBuffer(all[i*maxLen : (i+1)*maxLen])
		}
	}
	if err := pg.Gather(ctx, outs, HostBuffer(padded), root).Wait(ctx); err != nil {
		return nil, err
	}
	if pg.rank != root {
		return nil, nil
	}
	res := make([][]byte, pg.size)
	for i, s := range sizes {
		res[i] = all[i*maxLen : i*maxLen+int(s) : i*maxLen+int(s)]
	}
	return res, nil
}

// ScatterBytes sends root's parts[i] to rank i and returns this rank's part
// (c10d scatter_object_list). parts (Size blobs) is read on root only.
func (pg *ProcessGroup) ScatterBytes(ctx context.Context, parts [][]byte, root int) ([]byte, error) {
	if pg.rank < 0 {
		pg.precheck(ctx, OpScatter)
		return nil, nil
	}
	if err := pg.objectsOK(OpScatter); err != nil {
		return nil, err
	}
	if err := pg.checkRoot(OpScatter, root); err != nil {
		return nil, err
	}
	if pg.rank == root {
		if err := pg.checkListLen(OpScatter, "parts", len(parts)); err != nil {
			return nil, err
		}
	}
	// Root broadcasts every part's size, then scatters the parts padded to
	// the largest.
	sizes := make([]int64, pg.size)
	if pg.rank == root {
		for i, p := range parts {
			sizes[i] = int64(len(p))
		}
	}
	if err := pg.Broadcast(ctx, HostBuffer(sizes), root).Wait(ctx); err != nil {
		return nil, err
	}
	maxLen := 0
	for _, s := range sizes {
		maxLen = max(maxLen, int(s))
	}
	var ins []Buffer
	if pg.rank == root {
		all := make([]byte, maxLen*pg.size)
		ins = make([]Buffer, pg.size)
		for i, p := range parts {
			copy(all[i*maxLen:], p)
			ins[i] = HostBuffer(all[i*maxLen : (i+1)*maxLen])
		}
	}
	out := make([]byte, maxLen)
	if err := pg.Scatter(ctx, HostBuffer(out), ins, root).Wait(ctx); err != nil {
		return nil, err
	}
	n := int(sizes[pg.rank])
	return out[:n:n], nil
}

// SendObjectList sends objs, a list of blobs (Go values the caller has
// encoded, e.g. with encoding/gob or JSON; Go has no pickle), to group rank
// dst, which receives them with RecvObjectList (semantics of
// torch.distributed.send_object_list). As c10d it sends two messages with
// tag 0: the blobs' sizes (int64×len(objs)), then their concatenated bytes
// (uint8×sum of sizes). An empty list is allowed (the receiver asks for 0
// objects). It blocks until both messages have left objs.
//
// Errors: a bad dst (out of range or this rank) is an *ArgError wrapping
// ErrInvalidArgument and nothing is sent; a device group returns an error
// wrapping ErrUnsupported; otherwise the Send's error (ErrTimeout,
// ErrTransport, ...). Like any Send it may complete once its data has left:
// a receiver asking for a different number of objects fails with
// ErrMismatch and breaks the communicator, so the sender's next op fails
// (docs/semantics.md). A non-member sends nothing and gets nil.
func (pg *ProcessGroup) SendObjectList(ctx context.Context, objs [][]byte, dst int) error {
	if pg.rank < 0 {
		pg.precheck(ctx, OpSend)
		return nil
	}
	if err := pg.objectsOK(OpSend); err != nil {
		return err
	}
	if err := pg.checkPeer(OpSend, dst, false); err != nil {
		return withCall(err, "SendObjectList")
	}
	sizes := make([]int64, len(objs))
	total := 0
	for i, o := range objs {
		sizes[i] = int64(len(o))
		total += len(o)
	}
	if err := pg.Send(ctx, HostBuffer(sizes), dst, 0); err != nil {
		return err
	}
	all := make([]byte, 0, total)
	for _, o := range objs {
		all = append(all, o...)
	}
	return pg.Send(ctx, HostBuffer(all), dst, 0)
}

// RecvObjectList receives a list of n blobs sent by SendObjectList from
// group rank src, or from whichever rank sends first with AnySource, and
// returns them with the sender's group rank (semantics of
// torch.distributed.recv_object_list, whose object_list argument has n
// elements and whose src=None is AnySource). The caller decodes each blob.
// n must equal the sender's list length; n == 0 receives an empty list.
//
// Errors: n < 0 or a bad src is an *ArgError wrapping ErrInvalidArgument
// and nothing is received; a device group returns an error wrapping
// ErrUnsupported; a sender with a different list length fails the receive
// with ErrMismatch; otherwise the Recv's error. A non-member gets nil, -1
// and no error.
func (pg *ProcessGroup) RecvObjectList(ctx context.Context, n, src int) ([][]byte, int, error) {
	if pg.rank < 0 {
		pg.precheck(ctx, OpRecv)
		return nil, -1, nil
	}
	if err := pg.objectsOK(OpRecv); err != nil {
		return nil, -1, err
	}
	if n < 0 {
		ae := pg.argErr(OpRecv, "invalid object count %d: expected the sender's list length (>= 0)", n)
		ae.Call = "RecvObjectList"
		return nil, -1, ae
	}
	if err := pg.checkPeer(OpRecv, src, true); err != nil {
		return nil, -1, withCall(err, "RecvObjectList")
	}
	sizes := make([]int64, n)
	from, err := pg.Recv(ctx, HostBuffer(sizes), src, 0)
	if err != nil {
		return nil, -1, err
	}
	total := 0
	for i, s := range sizes {
		if s < 0 {
			return nil, -1, fmt.Errorf("%w: RecvObjectList from rank %d: object %d has size %d", ErrMismatch, from, i, s)
		}
		total += int(s)
	}
	// The payload comes from the rank that sent the sizes, even with
	// AnySource.
	all := make([]byte, total)
	if _, err := pg.Recv(ctx, HostBuffer(all), from, 0); err != nil {
		return nil, -1, err
	}
	out := make([][]byte, n)
	off := 0
	for i, s := range sizes {
		out[i] = all[off : off+int(s) : off+int(s)]
		off += int(s)
	}
	return out, from, nil
}

// withCall heads an *ArgError with the method that was called.
func withCall(err error, call string) error {
	if ae, ok := err.(*ArgError); ok {
		ae.Call = call
	}
	return err
}
