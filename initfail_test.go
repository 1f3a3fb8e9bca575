package ranktree

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/store"
)

// TestInitFailsWhenARankDies: rank 0 of 3 waits in the init barrier; the
// launcher records rank 2 dead (before Init starts, or while it waits).
// Init fails at once, not at its one-minute timeout, with an *InitError
// naming rank 2 that wraps ErrRankDead, and writes it to
// $RANKTREE_ERROR_FILE.
func TestInitFailsWhenARankDies(t *testing.T) {
	for _, early := range []bool{true, false} {
		name := "while waiting"
		if early {
			name = "before Init"
		}
		t.Run(name, func(t *testing.T) {
			errFile := filepath.Join(t.TempDir(), "err.txt")
			setEnv(t, map[string]string{EnvErrorFile: errFile})
			ms := store.NewMemStore()
			ctx := context.Background()
			dead, _ := json.Marshal(DeadRank{Rank: 2, ExitCode: 137, Status: "signal: killed (SIGKILL)"})
			if early {
				if err := ms.Set(ctx, "restart/0/"+DeadRankKey(2), dead); err != nil {
					t.Fatal(err)
				}
			} else {
				go func() {
					// Once rank 0 is in the barrier, rank 2 dies.
					if err := ms.Wait(ctx, []string{"restart/0/" + InitBarrierKey + "/arrived/0"}, 30*time.Second); err == nil {
						_ = ms.Set(ctx, "restart/0/"+DeadRankKey(2), dead)
					}
				}()
			}
			start := time.Now()
			_, err := Init(ctx, quiet(), WithStore(ms), WithRank(0), WithWorldSize(3), WithLocalRank(0),
				WithLocalWorldSize(1), WithNodeRank(0), WithTimeout(time.Minute))
			el := time.Since(start)
			var ie *InitError
			if !errors.As(err, &ie) || !errors.Is(err, ErrRankDead) || len(ie.Dead) != 1 || ie.Dead[0].Rank != 2 || ie.Stage != "init barrier" {
				t.Fatalf("Init with rank 2 dead: %v", err)
			}
			if want := "rank 2 (signal: killed (SIGKILL)) died"; !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q does not say %q", err, want)
			}
			if el > 5*time.Second {
				t.Fatalf("Init failed %v after the death, want < 5s", el)
			}
			t.Logf("Init failed %v after starting: %v", el, err)
			b, ferr := os.ReadFile(errFile)
			if ferr != nil || strings.TrimSpace(string(b)) != err.Error() {
				t.Fatalf("error file: %q, %v; want %q", b, ferr, err)
			}
		})
	}
}
