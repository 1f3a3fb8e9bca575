package comm_test

import (
	"testing"

	"github.com/ranktree/ranktree/comm"
)

// TestSetIdentityStampsEveryDepth: a Coalesced op's children, and theirs,
// carry the parent's group, epoch and seq after one SetIdentity, and keep
// their own shape (type, count).
func TestSetIdentityStampsEveryDepth(t *testing.T) {
	leaf := &comm.Op{Type: comm.OpSend, FP: comm.Fingerprint{Op: comm.OpSend, Count: 3}}
	inner := &comm.Op{Type: comm.OpCoalesced, FP: comm.Fingerprint{Op: comm.OpCoalesced}, Children: []*comm.Op{leaf}}
	mid := &comm.Op{Type: comm.OpAllReduce, FP: comm.Fingerprint{Op: comm.OpAllReduce, Count: 7}}
	op := &comm.Op{Type: comm.OpCoalesced, FP: comm.Fingerprint{Op: comm.OpCoalesced, Count: 10}, Children: []*comm.Op{mid, inner}}
	op.SetIdentity(comm.GroupHash("g"), 4, 9)
	for _, o := range []*comm.Op{op, mid, inner, leaf} {
		if o.FP.Group != comm.GroupHash("g") || o.FP.Epoch != 4 || o.FP.Seq != 9 {
			t.Errorf("%v: identity %+v, want group g, epoch 4, seq 9", o.Type, o.FP)
		}
	}
	if leaf.FP.Op != comm.OpSend || leaf.FP.Count != 3 || mid.FP.Count != 7 {
		t.Errorf("shapes changed: leaf %+v, mid %+v", leaf.FP, mid.FP)
	}
}
