package cpu

import (
	"context"

	"github.com/ranktree/ranktree/comm/cpu/transport"
)

// connectInmem builds one ring link per peer through opts.Hub (and the
// group segment of the one-step algorithms) and waits until every peer
// attached.
func (e *Engine) connectInmem(ctx context.Context) ([]transport.Link, error) {
	if e.cfg.Size == 1 {
		return make([]transport.Link, 1), nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	cfg := transport.InmemConfig{Group: e.cfg.Group, Epoch: e.cfg.Epoch, Rank: e.cfg.Rank, Size: e.cfg.Size,
		RingBytes: e.opts.ShmRingBytes, SlotBytes: e.opts.SlotBytes}
	links, grp, err := e.opts.Hub.Connect(ctx, cfg, e.ctl)
	if err != nil {
		return nil, err
	}
	e.grp = grp
	return links, nil
}
