"""A model in DistributedDataParallel, compiled by ember, trained by 2 processes (gloo on the
loopback address) against the same training without ember and against one process on the
concatenated batch (issue 21).

DDP's own forward (its reducer's bookkeeping, ``record_function``) runs as it is; the
wrapped model's forward is captured and cut at DDP's gradient buckets
(``ember.compiler.ddp``), each piece compiled alone, so that each piece's backward
accumulates its gradients into ``.grad``, where DDP's hooks all-reduce them, while the
backward of the pieces before it runs. Small buckets here: three layers, two pieces.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

WORKER = textwrap.dedent(
    """
    import json, os, sys
    import torch, torch.distributed as dist
    import ember.compiler as ec
    import ember.compiler.ddp as ddp_split

    pieces = []
    split_graph = ddp_split.split_graph

    def counted(*args):
        split = split_graph(*args)
        pieces.append(0 if split is None else len(list(split.children())))
        return split

    ddp_split.split_graph = counted

    rank, backend, out = int(os.environ["RANK"]), sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 16)
            self.c = torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.c(self.b(torch.nn.functional.gelu(self.a(x))).tanh())

    def batches(r):
        g = torch.Generator().manual_seed(100 + r)
        return [torch.randn(6, 8, generator=g) for _ in range(3)]

    def train(model, data, compiled):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        run = ec.compile(model, backend=backend) if compiled else model
        for x in data:
            run(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        return [p.detach().clone() for p in model.parameters()], run

    torch.manual_seed(0)
    init = Net().state_dict()
    nets = [Net() for _ in range(3)]
    for n in nets:
        n.load_state_dict(init)
    def DDP(net):  # buckets of 419 bytes: the layers' 576, 1088 and 272 make two
        return torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.0004)

    ember_params, run = train(DDP(nets[0]), batches(rank), True)
    ddp_params, _ = train(DDP(nets[1]), batches(rank), False)
    # one process on both ranks' batches: DDP averages the two halves' gradients
    whole = [torch.cat(pair) for pair in zip(batches(0), batches(1))]
    one_params, _ = train(nets[2], whole, False)
    diff = lambda a, b: max((p - q).abs().max().item() for p, q in zip(a, b))
    result = {
        "vs_ddp": diff(ember_params, ddp_params),
        "vs_one": diff(ember_params, one_params),
        "graphs": run.stats.graphs,
        "compiled": [str(c.code).split(" ")[0] for c in run.stats.compiled],
        "pieces": pieces,
    }
    with open(out, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_ddp_training_equals_eager_ddp_and_one_process(tmp_path: Path, backend: str) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    env["EMBER_CACHE_DIR"] = str(tmp_path / "cache")
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), backend, str(tmp_path / f"rank{r}.json")],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    try:
        logs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    for r in range(2):
        result = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert result["vs_ddp"] < 1e-5 and result["vs_one"] < 1e-5, result
        assert result["compiled"] == ["Net.forward"] and result["graphs"] == 1, result
        assert result["pieces"] == [2], result  # one graph, cut at the buckets
