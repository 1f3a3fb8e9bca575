// Package enginekit holds what the built-in engines (comm/cpu and
// comm/nccl) share and would otherwise each write out: the
// comm.BackendFactory adapter, the group-rank to global-rank map, fault
// injection from RANKTREE_FAULT (comm.ParseFaults) and buffer lengths.
// It has no state; each engine calls it with its own BackendConfig.
package enginekit

import (
	"context"
	"fmt"
	"os"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
)

// Factory adapts an engine constructor to comm.BackendFactory, binding
// opts. A constructor's error comes back as is, with a nil Backend (never
// a typed nil inside the interface).
func Factory[E comm.Backend, O any](newEngine func(context.Context, comm.BackendConfig, O) (E, error), opts O) comm.BackendFactory {
	return func(ctx context.Context, cfg comm.BackendConfig) (comm.Backend, error) {
		e, err := newEngine(ctx, cfg, opts)
		if err != nil {
			return nil, err
		}
		return e, nil
	}
}

// GlobalRank maps rank r of cfg's group to the job's global rank
// (cfg.GlobalRanks[r]); without a full GlobalRanks list the group is the
// world and r is returned.
func GlobalRank(cfg *comm.BackendConfig, r int) int {
	if len(cfg.GlobalRanks) == cfg.Size && r >= 0 && r < len(cfg.GlobalRanks) {
		return cfg.GlobalRanks[r]
	}
	return r
}

// CrashExitCode is the exit status of a process that an injected "crash"
// fault ends.
const CrashExitCode = 3

// exit is os.Exit; tests replace it.
var exit = os.Exit

// InjectFault applies the first of cfg.Faults that strikes op on this rank
// (matching its global rank, cfg.Group and op's seq; point-to-point ops,
// which count their own seq, never match), after logging it on log:
//
//   - "crash": the process exits with CrashExitCode;
//   - "error": the op fails with a *comm.EngineError from engine;
//   - "hang": hang is true, and the engine must never complete the op on
//     its own (its Work waits for Abort or Close).
//
// No matching fault: (false, nil).
func InjectFault(cfg *comm.BackendConfig, engine string, op *comm.Op, log *zerolog.Logger) (hang bool, err error) {
	if len(cfg.Faults) == 0 || comm.UsesP2PSeq(op) {
		return false, nil
	}
	g := GlobalRank(cfg, cfg.Rank)
	for _, f := range cfg.Faults {
		if !f.Matches(g, cfg.Group, op.FP.Seq) {
			continue
		}
		log.Warn().Str("fault", f.Kind).Uint64("seq", f.Seq).Int("rank", g).Msg("injected fault")
		switch f.Kind {
		case comm.FaultHang:
			return true, nil
		case comm.FaultCrash:
			fmt.Fprintf(os.Stderr, "ranktree: injected fault: crash at rank %d, %v\n", g, op.FP)
			exit(CrashExitCode)
		case comm.FaultError:
			return false, &comm.EngineError{Engine: engine, Rank: cfg.Rank, FP: op.FP, Msg: "injected fault (error)"}
		}
	}
	return false, nil
}

// TotalLen is the number of elements in bufs together.
func TotalLen(bufs []comm.Buffer) int {
	t := 0
	for _, b := range bufs {
		t += b.Len()
	}
	return t
}
