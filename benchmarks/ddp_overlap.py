"""DDP under ember: time per training step with the graph cut at DDP's gradient buckets
(each bucket's all-reduce overlaps the backward of the pieces before it) and uncut (every
all-reduce after the whole backward), against DDP without ember, in the same 2 processes
(gloo on the loopback address, one thread each).

    PYTHONPATH=$(ls -d packages/*/src | tr '\\n' ':') python benchmarks/ddp_overlap.py

Prints ms per step (median of 20 after 5 warm-up steps) for each configuration, and the
ratio uncut / cut: above 1 is time the overlap saved. gloo's all-reduce runs on CPU
threads, so the overlap needs cores to spare beside the two training processes.
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class MLP(torch.nn.Module):
    def __init__(self, width: int = 1024, depth: int = 6) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x))
        return x


def _steps(run, model, x) -> float:  # type: ignore[no-untyped-def]
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    times = []
    for k in range(25):
        start = time.perf_counter()
        run(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        if k >= 5:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def worker(rank: int, port: int, queue) -> None:  # type: ignore[no-untyped-def]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    import ember.compiler as ec
    import ember.compiler.ddp as ddp_split

    x = torch.randn(64, 1024)
    results = {}
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(MLP(), bucket_cap_mb=4)
    results["eager DDP"] = _steps(ddp, ddp, x)
    ec.reset()
    results["ember DDP, cut at buckets"] = _steps(ec.compile(ddp, backend="inductor"), ddp, x)
    ec.reset()
    ddp_split.split_graph = lambda *args: None  # one piece: every all-reduce after backward
    results["ember DDP, uncut"] = _steps(ec.compile(ddp, backend="inductor"), ddp, x)
    queue.put((rank, results))
    dist.destroy_process_group()


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, 2 processes, gloo")
    print("| configuration | rank 0 ms/step | rank 1 ms/step |")
    print("|---|---:|---:|")
    for name in got[0]:
        print(f"| {name} | {got[0][name]:.1f} | {got[1][name]:.1f} |")
    ratio = got[0]["ember DDP, uncut"] / got[0]["ember DDP, cut at buckets"]
    print(f"\nuncut / cut (rank 0): {ratio:.2f}x")


if __name__ == "__main__":
    main()
