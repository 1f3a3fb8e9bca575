package testrank

import (
	"fmt"

	"github.com/ranktree/ranktree/comm"
)

// PanicAtSeq wraps be so that its Launch panics when given the collective
// op with sequence number seq (point-to-point ops keep their own counter
// and never panic): a bug in the communicator actor's launch path, for the
// tests of the actor-panic policies (RANKTREE_ACTOR_PANIC).
func PanicAtSeq(be comm.Backend, seq uint64) comm.Backend { return &panicky{Backend: be, seq: seq} }

type panicky struct {
	comm.Backend
	seq uint64
}

func (b *panicky) Launch(op *comm.Op, p *comm.Promise) {
	if op.FP.Seq == b.seq && !comm.UsesP2PSeq(op) {
		panic(fmt.Sprintf("injected panic at seq %d", b.seq))
	}
	b.Backend.Launch(op, p)
}
