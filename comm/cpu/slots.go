package cpu

// Slots is what a one-step shared-memory algorithm sees of the group (the
// counterpart of Mesh for Open MPI's coll/sm and MPICH's release-gather):
// one slot per rank in the group segment (transport/shm_group.go), written by its
// rank and read in place by every other. Each one-step op publishes every
// rank's slot, even one with nothing to contribute (a broadcast's
// non-roots publish an empty one), and every rank reads every slot's
// header: so every rank checks every other rank's fingerprint, and the op
// needs no separate agreement step (agree.go). Methods are called from
// one goroutine.
type Slots interface {
	// Rank and Size are this member's group rank and the group size.
	Rank() int
	Size() int
	// Publish copies payload (at most Options.FlatThreshold bytes) with
	// the current op's header into this rank's slot for the next one-step
	// op and publishes it to every peer.
	Publish(payload []byte) error
	// Slot waits until rank p published its slot of the current op,
	// checks its header against this rank's op (fingerprint, and a
	// payload of n bytes) and returns the payload, which stays valid and
	// unchanged until this rank's next Publish (a peer reuses its slot
	// of op k for op k+2 only once every rank published op k+1).
	// Slot(Rank(), n) is this rank's own.
	Slot(p, n int) ([]byte, error)
	// Reduce combines src into dst with the op's reduction (dst = op(dst, src)).
	Reduce(dst, src []byte) error
}
