package cpu

import (
	"context"
	"fmt"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu/transport"
)

// connectInmem builds one ring link per peer through opts.Hub and waits
// until every peer attached.
func (e *Engine) connectInmem(ctx context.Context) ([]transport.Link, error) {
	links := make([]transport.Link, e.cfg.Size)
	if e.cfg.Size == 1 {
		return links, nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	hub := e.opts.Hub
	end := &transport.InmemEnd{Rank: e.cfg.Rank, OnNotice: e.onNotice, OnAck: e.onAck, Poke: e.ctl.Poke}
	ctrls := make([]*transport.InmemCtrl, e.cfg.Size)
	for p := range e.cfg.Size {
		if p == e.cfg.Rank {
			continue
		}
		pair, k, side, err := hub.Attach(e.cfg.Group, e.cfg.Epoch, e.cfg.Rank, p, e.opts.ShmRingBytes, end)
		if err != nil {
			for _, c := range ctrls {
				if c != nil {
					c.Close()
				}
			}
			return nil, err
		}
		ctrls[p] = &transport.InmemCtrl{Hub: hub, Key: k, Pair: pair, Side: side}
	}
	for p, c := range ctrls {
		if c == nil {
			continue
		}
		for {
			hub.Mu.Lock()
			ok := c.Pair.Ends[1-c.Side] != nil
			ch := hub.Changed
			hub.Mu.Unlock()
			if ok {
				break
			}
			select {
			case <-ch:
			case <-ctx.Done():
				for _, c := range ctrls {
					if c != nil {
						c.Close()
					}
				}
				return nil, &comm.TransportError{Rank: e.cfg.Rank, Peer: p, Err: fmt.Errorf("rendezvous: rank %d did not attach to the hub: %w", p, ctx.Err())}
			}
		}
		s := transport.RingsOver(c.Pair.Mem, e.opts.ShmRingBytes, c.Side == 0)
		s.Start(p, e.ctl, c)
		links[p] = s
		e.ctl.Pumps = append(e.ctl.Pumps, s)
	}
	if e.opts.FlatThreshold > 0 && e.cfg.Size <= transport.MaxFlatRanks {
		mem, release, err := hub.Group(e.cfg.Group, e.cfg.Epoch, e.cfg.Size, e.opts.FlatThreshold)
		if err != nil {
			for _, c := range ctrls {
				if c != nil {
					c.Close()
				}
			}
			return nil, err
		}
		e.grp = transport.GroupOver(mem, e.cfg.Size, e.opts.FlatThreshold, e.cfg.Rank)
		e.grp.Release = release
		// Every rank is a goroutine of this process: waits keep the
		// backoff of link.go (see attachGroup).
	}
	return links, nil
}
