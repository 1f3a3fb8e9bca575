#!/usr/bin/env python3
"""PyTorch DDP over Gloo training the 784-256-128-10 MLP on MNIST: the
baseline of scripts/bench-frameworks.sh (issue 16).

Same model, data (GoMNIST's idx files), global batch, loss (mean
cross-entropy over the local batch) and optimizer (SGD, momentum 0.9) as
examples/gorgonia-mnist. Ranks are processes started by torch.multiprocessing
with a tcp:// store on 127.0.0.1; each rank uses --threads intra-op threads.
Prints one JSON line with samples/s (global), the accuracy on the test set
and the fraction of the step spent in DDP's allreduce wait (measured with a
comm hook's future, see below).

Usage: torch_ddp_mlp.py --data-dir DIR [--nproc 2] [--epochs 1] [--train-limit 0]
       [--batch-size 128] [--threads 1] [--lr 0.02]
"""
import argparse
import gzip
import json
import os
import socket
import struct
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    if magic == 2051:
        rows, cols = struct.unpack(">II", data[8:16])
        return np.frombuffer(data, dtype=np.uint8, offset=16).reshape(n, rows * cols)
    return np.frombuffer(data, dtype=np.uint8, offset=8)


def load(data_dir):
    def imgs(name):
        x = load_idx(os.path.join(data_dir, name)).astype(np.float32) / 255.0
        return torch.from_numpy((x - 0.1307) / 0.3081)

    def labels(name):
        return torch.from_numpy(load_idx(os.path.join(data_dir, name)).astype(np.int64))

    return (imgs("train-images-idx3-ubyte.gz"), labels("train-labels-idx1-ubyte.gz"),
            imgs("t10k-images-idx3-ubyte.gz"), labels("t10k-labels-idx1-ubyte.gz"))


def worker(rank, args, port, out):
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.nproc)
    torch.manual_seed(args.seed)
    xtr, ytr, xte, yte = load(args.data_dir)
    if args.train_limit:
        xtr, ytr = xtr[: args.train_limit], ytr[: args.train_limit]
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    ddp = nn.parallel.DistributedDataParallel(model)
    comm = {"t": 0.0}

    # Time the allreduce of each bucket from launch to completion (the
    # default hook's work, wrapped).
    def hook(state, bucket):
        t0 = time.perf_counter()
        fut = dist.all_reduce(bucket.buffer().div_(args.nproc), async_op=True).get_future()

        def done(f):
            comm["t"] += time.perf_counter() - t0
            return f.value()[0]

        return fut.then(done)

    ddp.register_comm_hook(None, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    sampler = torch.utils.data.DistributedSampler(range(len(ytr)), num_replicas=args.nproc, rank=rank,
                                                  shuffle=True, seed=args.seed, drop_last=True)
    local = args.batch_size // args.nproc
    steps = 0
    start = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(iter(sampler)))
        for b in range(len(idx) // local):
            sel = idx[b * local:(b + 1) * local]
            opt.zero_grad(set_to_none=False)
            loss = F.cross_entropy(ddp(xtr[sel]), ytr[sel])
            loss.backward()
            opt.step()
            steps += 1
    secs = time.perf_counter() - start
    with torch.no_grad():
        acc = (model(xte).argmax(1) == yte).float().mean().item()
    if rank == 0:
        out.put({"peer": "pytorch-ddp-gloo", "world_size": args.nproc, "threads": args.threads,
                 "global_batch": args.batch_size, "steps": steps, "train_seconds": secs,
                 "samples_per_sec": steps * args.batch_size / secs, "accuracy": acc,
                 "comm_seconds": comm["t"], "comm_fraction": comm["t"] / secs, "torch": torch.__version__})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", required=True)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--train-limit", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    procs = [ctx.Process(target=worker, args=(r, args, port, out)) for r in range(args.nproc)]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join()
        if pr.exitcode != 0:
            raise SystemExit(f"rank exited with {pr.exitcode}")
    print(json.dumps(out.get()))


if __name__ == "__main__":
    main()
