package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// DumpSubject is the NATS subject on which rank answers flight-recorder
// dump requests: ranktree.<job>.trace.<rank>.
func DumpSubject(job string, rank int) string {
	return "ranktree." + job + ".trace." + strconv.Itoa(rank)
}

// DumpAllSubject is the subject every rank of a job answers:
// ranktree.<job>.trace.all (RequestDumps collects the replies).
func DumpAllSubject(job string) string { return "ranktree." + job + ".trace.all" }

// DumpService answers dump requests over NATS for one rank: the reply is
// the rank's Dump as JSON (shortened like the store copy), and the dump is
// also written where the Dumper writes (trace dir, store) in the background.
type DumpService struct {
	subs []*nats.Subscription
}

// ServeDumps subscribes rank to DumpSubject and DumpAllSubject. dumper may
// be nil (reply only). Stop with Close.
func ServeDumps(nc *nats.Conn, job string, rank int, rec *FlightRecorder, dumper DumpWriter, log zerolog.Logger) (*DumpService, error) {
	if nc == nil || rec == nil {
		return nil, errors.New("supervisor: ServeDumps needs a NATS connection and a flight recorder")
	}
	handle := func(m *nats.Msg) {
		d := rec.Dump("request")
		data, err := storeDumpBytes(d)
		if err != nil {
			log.Error().Err(err).Int("rank", rank).Msg("dump request: marshal failed")
			return
		}
		if err := m.Respond(data); err != nil {
			log.Warn().Err(err).Int("rank", rank).Msg("dump request: reply failed")
		}
		if dumper != nil {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := dumper.Dump(ctx, "request"); err != nil {
					log.Warn().Err(err).Int("rank", rank).Msg("dump request: writing the dump failed")
				}
			}()
		}
	}
	s := &DumpService{}
	for _, subj := range []string{DumpSubject(job, rank), DumpAllSubject(job)} {
		sub, err := nc.Subscribe(subj, handle)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("supervisor: subscribing rank %d to %s: %w", rank, subj, err)
		}
		s.subs = append(s.subs, sub)
	}
	return s, nc.Flush()
}

// Close unsubscribes. Idempotent.
func (s *DumpService) Close() {
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
	s.subs = nil
}

// RequestDumps asks every rank of job for its dump (DumpAllSubject) and
// collects replies until world ranks answered or wait passed, whichever is
// first; ranks that did not answer are simply absent (MergeDumps reports
// them). The result is sorted by rank; a later reply of a rank replaces an
// earlier one. `rankrunner diagnose` on a live job calls it.
func RequestDumps(ctx context.Context, nc *nats.Conn, job string, world int, wait time.Duration) ([]Dump, error) {
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(DumpAllSubject(job), inbox, nil); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	byRank := map[int]Dump{}
	for len(byRank) < world {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			break // deadline: return what came
		}
		d, err := ParseDump(m.Data)
		if err != nil {
			continue
		}
		byRank[d.Rank] = d
	}
	out := make([]Dump, 0, len(byRank))
	for _, d := range byRank {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b Dump) int { return a.Rank - b.Rank })
	return out, nil
}
