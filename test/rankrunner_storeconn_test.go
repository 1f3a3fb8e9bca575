package test

import (
	"strings"
	"testing"
	"time"
)

// TestRankrunnerUnreachableStoreFailsFast: `rankrunner --nproc-per-node 2
// --nats nats://127.0.0.1:1 PROG` logs the refused connection at once and
// fails within seconds (not after the 60s store timeout) with an error that
// names the URL, the refusal and how to wait instead; no rank starts.
func TestRankrunnerUnreachableStoreFailsFast(t *testing.T) {
	t.Parallel()
	_, prog := rrBuild(t)
	start := time.Now()
	p := rrStartRunner(t, "--nproc-per-node", "2", "--nats", "nats://127.0.0.1:1", prog, "ok")
	code := p.wait(t, 30*time.Second)
	took := time.Since(start)
	if code == 0 {
		t.Fatalf("exit code 0 with an unreachable store")
	}
	if took > 15*time.Second {
		t.Errorf("failed after %v, want a few seconds", took)
	}
	out := p.stderr.String()
	for _, want := range []string{"store not reachable, retrying for up to", "nats://127.0.0.1:1", "refused", "--store-wait"} {
		if !strings.Contains(out, want) {
			t.Errorf("stderr lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "[rank ") || strings.Contains(p.stdout.String(), "[rank ") {
		t.Errorf("a rank started although the store was unreachable")
	}
}

// TestRankrunnerStoreWaitRetries: with --store-wait the runner keeps
// retrying a refusing URL for the whole --store-timeout, warning
// periodically, then fails naming the URL.
func TestRankrunnerStoreWaitRetries(t *testing.T) {
	t.Parallel()
	_, prog := rrBuild(t)
	start := time.Now()
	p := rrStartRunner(t, "--nproc-per-node", "1", "--store-wait", "--store-timeout", "5s", "--nats", "nats://127.0.0.1:1", prog, "ok")
	if code := p.wait(t, 60*time.Second); code == 0 {
		t.Fatalf("exit code 0 with an unreachable store")
	}
	if took := time.Since(start); took < 4*time.Second {
		t.Errorf("gave up after %v despite --store-wait --store-timeout 5s", took)
	}
	if out := p.stderr.String(); !strings.Contains(out, "nats://127.0.0.1:1") || !strings.Contains(out, "unreachable for") {
		t.Errorf("stderr does not name the URL and the timeout:\n%s", out)
	}
}
