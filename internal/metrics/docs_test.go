package metrics

import (
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/reducer"
)

// TestDocsAndDashboardNameRealSeries: every series a rank registers is in
// docs/metrics.md, and every ranktree_* name the Grafana dashboard queries
// is documented there (runner series are registered by rankrunner).
func TestDocsAndDashboardNameRealSeries(t *testing.T) {
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	dash, err := os.ReadFile("../../docs/grafana/ranktree-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	m := NewRank("j", 0)
	m.WorkScheduled("g", comm.OpAllReduce)
	m.WorkDone("g", comm.Fingerprint{Op: comm.OpAllReduce, DType: comm.Float32, Count: 1}, time.Microsecond, nil)
	for _, n := range []string{"timeout", "write_abort"} {
		m.Observe(&actors.Event{Kind: actors.KindWatchdog, Group: "g", Action: n})
	}
	m.Observe(&actors.Event{Kind: actors.KindCommAbort, Group: "g", Error: remoteAbortPrefix + " 1: x"})
	m.Observe(&actors.Event{Kind: actors.KindRestart, Group: "g", Action: "restart"})
	m.WorkScheduled("g", comm.OpAllReduce)
	m.WorkDone("g", comm.Fingerprint{Op: comm.OpAllReduce}, 0, errors.New("x"))
	m.FlushWorks()
	if err := m.AddReducer(func() reducer.Stats { return reducer.Stats{} }); err != nil {
		t.Fatal(err)
	}
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if n := f.GetName(); strings.HasPrefix(n, "ranktree_") && !strings.Contains(string(doc), "`"+n+"`") {
			t.Errorf("series %s is not documented in docs/metrics.md", n)
		}
	}
	for _, n := range regexp.MustCompile(`ranktree_[a-z_]+`).FindAllString(string(dash), -1) {
		n = strings.TrimSuffix(n, "_bucket")
		if !strings.Contains(string(doc), "`"+n+"`") {
			t.Errorf("the dashboard queries %s, which docs/metrics.md does not list", n)
		}
	}
}
