package comm

import (
	"fmt"
	"strconv"
	"strings"
)

// FaultEnvVar is the environment variable holding injected faults for tests
// and users' own chaos tests. Engines honour it only when it is set.
const FaultEnvVar = "RANKTREE_FAULT"

// Fault kinds accepted by ParseFaults.
const (
	FaultHang  = "hang"  // the engine blocks at the op until the communicator is aborted
	FaultCrash = "crash" // the process exits with code 3 after printing the fault
	FaultError = "error" // the op fails with an *EngineError
)

// FaultSpecError reports a malformed RANKTREE_FAULT value. Var is the
// variable's name, Spec the offending ';'-separated part, Msg what is wrong
// with it. It unwraps to ErrInvalidArgument.
type FaultSpecError struct {
	Var  string
	Spec string
	Msg  string
}

// Error names the variable, the bad part and the expected syntax.
func (e *FaultSpecError) Error() string {
	return fmt.Sprintf("comm: invalid %s part %q: %s (want kind@rank=R,seq=S[,group=G] with kind hang|crash|error, parts separated by ';')",
		e.Var, e.Spec, e.Msg)
}

// Unwrap returns ErrInvalidArgument.
func (e *FaultSpecError) Unwrap() error { return ErrInvalidArgument }

// ParseFaults parses RANKTREE_FAULT's syntax into faults, in the order given.
//
// Syntax: one or more specs separated by ';'. Each spec is
//
//	kind@rank=R,seq=S[,group=G]
//
// where kind is hang, crash or error; R is a global rank (≥ 0); S is the
// collective sequence number (≥ 1, the first collective of a group is seq 1);
// and G, optional, restricts the fault to the process group named G. Keys may
// come in any order, each at most once; spaces around tokens are ignored and
// empty specs (a trailing ';') are skipped. Examples:
//
//	hang@rank=1,seq=5
//	crash@rank=2,seq=3
//	error@rank=0,seq=2,group=pg1;hang@rank=3,seq=9
//
// An empty or all-blank s gives no faults and no error. A malformed spec
// gives a *FaultSpecError naming RANKTREE_FAULT and the bad part.
func ParseFaults(s string) ([]Fault, error) {
	var out []Fault
	for _, part := range strings.Split(s, ";") {
		spec := strings.TrimSpace(part)
		if spec == "" {
			continue
		}
		f, err := parseFault(spec)
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

func parseFault(spec string) (Fault, error) {
	bad := func(format string, a ...any) (Fault, error) {
		return Fault{}, &FaultSpecError{Var: FaultEnvVar, Spec: spec, Msg: fmt.Sprintf(format, a...)}
	}
	kind, args, ok := strings.Cut(spec, "@")
	if !ok {
		return bad("missing '@' after the kind")
	}
	f := Fault{Kind: strings.ToLower(strings.TrimSpace(kind))}
	switch f.Kind {
	case FaultHang, FaultCrash, FaultError:
	case "":
		return bad("missing kind before '@'")
	default:
		return bad("unknown kind %q", f.Kind)
	}
	var haveRank, haveSeq, haveGroup bool
	for _, kv := range strings.Split(args, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			return bad("empty key=value pair")
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return bad("%q is not key=value", kv)
		}
		k, v = strings.ToLower(strings.TrimSpace(k)), strings.TrimSpace(v)
		switch k {
		case "rank":
			if haveRank {
				return bad("rank given twice")
			}
			n, err := strconv.ParseInt(v, 10, 32)
			if err != nil || n < 0 {
				return bad("rank %q is not an integer ≥ 0", v)
			}
			f.Rank, haveRank = int(n), true
		case "seq":
			if haveSeq {
				return bad("seq given twice")
			}
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil || n == 0 {
				return bad("seq %q is not an integer ≥ 1", v)
			}
			f.Seq, haveSeq = n, true
		case "group":
			if haveGroup {
				return bad("group given twice")
			}
			if v == "" || strings.ContainsAny(v, "@;,=") {
				return bad("group %q is empty or contains one of @;,=", v)
			}
			f.Group, haveGroup = v, true
		default:
			return bad("unknown key %q (want rank, seq or group)", k)
		}
	}
	if !haveRank {
		return bad("missing rank=")
	}
	if !haveSeq {
		return bad("missing seq=")
	}
	return f, nil
}

// String formats f in RANKTREE_FAULT syntax, e.g. "hang@rank=1,seq=5" or
// "error@rank=0,seq=2,group=pg1"; ParseFaults(f.String()) gives f back.
func (f Fault) String() string {
	s := fmt.Sprintf("%s@rank=%d,seq=%d", f.Kind, f.Rank, f.Seq)
	if f.Group != "" {
		s += ",group=" + f.Group
	}
	return s
}

// Matches reports whether f applies to the op at collective sequence number
// seq of group on global rank rank (f.Group "" matches every group).
func (f Fault) Matches(rank int, group string, seq uint64) bool {
	return f.Rank == rank && f.Seq == seq && (f.Group == "" || f.Group == group)
}
