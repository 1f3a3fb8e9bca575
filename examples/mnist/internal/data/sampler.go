package data

import (
	"fmt"
	"math/rand/v2"
)

// DistributedSampler splits the indices [0, n) of a dataset into one disjoint
// shard per rank, as torch.utils.data.DistributedSampler does:
//
//   - every epoch, if Shuffle is set, the indices are permuted with a
//     generator seeded by Seed+epoch (so every rank draws the same
//     permutation without communicating; call SetEpoch before each epoch);
//   - without DropLast the list is padded by repeating its head until its
//     length is a multiple of the world size (so every rank gets the same
//     number of samples and collectives stay matched); with DropLast the
//     tail is cut instead;
//   - rank r takes positions r, r+size, r+2·size, ... of that list.
//
// The permutation comes from math/rand/v2's PCG, not torch.randperm, so the
// order differs from PyTorch's for the same seed; the semantics do not.
// A DistributedSampler is a plain value owned by one goroutine.
type DistributedSampler struct {
	n, rank, size int
	shuffle       bool
	dropLast      bool
	seed          uint64
	epoch         int
}

// SamplerConfig configures NewDistributedSampler.
type SamplerConfig struct {
	// Len is the dataset size (number of samples), ≥ 1.
	Len int
	// Rank and Size are this rank and the world size: 0 ≤ Rank < Size.
	Rank, Size int
	// Shuffle permutes the indices every epoch (torch default: true).
	Shuffle bool
	// Seed seeds the permutation; every rank must use the same value.
	Seed uint64
	// DropLast cuts the tail instead of padding (torch default: false).
	DropLast bool
}

// NewDistributedSampler validates cfg and returns the sampler at epoch 0.
// It fails if Len < 1, Size < 1, Rank is outside [0, Size), or DropLast is
// set with fewer samples than ranks (every shard would be empty).
func NewDistributedSampler(cfg SamplerConfig) (*DistributedSampler, error) {
	switch {
	case cfg.Len < 1:
		return nil, fmt.Errorf("sampler: dataset length %d, want ≥ 1", cfg.Len)
	case cfg.Size < 1:
		return nil, fmt.Errorf("sampler: world size %d, want ≥ 1", cfg.Size)
	case cfg.Rank < 0 || cfg.Rank >= cfg.Size:
		return nil, fmt.Errorf("sampler: rank %d outside [0, %d)", cfg.Rank, cfg.Size)
	case cfg.DropLast && cfg.Len < cfg.Size:
		return nil, fmt.Errorf("sampler: drop_last with %d samples for %d ranks leaves every shard empty", cfg.Len, cfg.Size)
	}
	return &DistributedSampler{n: cfg.Len, rank: cfg.Rank, size: cfg.Size, shuffle: cfg.Shuffle, dropLast: cfg.DropLast, seed: cfg.Seed}, nil
}

// SetEpoch selects the epoch whose permutation Indices returns
// (DistributedSampler.set_epoch). Call it at the start of every epoch, with
// the same value on every rank, or every epoch sees the same order.
func (s *DistributedSampler) SetEpoch(epoch int) { s.epoch = epoch }

// NumSamples is the length of this rank's shard: ceil(Len/Size) without
// DropLast, floor(Len/Size) with it. It is the same on every rank.
func (s *DistributedSampler) NumSamples() int {
	if s.dropLast {
		return s.n / s.size
	}
	return (s.n + s.size - 1) / s.size
}

// TotalSize is NumSamples × Size: the length of the padded (or cut) list.
func (s *DistributedSampler) TotalSize() int { return s.NumSamples() * s.size }

// Indices returns this rank's shard for the current epoch: NumSamples
// dataset indices, each in [0, Len). It allocates a new slice.
func (s *DistributedSampler) Indices() []int {
	var all []int
	if s.shuffle {
		rng := rand.New(rand.NewPCG(s.seed+uint64(s.epoch), 0x9e3779b97f4a7c15))
		all = rng.Perm(s.n)
	} else {
		all = make([]int, s.n)
		for i := range all {
			all[i] = i
		}
	}
	total := s.TotalSize()
	for len(all) < total { // pad by repeating the head, as often as needed
		all = append(all, all[:min(total-len(all), s.n)]...)
	}
	all = all[:total]
	out := make([]int, 0, s.NumSamples())
	for i := s.rank; i < total; i += s.size {
		out = append(out, all[i])
	}
	return out
}
