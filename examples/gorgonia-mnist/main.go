// Command gorgonia-mnist trains the 784-256-128-10 MLP on MNIST with
// Gorgonia (gorgonia.org/gorgonia v0.9.18), data-parallel over ranktree
// through adapters/gorgonia. From the repository root:
//
//	go run ./cmd/rankrunner --nproc-per-node 2 ./examples/gorgonia-mnist
//	go run ./examples/gorgonia-mnist          # one process, no rankrunner
//
// The program is an ordinary single-process Gorgonia training loop; the
// lines marked "ranktree:" are all it takes to make it data-parallel
// (five lines: Init, Close, Wrap, the solver wrapper, and the sampler
// giving each rank its shard).
//
// The global batch (--batch-size) is split evenly across ranks and each
// rank's loss is the mean over its part, so n ranks compute the same
// update as one rank on the whole batch. Rank 0 draws a progress bar per
// epoch on stderr and prints the test accuracy and samples/s on stdout.
//
// Flags:
//
//	--epochs N        passes over the training set (default 3)
//	--batch-size N    global batch, a multiple of the world size (default 128)
//	--lr F            learning rate of Gorgonia's Momentum solver (default 0.02)
//	--momentum F      momentum (default 0.9)
//	--seed N          shuffle seed (default 1); weights come from rank 0
//	--train-limit N   train on the first N samples only (0: all 60,000)
//	--threads N       GOMAXPROCS of each rank (default: CPUs / ranks on this node)
//	--data-dir DIR    folder with the four MNIST .gz files (default: module cache)
//	--json-out FILE   write the metrics as JSON ("{rank}" in FILE: every rank)
//
// Exit status: 0 on success, 1 on error, 2 for bad flags.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	rtgorgonia "github.com/ranktree/ranktree/adapters/gorgonia"
	"github.com/ranktree/ranktree/ddp"
)

type options struct {
	epochs, batch, trainLimit, threads int
	lr, momentum                       float64
	seed                               uint64
	dataDir, jsonOut                   string
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("gorgonia-mnist", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.epochs, "epochs", 3, "passes over the training set")
	fs.IntVar(&o.batch, "batch-size", 128, "global batch size (a multiple of the world size)")
	fs.Float64Var(&o.lr, "lr", 0.02, "learning rate")
	fs.Float64Var(&o.momentum, "momentum", 0.9, "momentum")
	fs.Uint64Var(&o.seed, "seed", 1, "shuffle seed")
	fs.IntVar(&o.trainLimit, "train-limit", 0, "train on the first N samples (0: all)")
	fs.IntVar(&o.threads, "threads", 0, "GOMAXPROCS per rank (0: CPUs / local ranks)")
	fs.StringVar(&o.dataDir, "data-dir", "", "folder with the MNIST .gz files (default: module cache)")
	fs.StringVar(&o.jsonOut, "json-out", "", `write metrics as JSON ("{rank}": every rank)`)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case o.epochs < 1:
		return o, fmt.Errorf("gorgonia-mnist: --epochs %d, want ≥ 1", o.epochs)
	case o.batch < 1:
		return o, fmt.Errorf("gorgonia-mnist: --batch-size %d, want ≥ 1", o.batch)
	case o.lr <= 0:
		return o, fmt.Errorf("gorgonia-mnist: --lr %v, want > 0", o.lr)
	case o.threads < 0 || o.trainLimit < 0:
		return o, errors.New("gorgonia-mnist: --threads and --train-limit must be ≥ 0")
	}
	return o, nil
}

// report is the --json-out document.
type report struct {
	Rank          int     `json:"rank"`
	WorldSize     int     `json:"world_size"`
	GlobalBatch   int     `json:"global_batch"`
	Epochs        int     `json:"epochs"`
	Steps         int     `json:"steps"`
	Threads       int     `json:"threads"`
	TrainSamples  int     `json:"train_samples"`
	Accuracy      float64 `json:"accuracy"`
	SamplesPerSec float64 `json:"samples_per_sec"` // global samples per second of training
	TrainSeconds  float64 `json:"train_seconds"`
	SyncSeconds   float64 `json:"sync_seconds"`  // inside ddp Sync (copies + allreduce)
	CommSeconds   float64 `json:"comm_seconds"`  // waiting on the allreduces
	CommFraction  float64 `json:"comm_fraction"` // sync_seconds / train_seconds
	FinalLoss     float64 `json:"final_loss"`
	ParamHash     string  `json:"param_hash"`
}

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	o, err := parseFlags(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := train(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "gorgonia-mnist:", err)
		return 1
	}
	return 0
}

// mlp is the 784-256-128-10 network for one batch size.
type mlp struct {
	g          *G.ExprGraph
	x, y       *G.Node
	learnables G.Nodes
	loss       G.Value
	vm         G.VM
}

func newMLP(batch int) (*mlp, error) {
	m := &mlp{g: G.NewGraph()}
	m.x = G.NewMatrix(m.g, tensor.Float32, G.WithShape(batch, pixels), G.WithName("x"))
	m.y = G.NewMatrix(m.g, tensor.Float32, G.WithShape(batch, classes), G.WithName("y"))
	sizes := []int{pixels, 256, 128, classes}
	h := m.x
	for l := 0; l < 3; l++ {
		w := G.NewMatrix(m.g, tensor.Float32, G.WithShape(sizes[l], sizes[l+1]),
			G.WithName(fmt.Sprintf("fc%d.weight", l+1)), G.WithInit(G.GlorotU(1)))
		b := G.NewVector(m.g, tensor.Float32, G.WithShape(sizes[l+1]),
			G.WithName(fmt.Sprintf("fc%d.bias", l+1)), G.WithInit(G.Zeroes()))
		m.learnables = append(m.learnables, w, b)
		z, err := G.Mul(h, w)
		if err != nil {
			return nil, err
		}
		if h, err = G.BroadcastAdd(z, b, nil, []byte{0}); err != nil {
			return nil, err
		}
		if l < 2 {
			if h, err = G.Rectify(h); err != nil {
				return nil, err
			}
		}
	}
	logp, err := G.LogSoftMax(h)
	if err != nil {
		return nil, err
	}
	nll, err := G.HadamardProd(logp, m.y)
	if err != nil {
		return nil, err
	}
	sum, err := G.Sum(nll, 1)
	if err != nil {
		return nil, err
	}
	mean, err := G.Mean(sum)
	if err != nil {
		return nil, err
	}
	cost, err := G.Neg(mean)
	if err != nil {
		return nil, err
	}
	G.Read(cost, &m.loss)
	if _, err := G.Grad(cost, m.learnables...); err != nil {
		return nil, err
	}
	m.vm = G.NewTapeMachine(m.g, G.BindDualValues(m.learnables...))
	return m, nil
}

func train(ctx context.Context, o options) error {
	rt, err := ddp.Init(ctx) // ranktree: join the job (or run as one process)
	if err != nil {
		return err
	}
	defer rt.Close(context.WithoutCancel(ctx)) // ranktree: leave it

	rank, size := rt.Rank(), rt.WorldSize()
	threads := o.threads
	if threads == 0 {
		threads = max(1, runtime.NumCPU()/max(1, rt.LocalWorldSize()))
	}
	runtime.GOMAXPROCS(threads)
	if o.batch%size != 0 {
		return fmt.Errorf("--batch-size %d is not a multiple of the world size %d", o.batch, size)
	}
	local := o.batch / size
	trainSet, testSet, err := loadMNIST(o.dataDir)
	if err != nil {
		return err
	}
	trainSet = trainSet.head(o.trainLimit)

	m, err := newMLP(local)
	if err != nil {
		return err
	}
	defer m.vm.Close()
	solver := G.Solver(G.NewMomentum(G.WithLearnRate(o.lr), G.WithMomentum(o.momentum)))

	dp, err := rtgorgonia.Wrap(ctx, rt.World(), m.learnables, ddp.Config{}) // ranktree: rank 0's weights everywhere
	if err != nil {
		return err
	}
	solver = dp.Solver(solver) // ranktree: Step averages gradients across ranks first

	sampler, err := ddp.NewDistributedSampler(ddp.SamplerConfig{Len: trainSet.len(), Rank: rank, Size: size, Shuffle: true, Seed: o.seed, DropLast: true}) // ranktree: this rank's shard
	if err != nil {
		return err
	}

	start := time.Now()
	steps, lastLoss, err := trainEpochs(ctx, o, m, solver, sampler, trainSet, rank, local)
	if err != nil {
		return err
	}
	trainSecs := time.Since(start).Seconds()
	st := dp.Model().Stats()
	acc, err := evaluate(m.learnables, testSet)
	if err != nil {
		return err
	}
	rep := report{
		Rank: rank, WorldSize: size, GlobalBatch: o.batch, Epochs: o.epochs, Steps: steps, Threads: threads,
		TrainSamples: trainSet.len(), Accuracy: acc, TrainSeconds: trainSecs,
		SamplesPerSec: float64(steps*o.batch) / trainSecs,
		SyncSeconds:   st.SyncTime.Seconds(), CommSeconds: st.CommTime.Seconds(),
		CommFraction: st.SyncTime.Seconds() / trainSecs, FinalLoss: lastLoss, ParamHash: paramHash(m.learnables),
	}
	if rank == 0 {
		fmt.Printf("test accuracy %.2f%% | %d ranks × %d threads, global batch %d, %d steps | %.0f samples/s | sync %.1f%% of training | train %.1fs | params fnv64a %s\n",
			100*acc, size, threads, o.batch, steps, rep.SamplesPerSec, 100*rep.CommFraction, trainSecs, rep.ParamHash)
	}
	if path := o.jsonOut; path != "" && (rank == 0 || strings.Contains(path, "{rank}")) {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(strings.ReplaceAll(path, "{rank}", strconv.Itoa(rank)), append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// trainEpochs runs o.epochs epochs over this rank's shard of trainSet
// (local samples per step) and returns the steps taken and the last loss.
func trainEpochs(ctx context.Context, o options, m *mlp, solver G.Solver, sampler *ddp.DistributedSampler,
	trainSet *dataset, rank, local int) (steps int, lastLoss float64, err error) {
	xb := make([]float32, local*pixels)
	yb := make([]float32, local*classes)
	for epoch := 0; epoch < o.epochs; epoch++ {
		idx := sampler.EpochIndices(epoch) // this rank's shard (one process: a permutation of all samples)
		nb := len(idx) / local
		bar := epochBar(rank, nb*o.batch, epoch, o.epochs)
		epochStart := time.Now()
		for b := 0; b < nb; b++ {
			if err := ctx.Err(); err != nil {
				return steps, lastLoss, err
			}
			clear(yb)
			for i, s := range idx[b*local : (b+1)*local] {
				copy(xb[i*pixels:(i+1)*pixels], trainSet.x[s*pixels:(s+1)*pixels])
				yb[i*classes+int(trainSet.y[s])] = 1
			}
			if err := G.Let(m.x, tensor.New(tensor.WithShape(local, pixels), tensor.WithBacking(xb))); err != nil {
				return steps, lastLoss, err
			}
			if err := G.Let(m.y, tensor.New(tensor.WithShape(local, classes), tensor.WithBacking(yb))); err != nil {
				return steps, lastLoss, err
			}
			if err := m.vm.RunAll(); err != nil {
				return steps, lastLoss, err
			}
			if err := solver.Step(G.NodesToValueGrads(m.learnables)); err != nil {
				return steps, lastLoss, err
			}
			lastLoss = float64(m.loss.Data().(float32))
			m.vm.Reset()
			steps++
			if bar != nil {
				rate := float64((b+1)*o.batch) / time.Since(epochStart).Seconds()
				bar.Describe(fmt.Sprintf("epoch %d/%d loss %.4f %6.0f samples/s", epoch+1, o.epochs, lastLoss, rate))
				_ = bar.Add(o.batch)
			}
		}
		if bar != nil {
			_ = bar.Finish()
		}
	}
	return steps, lastLoss, nil
}

// epochBar is rank 0's progress bar over n samples of one epoch (nil on
// other ranks).
func epochBar(rank, n, epoch, epochs int) *progressbar.ProgressBar {
	if rank != 0 {
		return nil
	}
	return progressbar.NewOptions(n, progressbar.OptionSetWriter(os.Stderr),
		progressbar.OptionSetDescription(fmt.Sprintf("epoch %d/%d", epoch+1, epochs)),
		progressbar.OptionShowCount(), progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(200*time.Millisecond), progressbar.OptionShowElapsedTimeOnFinish(),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(os.Stderr) }))
}

// evaluate computes the test accuracy with the learnables' current values
// (a forward pass with tensor.MatMul, 1000 images at a time).
func evaluate(ls G.Nodes, test *dataset) (float64, error) {
	correct := 0
	const chunk = 1000
	for lo := 0; lo < test.len(); lo += chunk {
		n := min(chunk, test.len()-lo)
		h := tensor.New(tensor.WithShape(n, pixels), tensor.WithBacking(append([]float32(nil), test.x[lo*pixels:(lo+n)*pixels]...)))
		for l := 0; l < 3; l++ {
			w := ls[2*l].Value().(*tensor.Dense)
			bias := ls[2*l+1].Value().Data().([]float32)
			out, err := tensor.MatMul(h, w)
			if err != nil {
				return 0, err
			}
			d := out.Data().([]float32)
			k := len(bias)
			for i := range d {
				d[i] += bias[i%k]
				if l < 2 && d[i] < 0 {
					d[i] = 0
				}
			}
			h = out.(*tensor.Dense)
		}
		d := h.Data().([]float32)
		for i := 0; i < n; i++ {
			row := d[i*classes : (i+1)*classes]
			best := 0
			for c := range row {
				if row[c] > row[best] {
					best = c
				}
			}
			if best == int(test.y[lo+i]) {
				correct++
			}
		}
	}
	return float64(correct) / float64(test.len()), nil
}

// paramHash is an FNV-64a hash of every learnable's float32 bits, so ranks
// can be compared.
func paramHash(ls G.Nodes) string {
	h := fnv.New64a()
	var b [4]byte
	for _, n := range ls {
		for _, v := range n.Value().Data().([]float32) {
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
			h.Write(b[:])
		}
	}
	return fmt.Sprintf("%016x", h.Sum64())
}
