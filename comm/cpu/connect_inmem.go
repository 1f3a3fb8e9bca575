package cpu

import (
	"context"
	"fmt"

	"github.com/ranktree/ranktree/comm"
)

// connectInmem builds one ring link per peer through opts.Hub and waits
// until every peer attached.
func (e *Engine) connectInmem(ctx context.Context) ([]link, error) {
	links := make([]link, e.cfg.Size)
	if e.cfg.Size == 1 {
		return links, nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	hub := e.opts.Hub
	end := &inmemEnd{rank: e.cfg.Rank, onNotice: e.onNotice, onAck: e.onAck, poke: e.ctl.poke}
	ctrls := make([]*inmemCtrl, e.cfg.Size)
	for p := range e.cfg.Size {
		if p == e.cfg.Rank {
			continue
		}
		pair, k, side, err := hub.attach(e.cfg.Group, e.cfg.Epoch, e.cfg.Rank, p, e.opts.ShmRingBytes, end)
		if err != nil {
			for _, c := range ctrls {
				if c != nil {
					c.close()
				}
			}
			return nil, err
		}
		ctrls[p] = &inmemCtrl{hub: hub, key: k, pair: pair, side: side}
	}
	for p, c := range ctrls {
		if c == nil {
			continue
		}
		for {
			hub.mu.Lock()
			ok := c.pair.ends[1-c.side] != nil
			ch := hub.changed
			hub.mu.Unlock()
			if ok {
				break
			}
			select {
			case <-ch:
			case <-ctx.Done():
				for _, c := range ctrls {
					if c != nil {
						c.close()
					}
				}
				return nil, &comm.TransportError{Rank: e.cfg.Rank, Peer: p, Err: fmt.Errorf("rendezvous: rank %d did not attach to the hub: %w", p, ctx.Err())}
			}
		}
		s := ringsOver(c.pair.mem, e.opts.ShmRingBytes, c.side == 0)
		s.start(p, e.ctl, c)
		links[p] = s
		e.ctl.pumps = append(e.ctl.pumps, s)
	}
	if e.opts.FlatThreshold > 0 && e.cfg.Size <= maxFlatRanks {
		mem, release, err := hub.group(e.cfg.Group, e.cfg.Epoch, e.cfg.Size, e.opts.FlatThreshold)
		if err != nil {
			for _, c := range ctrls {
				if c != nil {
					c.close()
				}
			}
			return nil, err
		}
		e.grp = groupOver(mem, e.cfg.Size, e.opts.FlatThreshold, e.cfg.Rank)
		e.grp.release = release
		// Every rank is a goroutine of this process: waits keep the
		// backoff of link.go (see attachGroup).
	}
	return links, nil
}
