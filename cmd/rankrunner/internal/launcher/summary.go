package launcher

import (
	"fmt"
	"strings"
)

// failureSummary is the root-cause summary rankrunner prints when an
// attempt fails (torchrun's ChildFailedError table): a header, then one
// line per failed local rank with its exit code or signal and the error it
// reported, the root cause first. A root cause that is not a local rank
// (another runner's rank, a signal to the runner, a lost runner) is the
// first line, from the outcome's reason. Times are offsets from the local
// root cause's exit.
func failureSummary(job string, attempt int, o Outcome) string {
	var b strings.Builder
	fmt.Fprintf(&b, "rankrunner: job %s attempt %d %s (exit code %d); failed ranks, root cause first:\n", job, attempt, o.Kind, o.ExitCode)
	fails := o.Failures
	local := !o.Remote && o.Rank >= 0 && len(fails) > 0 && fails[0].Rank == o.Rank
	if local {
		writeFailure(&b, "root cause", fails[0])
		for _, f := range fails[1:] {
			tag := fmt.Sprintf("failed +%.2fs", f.At.Sub(fails[0].At).Seconds())
			if f.Stopped {
				tag = fmt.Sprintf("stopped +%.2fs", f.At.Sub(fails[0].At).Seconds())
			}
			writeFailure(&b, tag, f)
		}
		return b.String()
	}
	fmt.Fprintf(&b, "  [root cause] %s; error: %s\n", o.Reason, orNone(o.Error))
	for _, f := range fails {
		tag := "failed"
		if f.Stopped {
			tag = "stopped"
		}
		writeFailure(&b, tag, f)
	}
	return b.String()
}

func writeFailure(b *strings.Builder, tag string, f RankFailure) {
	fmt.Fprintf(b, "  [%s] rank %d (local %d, pid %d): %s; error: %s\n", tag, f.Rank, f.Local, f.PID, f.Status(), orNone(f.Error))
}

func orNone(s string) string {
	if s == "" {
		return "none reported"
	}
	return s
}
