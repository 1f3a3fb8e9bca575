package ddp

import (
	"fmt"
	"math/rand/v2"

	"github.com/ranktree/ranktree/comm"
)

// DistributedSampler splits the sample indices [0, Len) of a dataset into
// one disjoint shard per rank, with the semantics of
// torch.utils.data.DistributedSampler:
//
//   - with Shuffle, each epoch's indices are a permutation drawn from a
//     generator seeded by Seed+epoch, so every rank draws the same one
//     without communicating (call SetEpoch before each epoch);
//   - without DropLast the list is padded by repeating its head until its
//     length is a multiple of the world size (every rank gets the same
//     number of samples, so collectives stay matched); with DropLast the
//     tail is cut instead;
//   - rank r takes positions r, r+Size, r+2·Size, ... of that list.
//
// The permutation comes from math/rand/v2's PCG, not torch.randperm, so
// the order differs from PyTorch's for the same seed; the semantics do
// not. A DistributedSampler is a plain value owned by one goroutine.
type DistributedSampler struct {
	cfg   SamplerConfig
	epoch int
}

// SamplerConfig configures NewDistributedSampler (the arguments of
// torch.utils.data.DistributedSampler).
type SamplerConfig struct {
	// Len is the dataset size (number of samples), ≥ 1.
	Len int
	// Rank and Size are this rank and the world size (num_replicas):
	// 0 ≤ Rank < Size. Model.Rank() and Model.Size() give them.
	Rank, Size int
	// Shuffle permutes the indices every epoch (torch's default is true).
	Shuffle bool
	// Seed seeds the permutation; every rank must use the same value.
	Seed uint64
	// DropLast cuts the tail instead of padding (torch's default: false).
	DropLast bool
}

// NewDistributedSampler validates cfg and returns the sampler at epoch 0.
// Errors wrap comm.ErrInvalidArgument: Len < 1, Size < 1, Rank outside
// [0, Size), or DropLast with fewer samples than ranks (every shard would
// be empty).
func NewDistributedSampler(cfg SamplerConfig) (*DistributedSampler, error) {
	bad := func(format string, args ...any) (*DistributedSampler, error) {
		return nil, fmt.Errorf("%w: ddp: sampler: %s", comm.ErrInvalidArgument, fmt.Sprintf(format, args...))
	}
	switch {
	case cfg.Len < 1:
		return bad("dataset length %d, want ≥ 1", cfg.Len)
	case cfg.Size < 1:
		return bad("world size %d, want ≥ 1", cfg.Size)
	case cfg.Rank < 0 || cfg.Rank >= cfg.Size:
		return bad("rank %d outside [0, %d)", cfg.Rank, cfg.Size)
	case cfg.DropLast && cfg.Len < cfg.Size:
		return bad("drop_last with %d samples for %d ranks leaves every shard empty", cfg.Len, cfg.Size)
	}
	return &DistributedSampler{cfg: cfg}, nil
}

// SetEpoch selects the epoch whose permutation Indices returns
// (DistributedSampler.set_epoch). Call it at the start of every epoch with
// the same value on every rank, or every epoch sees the same order.
func (s *DistributedSampler) SetEpoch(epoch int) { s.epoch = epoch }

// EpochIndices is SetEpoch(epoch) followed by Indices(): this rank's
// shard for that epoch, in one call that replaces a single-process
// program's per-epoch permutation.
func (s *DistributedSampler) EpochIndices(epoch int) []int {
	s.SetEpoch(epoch)
	return s.Indices()
}

// Epoch is the epoch set last (0 at first).
func (s *DistributedSampler) Epoch() int { return s.epoch }

// NumSamples is the length of this rank's shard: ceil(Len/Size) without
// DropLast, floor(Len/Size) with it. It is the same on every rank.
func (s *DistributedSampler) NumSamples() int {
	if s.cfg.DropLast {
		return s.cfg.Len / s.cfg.Size
	}
	return (s.cfg.Len + s.cfg.Size - 1) / s.cfg.Size
}

// TotalSize is NumSamples × Size: the length of the padded (or cut) list.
func (s *DistributedSampler) TotalSize() int { return s.NumSamples() * s.cfg.Size }

// Indices returns this rank's shard for the current epoch: NumSamples
// dataset indices, each in [0, Len). It allocates a new slice.
func (s *DistributedSampler) Indices() []int {
	n := s.cfg.Len
	var all []int
	if s.cfg.Shuffle {
		rng := rand.New(rand.NewPCG(s.cfg.Seed+uint64(s.epoch), 0x9e3779b97f4a7c15))
		all = rng.Perm(n)
	} else {
		all = make([]int, n)
		for i := range all {
			all[i] = i
		}
	}
	total := s.TotalSize()
	for len(all) < total { // pad by repeating the head, as often as needed
		all = append(all, all[:min(total-len(all), n)]...)
	}
	all = all[:total]
	out := make([]int, 0, s.NumSamples())
	for i := s.cfg.Rank; i < total; i += s.cfg.Size {
		out = append(out, all[i])
	}
	return out
}
