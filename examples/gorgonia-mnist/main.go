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
	"fmt"
	"os"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	rtgorgonia "github.com/ranktree/ranktree/adapters/gorgonia"
	"github.com/ranktree/ranktree/ddp"
	"github.com/ranktree/ranktree/examples/internal/mnistdata"
	"github.com/ranktree/ranktree/examples/internal/mnistjob"
)

// The MNIST image size (28×28 pixels) and the number of classes.
const (
	pixels  = mnistdata.Pixels
	classes = mnistdata.NumClasses
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs, o := mnistjob.NewFlagSet("gorgonia-mnist", 0.02, "learning rate", "GOMAXPROCS per rank (0: CPUs / local ranks)")
	momentum := fs.Float64("momentum", 0.9, "momentum")
	return mnistjob.Main(fs, o, args, func(ctx context.Context) error { return train(ctx, o, *momentum) })
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

func train(ctx context.Context, o *mnistjob.Options, momentum float64) error {
	rt, err := ddp.Init(ctx) // ranktree: join the job (or run as one process)
	if err != nil {
		return err
	}
	defer rt.Close(context.WithoutCancel(ctx)) // ranktree: leave it

	job, err := o.Setup(rt.Rank(), rt.WorldSize(), rt.LocalWorldSize())
	if err != nil {
		return err
	}
	local := job.LocalBatch
	m, err := newMLP(local)
	if err != nil {
		return err
	}
	defer m.vm.Close()
	solver := G.Solver(G.NewMomentum(G.WithLearnRate(o.LR), G.WithMomentum(momentum)))

	dp, err := rtgorgonia.Wrap(ctx, rt.World(), m.learnables, ddp.Config{}) // ranktree: rank 0's weights everywhere
	if err != nil {
		return err
	}
	solver = dp.Solver(solver) // ranktree: Step averages gradients across ranks first

	sampler, err := ddp.NewDistributedSampler(ddp.SamplerConfig{Len: job.Train.Len(), Rank: rt.Rank(), Size: rt.WorldSize(), Shuffle: true, Seed: o.Seed, DropLast: true}) // ranktree: this rank's shard
	if err != nil {
		return err
	}

	xb := make([]float32, local*pixels)
	yb := make([]float32, local*classes)
	labels := make([]uint8, local)
	steps, lastLoss := 0, 0.0
	start := time.Now()
	for epoch := 0; epoch < o.Epochs; epoch++ {
		idx := sampler.EpochIndices(epoch) // this rank's shard (one process: a permutation of all samples)
		nb := len(idx) / local
		bar := job.NewBar(o, epoch, nb)
		for b := 0; b < nb; b++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			clear(yb)
			_, labels = job.Train.Gather(idx[b*local:(b+1)*local], xb, labels)
			for i, l := range labels {
				yb[i*classes+int(l)] = 1
			}
			if lastLoss, err = m.step(solver, xb, yb, local); err != nil {
				return err
			}
			steps++
			bar.Step(lastLoss)
		}
		bar.Finish()
	}
	trainSecs := time.Since(start).Seconds()
	st := dp.Model().Stats()
	acc, err := evaluate(m.learnables, job.Test)
	if err != nil {
		return err
	}
	rep := job.NewReport(o, steps, trainSecs)
	rep.Accuracy, rep.FinalLoss = acc, lastLoss
	rep.SyncSeconds, rep.CommSeconds = st.SyncTime.Seconds(), st.CommTime.Seconds()
	rep.CommFraction = st.SyncTime.Seconds() / trainSecs
	h := mnistjob.NewParamHash()
	for _, n := range m.learnables {
		h.Add(n.Value().Data().([]float32))
	}
	rep.ParamHash = h.String()
	return rep.Emit(o)
}

// step runs one training step on a batch of local images xb with one-hot
// labels yb: forward and backward, then solver's update; it returns the
// batch loss.
func (m *mlp) step(solver G.Solver, xb, yb []float32, local int) (float64, error) {
	defer m.vm.Reset()
	if err := G.Let(m.x, tensor.New(tensor.WithShape(local, pixels), tensor.WithBacking(xb))); err != nil {
		return 0, err
	}
	if err := G.Let(m.y, tensor.New(tensor.WithShape(local, classes), tensor.WithBacking(yb))); err != nil {
		return 0, err
	}
	if err := m.vm.RunAll(); err != nil {
		return 0, err
	}
	if err := solver.Step(G.NodesToValueGrads(m.learnables)); err != nil {
		return 0, err
	}
	return float64(m.loss.Data().(float32)), nil
}

// evaluate computes the test accuracy with the learnables' current values
// (a forward pass with tensor.MatMul, 1000 images at a time).
func evaluate(ls G.Nodes, test *mnistdata.Set) (float64, error) {
	correct := 0
	const chunk = 1000
	idx := make([]int, chunk)
	labels := make([]uint8, chunk)
	for lo := 0; lo < test.Len(); lo += chunk {
		n := min(chunk, test.Len()-lo)
		for i := range n {
			idx[i] = lo + i
		}
		x, labels := test.Gather(idx[:n], make([]float32, n*pixels), labels)
		h := tensor.New(tensor.WithShape(n, pixels), tensor.WithBacking(x))
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
			if best == int(labels[i]) {
				correct++
			}
		}
	}
	return float64(correct) / float64(test.Len()), nil
}
