package ranktree

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/ranktree/ranktree/internal/metrics"
)

// TestInitMetricsAddrBusy: a RANKTREE_METRICS_ADDR that cannot be bound
// fails Init at once, before connecting anything, with a
// *MetricsBindError naming the address.
func TestInitMetricsAddrBusy(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	env := goodEnv() // its store URL refuses: reaching it would take seconds
	env[EnvMetricsAddr] = l.Addr().String()
	setEnv(t, env)
	_, err = Init(context.Background(), quiet())
	var be *MetricsBindError
	if !errors.As(err, &be) || be.Addr != l.Addr().String() || !strings.Contains(err.Error(), metrics.EnvAddr) {
		t.Fatalf("Init: %v, want a *metrics.BindError naming %s and %s", err, metrics.EnvAddr, l.Addr())
	}
}
