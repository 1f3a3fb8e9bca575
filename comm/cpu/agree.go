package cpu

import "github.com/ranktree/ranktree/comm/cpu/transport"

// agreeDissemination makes every rank learn that every other rank launched
// the same op (fingerprint) and got this far without an error: the
// dissemination barrier (Hensgen, Finkel and Manber), with header-only
// messages. In round k each rank sends to rank+2^k and receives from
// rank-2^k; after ceil(log2 n) rounds every rank has heard, directly or
// through ranks that checked it, from every other. Each message carries
// the op's fingerprint and is checked on arrival, so a rank that launched
// something else makes a mismatch, not a hang, and a rank that failed
// earlier (and told everyone) never sends, so nobody completes.
//
// The engine runs it before the data of a rooted collective (Broadcast,
// Reduce, Gather, Scatter: some ranks there only send, and a root
// mismatch would otherwise leave ranks waiting for data nobody sends) and
// after the data of the collectives whose per-rank sizes the fingerprint
// does not fix (AllGatherV, ReduceScatterV, AllToAll with split sizes).
// Cost: ceil(log2 n) rounds of 64-byte messages.
func agreeDissemination(m Mesh) error {
	n, r := m.Size(), m.Rank()
	round := 0
	for k := 1; k < n; k <<= 1 {
		if err := m.Send((r+k)%n, transport.AgreeStep0+round, nil); err != nil {
			return err
		}
		if err := m.Recv((r-k+n)%n, transport.AgreeStep0+round, nil); err != nil {
			return err
		}
		round++
	}
	return m.Flush()
}
