package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/store"
)

func TestCPUPlan(t *testing.T) {
	cases := []struct {
		mode    string
		allowed []int
		n       int
		want    string // fmt of the plan; "" for none
	}{
		{CPUBindCore, []int{0, 1}, 2, "[[0] [1]]"},
		{CPUBindCore, []int{0, 1, 2, 3}, 2, "[[0 1] [2 3]]"},
		{CPUBindCore, []int{0, 1, 2, 3, 4}, 3, "[[0 1] [2 3] [4]]"},
		{CPUBindCore, []int{2, 5, 7}, 1, "[[2 5 7]]"},
		{CPUBindCore, []int{0, 1}, 3, ""}, // oversubscribed: as mpirun, no binding
		{CPUBindNone, []int{0, 1}, 2, ""},
		{CPUBindCore, nil, 2, ""},
	}
	for _, c := range cases {
		plan, why := cpuPlan(c.mode, c.allowed, c.n)
		got := ""
		if plan != nil {
			got = fmt.Sprint(plan)
		}
		if got != c.want {
			t.Errorf("cpuPlan(%s, %v, %d) = %s (%s), want %s", c.mode, c.allowed, c.n, got, why, c.want)
		}
		if plan == nil && why == "" {
			t.Errorf("cpuPlan(%s, %v, %d) binds nothing without saying why", c.mode, c.allowed, c.n)
		}
	}
}

func TestCPUBindFlag(t *testing.T) {
	c := Config{Program: "/bin/true"}
	if err := c.validate(); err != nil || c.CPUBind != CPUBindCore {
		t.Fatalf("default --cpu-bind = %q (%v), want %q", c.CPUBind, err, CPUBindCore)
	}
	c = Config{Program: "/bin/true", CPUBind: "socket"}
	err := c.validate()
	var fe *FlagError
	if !errors.As(err, &fe) || fe.Flag != "--cpu-bind" || !strings.Contains(err.Error(), `"socket"`) {
		t.Fatalf("--cpu-bind socket: %v, want a FlagError naming the flag and the value", err)
	}
}

// TestRunnerBindsRanks runs two /bin/sh ranks under a runner, binding on
// (the default) and then off, and reads each rank's own affinity from
// /proc/self/status. The unbound run comes second: its ranks inherit the
// spawner thread's affinity, so it also checks that binding a rank gave
// that thread its own affinity back.
func TestRunnerBindsRanks(t *testing.T) {
	allowed, err := allowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	if len(allowed) < 2 {
		t.Skipf("needs 2 CPUs, the test may use %v", allowed)
	}
	all := cpuList(allowed)
	for _, mode := range []string{"", CPUBindNone} {
		var out lockedBuffer
		r, err := newRunner(Config{
			Program: "/bin/sh", Args: []string{"-c", `echo "affinity $(grep Cpus_allowed_list /proc/self/status | cut -f2)"`},
			NProcPerNode: 2, JobID: "j", NATSURL: "nats://unused:1", CPUBind: mode,
			Stdout: &out, Stderr: &out, Env: os.Environ(),
		})
		if err != nil {
			t.Fatal(err)
		}
		r.st, r.path, r.url = store.NewMemStore(), "/bin/sh", "nats://unused:1"
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		code, err := r.loop(ctx, make(chan os.Signal))
		cancel()
		if err != nil || code != 0 {
			t.Fatalf("%q: exit %d, %v\n%s", mode, code, err, out.String())
		}
		plan, _ := cpuPlan(CPUBindCore, allowed, 2)
		for rank := range 2 {
			want := all
			if mode == "" {
				want = cpuList(plan[rank])
			}
			if line := fmt.Sprintf("[rank %d] affinity %s\n", rank, want); !strings.Contains(out.String(), line) {
				t.Errorf("--cpu-bind %q: output lacks %q:\n%s", mode, line, out.String())
			}
		}
	}
}

// cpuList is the kernel's Cpus_allowed_list spelling of ascending cpus
// ("0-3", "0,2").
func cpuList(cpus []int) string {
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, fmt.Sprint(cpus[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", cpus[i], cpus[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
