package cpu

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
)

// fileStore is a test-only store.Store over a directory shared by the rank
// processes of a multi-process test: enough of the interface for the
// engine's rendezvous (Set, Get, CompareAndSet-if-absent).
type fileStore struct{ dir string }

var errFileStore = errors.New("fileStore: not implemented")

func (s fileStore) path(key string) string {
	return filepath.Join(s.dir, hex.EncodeToString([]byte(key)))
}

func (s fileStore) Set(_ context.Context, key string, value []byte) error {
	tmp := s.path(key) + ".tmp" + strconv.Itoa(os.Getpid())
	if err := os.WriteFile(tmp, value, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, s.path(key))
}

func (s fileStore) Get(ctx context.Context, key string) ([]byte, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(s.path(key)); err == nil {
			return b, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: key %q", store.ErrTimeout, key)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (s fileStore) CompareAndSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	if len(expected) != 0 {
		return nil, errFileStore
	}
	f, err := os.OpenFile(s.path(key)+".lock", os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return s.Get(ctx, key)
	}
	f.Close()
	return desired, s.Set(ctx, key, desired)
}

func (fileStore) Add(context.Context, string, int64) (int64, error)   { return 0, errFileStore }
func (fileStore) Delete(context.Context, string) (bool, error)        { return false, errFileStore }
func (fileStore) Check(context.Context, []string) (bool, error)       { return false, errFileStore }
func (fileStore) Wait(context.Context, []string, time.Duration) error { return errFileStore }
func (fileStore) Watch(context.Context, string, bool) (<-chan store.Event, error) {
	return nil, errFileStore
}
func (fileStore) NumKeys(context.Context) (int64, error) { return 0, errFileStore }
func (fileStore) Timeout() time.Duration                 { return 30 * time.Second }
func (fileStore) Close() error                           { return nil }

const envMP = "RANKTREE_CPU_MP" // "mode,rank,size,transport,dir" in a rank process

// rankSpec is what a rank process of a multi-process test reads from its
// environment variable env ("mode,rank,size,transport,dir"): the mode, the
// transport and the engine config of group. It skips the test when env is
// unset (a normal test run).
func rankSpec(t *testing.T, env, group, parent string) (mode, tr string, cfg comm.BackendConfig) {
	t.Helper()
	spec := os.Getenv(env)
	if spec == "" {
		t.Skip("only runs as a rank process of " + parent)
	}
	f := strings.Split(spec, ",")
	mode, tr, dir := f[0], f[3], f[4]
	rank, _ := strconv.Atoi(f[1])
	size, _ := strconv.Atoi(f[2])
	return mode, tr, comm.BackendConfig{Group: group, Rank: rank, Size: size, Store: fileStore{dir}, Device: -1,
		Timeout: 30 * time.Second, Log: zerolog.New(os.Stderr).With().Int("rank", rank).Logger()}
}

// TestMultiProcRank is the body of a rank process; it does nothing in a
// normal test run.
func TestMultiProcRank(t *testing.T) {
	mode, tr, cfg := rankSpec(t, envMP, "mp", "TestMultiProcess")
	rank, size := cfg.Rank, cfg.Size
	if mode == "crash" {
		cfg.Faults = []comm.Fault{{Kind: comm.FaultCrash, Rank: 1, Seq: 2}}
	}
	if mode == "probe" {
		mpProbe(t, cfg)
		return
	}
	e, err := New(context.Background(), cfg, Options{Transport: tr, SingleCopyMin: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	bufs := map[int][]float32{}
	allreduce := func(seq uint64, count int) ([]float32, error) {
		data := bufs[count]
		if data == nil {
			data = make([]float32, count)
			bufs[count] = data
			for i := range data {
				data[i] = float32(rank + 1)
			}
		}
		fp := comm.Fingerprint{Group: comm.GroupHash("mp"), Seq: seq, Op: comm.OpAllReduce, DType: comm.Float32, Count: int64(count), Root: -1, RedOp: comm.RedSum}
		w := launch(e, &comm.Op{FP: fp, Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{comm.HostBuffer(data)}})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return data, w.Wait(ctx)
	}
	if mode == "lat" {
		// Median latency of back-to-back 4-byte allreduces, for
		// BenchmarkMultiProcessAllReduce.
		seq := uint64(0)
		for _, count := range []int{1, 16 << 20} {
			iters := 2000
			if count > 1 {
				iters = 20
			}
			times := make([]time.Duration, 0, iters)
			for i := range iters + 5 {
				t0 := time.Now()
				seq++
				if _, err := allreduce(seq, count); err != nil {
					t.Fatal(err)
				}
				if i >= 5 {
					times = append(times, time.Since(t0))
				}
			}
			slices.Sort(times)
			fmt.Printf("RANK-LAT %d %d\n", count*4, times[len(times)/2].Nanoseconds())
		}
		return
	}
	want := float32(size * (size + 1) / 2)
	counts := []int{1, 1 << 20}
	if mode == "deathflat" {
		counts = []int{1, 1} // both one-step (allreduce_flat.go)
	}
	for seq, count := range counts {
		if mode != "ok" && mode != "bcast" && seq == 1 {
			if (mode == "death" || mode == "deathflat") && rank == 1 {
				os.Exit(7) // die without a word, mid-job
			}
			_, err := allreduce(uint64(seq+1), count)
			var te *comm.TransportError
			if !errors.As(err, &te) || te.Peer != 1 {
				t.Fatalf("rank %d: got %v, want a TransportError naming rank 1", rank, err)
			}
			if e.grp != nil {
				fmt.Printf("RANK-FLAT %d doorbell=%v\n", e.grp.K, e.grp.Doorbell)
			}
			fmt.Println("RANK-RESULT transport-error")
			return
		}
		data, err := allreduce(uint64(seq+1), count)
		if err != nil {
			t.Fatal(err)
		}
		if data[0] != want || data[count-1] != want {
			t.Fatalf("rank %d: got %v, want %v", rank, data[0], want)
		}
	}
	if mode == "bcast" {
		mpBroadcastCMA(t, e, uint64(len(counts)+1))
		return
	}
	if tr == TransportSHM {
		// An allgather through cross-memory attach between the two
		// processes (allgather_cma.go): 400 KiB per rank.
		const c = 100_003
		in := make([]float32, c)
		for i := range in {
			in[i] = float32(1000*rank + i)
		}
		out := make([]float32, size*c)
		fp := comm.Fingerprint{Group: comm.GroupHash("mp"), Seq: uint64(len(counts) + 1), Op: comm.OpAllGather, DType: comm.Float32, Count: c, Root: -1}
		w := launch(e, &comm.Op{FP: fp, Type: comm.OpAllGather, In: []comm.Buffer{comm.HostBuffer(in)}, Out: []comm.Buffer{comm.HostBuffer(out)}})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := w.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		for p := range size {
			for _, i := range []int{0, 1, c / 2, c - 1} {
				if got := out[p*c+i]; got != float32(1000*p+i) {
					t.Fatalf("rank %d: allgather block %d elem %d = %v, want %d", rank, p, i, got, 1000*p+i)
				}
			}
		}
		fmt.Printf("RANK-CMA single-copy=%v\n", e.useCMA(size*c*4))
	}
	fmt.Println("RANK-RESULT ok")
}

// mpProbe is a rank process's part of TestMultiProcess's probe mode: it
// creates mpProbes two-rank groups one after the other, each of which
// runs the probe of tune.go between the two processes, prints each
// group's verdict, and checks a 256 KiB broadcast and allgather on each.
func mpProbe(t *testing.T, cfg comm.BackendConfig) {
	for i := range mpProbes {
		cfg.Group = fmt.Sprintf("mp-probe-%d", i)
		// Small rings for half of the groups: the root's ring broadcasts
		// then wait for ring space.
		opts := Options{Transport: TransportSHM}
		if i%2 == 1 {
			opts.ShmRingBytes = 64 << 10
		}
		e, err := New(context.Background(), cfg, opts)
		if err != nil {
			t.Fatalf("group %d: %v", i, err)
		}
		if !e.probeWanted() {
			t.Fatal("two ranks in two processes do not probe")
		}
		const c = 65_536
		buf := make([]float32, c)
		in := make([]float32, c/2)
		for j := range buf {
			if cfg.Rank == 0 {
				buf[j] = float32(j + i)
			}
			if j < c/2 {
				in[j] = float32(cfg.Rank*c + j)
			}
		}
		out := make([]float32, c)
		g := comm.GroupHash(cfg.Group)
		ops := []*comm.Op{
			{FP: comm.Fingerprint{Group: g, Seq: 1, Op: comm.OpBroadcast, DType: comm.Float32, Count: c}, Type: comm.OpBroadcast,
				In: []comm.Buffer{comm.HostBuffer(buf)}},
			{FP: comm.Fingerprint{Group: g, Seq: 2, Op: comm.OpAllGather, DType: comm.Float32, Count: c / 2, Root: -1}, Type: comm.OpAllGather,
				In: []comm.Buffer{comm.HostBuffer(in)}, Out: []comm.Buffer{comm.HostBuffer(out)}},
		}
		for _, op := range ops {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			err := launch(e, op).Wait(ctx)
			cancel()
			if err != nil {
				t.Fatalf("group %d, %v: %v", i, op.Type, err)
			}
		}
		for j := range c {
			want := j // rank 0's block, then rank 1's: c + its index
			if j >= c/2 {
				want = c + j - c/2
			}
			if buf[j] != float32(j+i) || out[j] != float32(want) {
				t.Fatalf("group %d: broadcast elem %d = %v, allgather %v; want %d and %d", i, j, buf[j], out[j], j+i, want)
			}
		}
		fmt.Printf("RANK-PROBE %d single-copy=%v off=%v\n", i, e.useBroadcastCMA(c*4), e.cmaOff)
		e.Close()
	}
	fmt.Println("RANK-RESULT ok")
}

// mpProbes is how many groups mpProbe creates, each probing once.
const mpProbes = 12

// mpBroadcastCMA is a rank process's part of TestMultiProcess's bcast
// mode: a 256 KiB broadcast from rank 1 among three processes, through
// cross-memory attach (broadcast_cma.go), checked on every rank.
func mpBroadcastCMA(t *testing.T, e *Engine, seq uint64) {
	const c = 65_537
	buf := make([]float32, c)
	if e.cfg.Rank == 1 {
		for i := range buf {
			buf[i] = float32(3*i + 1)
		}
	}
	fp := comm.Fingerprint{Group: comm.GroupHash("mp"), Seq: seq, Op: comm.OpBroadcast, DType: comm.Float32, Count: c, Root: 1}
	w := launch(e, &comm.Op{FP: fp, Type: comm.OpBroadcast, Root: 1, In: []comm.Buffer{comm.HostBuffer(buf)}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := w.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for i, v := range buf {
		if v != float32(3*i+1) {
			t.Fatalf("rank %d: broadcast elem %d = %v, want %d", e.cfg.Rank, i, v, 3*i+1)
		}
	}
	fmt.Printf("RANK-CMA single-copy=%v\n", e.useBroadcastCMA(c*4))
	fmt.Println("RANK-RESULT ok")
}

// checkProbeVerdicts checks that both rank processes of the probe mode
// printed the same verdict for each of their groups.
func checkProbeVerdicts(t *testing.T, outs []*strings.Builder) {
	t.Helper()
	verdicts := func(r int) []string {
		var v []string
		for _, l := range strings.Split(outs[r].String(), "\n") {
			if strings.HasPrefix(l, "RANK-PROBE ") {
				v = append(v, l)
			}
		}
		return v
	}
	v0, v1 := verdicts(0), verdicts(1)
	if len(v0) != mpProbes || !slices.Equal(v0, v1) {
		t.Fatalf("the ranks' probe verdicts differ or are missing:\n%s\n--\n%s", outs[0], outs[1])
	}
	t.Logf("verdicts: %v", v0)
}

// TestMultiProcess runs ranks as real processes (the test binary re-executed,
// as Gloo's test/multiproc_test.h): allreduce over shm and tcp across
// processes, an allgather by cross-memory attach between two of them and
// a broadcast by it among three (bcast) over shm; a rank that dies mid-job, and one that hits an injected crash
// fault (exit code 3), give the survivor a *comm.TransportError; so does
// one that dies while its peer waits in a one-step shared-memory op
// (deathflat).
func TestMultiProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	for _, c := range []struct{ mode, tr string }{{"ok", TransportSHM}, {"ok", TransportTCP}, {"death", TransportSHM},
		{"deathflat", TransportSHM}, {"crash", TransportTCP}, {"bcast", TransportSHM}, {"probe", TransportSHM}} {
		t.Run(c.mode+"/"+c.tr, func(t *testing.T) {
			size := 2
			if c.mode == "bcast" {
				size = 3
			}
			dir := t.TempDir()
			cmds := make([]*exec.Cmd, size)
			outs := make([]*strings.Builder, size)
			for r := range size {
				cmd := exec.Command(os.Args[0], "-test.run=^TestMultiProcRank$", "-test.count=1")
				cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d,%d,%s,%s", envMP, c.mode, r, size, c.tr, dir))
				outs[r] = &strings.Builder{}
				cmd.Stdout, cmd.Stderr = outs[r], outs[r]
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				cmds[r] = cmd
			}
			for r, cmd := range cmds {
				err := cmd.Wait()
				code := cmd.ProcessState.ExitCode()
				wantCode := 0
				if r == 1 && (c.mode == "death" || c.mode == "deathflat") {
					wantCode = 7
				}
				if r == 1 && c.mode == "crash" {
					wantCode = 3
				}
				if code != wantCode {
					t.Fatalf("rank %d exited %d (%v), want %d; output:\n%s", r, code, err, wantCode, outs[r])
				}
			}
			want := "RANK-RESULT ok"
			if c.mode != "ok" && c.mode != "bcast" && c.mode != "probe" {
				want = "RANK-RESULT transport-error"
			}
			if c.mode == "probe" {
				checkProbeVerdicts(t, outs)
			}
			if !strings.Contains(outs[0].String(), want) {
				t.Fatalf("rank 0 output lacks %q:\n%s", want, outs[0])
			}
			if c.mode == "ok" && c.tr == TransportSHM || c.mode == "bcast" {
				for r := range size {
					// The allgather or the broadcast went through
					// cross-memory attach, which still serves the
					// group: no rank's reads failed.
					if !strings.Contains(outs[r].String(), "RANK-CMA single-copy=true") {
						t.Fatalf("rank %d did not %s through cross-memory attach:\n%s", r, c.mode, outs[r])
					}
				}
			}
			if c.mode == "deathflat" && !strings.Contains(outs[0].String(), "RANK-FLAT 2 doorbell=true") {
				// Rank 0 published the one-step op at seq 2 and slept on
				// its doorbell when its peer died.
				t.Fatalf("rank 0 did not wait in a one-step op on its bell:\n%s", outs[0])
			}
			if c.mode == "crash" && !strings.Contains(outs[1].String(), "injected fault: crash") {
				t.Fatalf("crash not printed:\n%s", outs[1])
			}
		})
	}
}

// BenchmarkMultiProcessAllReduce runs 2 ranks as real processes and reports
// the median time of a 4-byte and a 64 MiB float32 Sum allreduce, straight
// on the engine (no ProcessGroup or actor), over shm and tcp.
func BenchmarkMultiProcessAllReduce(b *testing.B) {
	for _, tr := range []string{TransportSHM, TransportTCP} {
		b.Run(tr, func(b *testing.B) {
			for b.Loop() {
				dir := b.TempDir()
				var outs [2]strings.Builder
				var cmds [2]*exec.Cmd
				for r := range 2 {
					cmd := exec.Command(os.Args[0], "-test.run=^TestMultiProcRank$", "-test.count=1")
					cmd.Env = append(os.Environ(), fmt.Sprintf("%s=lat,%d,2,%s,%s", envMP, r, tr, dir))
					cmd.Stdout, cmd.Stderr = &outs[r], &outs[r]
					if err := cmd.Start(); err != nil {
						b.Fatal(err)
					}
					cmds[r] = cmd
				}
				for r, cmd := range cmds {
					if err := cmd.Wait(); err != nil {
						b.Fatalf("rank %d: %v\n%s", r, err, outs[r].String())
					}
				}
				for _, line := range strings.Split(outs[0].String(), "\n") {
					var bytes, ns int64
					if _, err := fmt.Sscanf(line, "RANK-LAT %d %d", &bytes, &ns); err == nil {
						if bytes == 4 {
							b.ReportMetric(float64(ns)/1e3, "median_us_4B")
						} else {
							b.ReportMetric(float64(bytes)/float64(ns), "algbw_GBps_64MiB")
						}
					}
				}
			}
		})
	}
}
