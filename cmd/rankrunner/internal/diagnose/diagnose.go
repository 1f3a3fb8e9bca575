// Package diagnose is `rankrunner diagnose`: it fetches the flight-recorder
// dumps ranks wrote to the job's store (keys "trace/<rank>", at job level
// or under an attempt's "restart/<n>/" prefix; the c10d counterpart is
// TORCH_NCCL_DEBUG_INFO_TEMP_FILE dumps read by the fr_trace analyzer) and
// merges them with supervisor.MergeDumps into a report naming, per process
// group, the first seq where ranks disagree and the stuck or missing ranks.
package diagnose

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/supervisor"
)

// StoredDump is one rank's flight-recorder dump as read from the store.
type StoredDump struct {
	Rank int
	Key  string          // store key it was read from
	Raw  json.RawMessage // the JSON as written by the rank
}

// Fetch collects the dumps under each prefix ("" for job level,
// "restart/<n>/" for an attempt): every key prefix+"trace/<rank>" present
// in the store. The store interface has no listing, so Fetch replays a
// Watch of the prefix and stops once no new key arrived for quiet. A rank
// with dumps under several prefixes keeps the one of the latest prefix.
func Fetch(ctx context.Context, st store.Store, prefixes []string, quiet time.Duration) ([]StoredDump, error) {
	byRank := map[int]StoredDump{}
	for _, p := range prefixes {
		wctx, cancel := context.WithCancel(ctx)
		ch, err := st.Watch(wctx, p+"trace/", true)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("diagnose: watch %strace/: %w", p, err)
		}
		timer := time.NewTimer(quiet)
	collect:
		for {
			select {
			case ev, ok := <-ch:
				if !ok {
					break collect
				}
				if ev.Type != store.EventPut {
					continue
				}
				rank, err := strconv.Atoi(strings.TrimPrefix(ev.Key, p+"trace/"))
				if err != nil {
					continue // not a rank dump (e.g. trace/<rank>/part)
				}
				if !json.Valid(ev.Value) {
					cancel()
					timer.Stop()
					return nil, fmt.Errorf("diagnose: %s holds invalid JSON (%d bytes)", ev.Key, len(ev.Value))
				}
				byRank[rank] = StoredDump{Rank: rank, Key: ev.Key, Raw: json.RawMessage(ev.Value)}
				timer.Reset(quiet)
			case <-timer.C:
				break collect
			case <-ctx.Done():
				cancel()
				return nil, ctx.Err()
			}
		}
		timer.Stop()
		cancel()
	}
	out := make([]StoredDump, 0, len(byRank))
	for _, d := range byRank {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rank < out[j].Rank })
	return out, nil
}

// Missing returns the ranks of 0..worldSize-1 without a dump.
func Missing(dumps []StoredDump, worldSize int) []int {
	have := map[int]bool{}
	for _, d := range dumps {
		have[d.Rank] = true
	}
	var miss []int
	for r := 0; r < worldSize; r++ {
		if !have[r] {
			miss = append(miss, r)
		}
	}
	return miss
}

// ListDumps prints what Fetch found: the ranks with dumps, their sizes and
// keys, and the missing ranks (worldSize > 0).
func ListDumps(w io.Writer, dumps []StoredDump, worldSize int) {
	fmt.Fprintf(w, "flight-recorder dumps: %d\n", len(dumps))
	for _, d := range dumps {
		fmt.Fprintf(w, "  rank %-4d %7d bytes  %s\n", d.Rank, len(d.Raw), d.Key)
	}
	if worldSize > 0 {
		if m := Missing(dumps, worldSize); len(m) > 0 {
			fmt.Fprintf(w, "missing ranks (no dump): %v\n", m)
		} else {
			fmt.Fprintf(w, "every rank of %d wrote a dump\n", worldSize)
		}
	}
}

// Merge parses the dumps (supervisor.ParseDump) and merges them
// (supervisor.MergeDumps). worldSize > 0 widens the world so that ranks
// beyond every dump's world size count as missing. A dump that does not
// parse is an error naming its key.
func Merge(dumps []StoredDump, worldSize int) (supervisor.Report, error) {
	parsed := make([]supervisor.Dump, 0, len(dumps))
	for _, d := range dumps {
		pd, err := supervisor.ParseDump(d.Raw)
		if err != nil {
			return supervisor.Report{}, fmt.Errorf("diagnose: %s: %w", d.Key, err)
		}
		parsed = append(parsed, pd)
	}
	rep := supervisor.MergeDumps(parsed)
	if worldSize > rep.WorldSize {
		for r := rep.WorldSize; r < worldSize; r++ {
			rep.MissingDumps = append(rep.MissingDumps, r)
			rep.Stuck = append(rep.Stuck, r)
		}
		rep.WorldSize = worldSize
	}
	return rep, nil
}
