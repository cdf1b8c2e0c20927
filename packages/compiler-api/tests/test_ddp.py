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

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import gloo_workers

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

    rank, backend, scenario, out = int(os.environ["RANK"]), *sys.argv[1:4]
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 16)
            self.c = torch.nn.Linear(16, 4)
            self.unused = torch.nn.Linear(4, 4)  # no gradient: find_unused_parameters
            self.register_buffer("scale", torch.ones(4))

        def forward(self, x):
            y = self.c(self.b(torch.nn.functional.gelu(self.a(x))).tanh())
            if scenario == "buffers":  # a buffer each rank moves its own way
                self.scale.mul_(0.5).add_(x.mean(0)[:4].abs(), alpha=0.5)
                y = y * self.scale
            return y

    def batches(r):
        g = torch.Generator().manual_seed(100 + r)
        return [torch.randn(6, 8, generator=g) for _ in range(4)]

    def train(model, data, compiled, micro):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        run = ec.compile(model, backend=backend) if compiled else model
        for step in range(0, len(data), micro):
            for k, x in enumerate(data[step : step + micro]):
                last = k == micro - 1  # no_sync: all-reduce only the last micro-batch's
                sync = model.no_sync() if not last and hasattr(model, "no_sync") else None
                with sync or torch.enable_grad():
                    run(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        return [p.detach().clone() for p in model.parameters()], run

    def make():  # torch.nn's own forward wrapped directly, or the user's
        if scenario != "sequential":
            return Net()
        lin = torch.nn.Linear
        layers = lin(8, 16), torch.nn.GELU(), lin(16, 16), torch.nn.Tanh(), lin(16, 4)
        return torch.nn.Sequential(*layers)

    torch.manual_seed(0)
    init = make().state_dict()
    nets = [make() for _ in range(3)]
    for n in nets:
        n.load_state_dict(init)
    def DDP(net):  # buckets of 419 bytes: the layers' 576, 1088 and 272 make two
        unused = scenario == "unused"
        if not unused and hasattr(net, "unused"):
            net.unused.requires_grad_(False)
        return torch.nn.parallel.DistributedDataParallel(
            net, bucket_cap_mb=0.0004, find_unused_parameters=unused
        )

    micro = 2 if scenario == "no_sync" else 1
    ember_params, run = train(DDP(nets[0]), batches(rank), True, micro)
    ddp_params, _ = train(DDP(nets[1]), batches(rank), False, micro)
    # one process on both ranks' batches: DDP averages the two halves' gradients
    whole = [torch.cat(pair) for pair in zip(batches(0), batches(1))]
    one_params, _ = train(nets[2], whole, False, micro)
    diff = lambda a, b: max([(p - q).abs().max().item() for p, q in zip(a, b)], default=0.0)
    result = {
        "vs_ddp": diff(ember_params, ddp_params),
        "vs_one": diff(ember_params, one_params),
        "buffers": diff(list(nets[0].buffers()), list(nets[1].buffers())),
        "graphs": run.stats.graphs,
        "compiled": [str(c.code).split(" ")[0] for c in run.stats.compiled],
        "pieces": pieces,
    }
    with open(out, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    """
)


def _run_workers(
    tmp_path: Path, backend: str, scenario: str, **extra_env: str
) -> list[dict[str, Any]]:
    return gloo_workers.run_two(tmp_path, WORKER, backend, scenario, **extra_env)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_ddp_training_equals_eager_ddp_and_one_process(tmp_path: Path, backend: str) -> None:
    for result in _run_workers(tmp_path, backend, "plain"):
        assert result["vs_ddp"] < 1e-5 and result["vs_one"] < 1e-5, result
        assert result["compiled"] == ["Net.forward"] and result["graphs"] == 1, result
        assert result["pieces"] == [2], result  # one graph, cut at the buckets


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["no_sync", "unused", "sequential"])
def test_ddp_no_sync_unused_parameters_and_sequential(tmp_path: Path, scenario: str) -> None:
    """``no_sync()`` over two micro-batches a step (the first one's gradients are kept, not
    all-reduced), ``find_unused_parameters`` with a layer forward never reads, and an
    ``nn.Sequential`` wrapped directly (torch.nn's own forward, captured as the entry)."""
    for result in _run_workers(tmp_path, "aot_eager", scenario):
        assert result["vs_ddp"] < 1e-5 and result["vs_one"] < 1e-5, result
        assert result["graphs"] == 1 and result["pieces"] == [2], result


@pytest.mark.slow
def test_optimize_ddp_off_keeps_the_graph_whole(tmp_path: Path) -> None:
    for result in _run_workers(tmp_path, "aot_eager", "plain", EMBER_OPTIMIZE_DDP="0"):
        assert result["vs_ddp"] < 1e-5 and result["vs_one"] < 1e-5, result
        assert result["graphs"] == 1 and result["pieces"] == [], result


@pytest.mark.slow
def test_ddp_broadcast_buffers(tmp_path: Path) -> None:
    """A buffer each rank updates from its own batch: DDP broadcasts rank 0's before each
    forward (``broadcast_buffers``, its default); the compiled run's buffers and parameters
    equal DDP's without ember on both ranks."""
    results = _run_workers(tmp_path, "aot_eager", "buffers")
    for result in results:
        assert result["vs_ddp"] < 1e-5 and result["buffers"] < 1e-6, result
        assert result["graphs"] == 1, result


@pytest.mark.parametrize(
    ("cap_mb", "cap_list", "expected"),
    [
        (None, None, (1024 * 1024, 25 * 1024 * 1024)),  # default: DDP's smaller first bucket
        (2, None, (2 * 1024 * 1024, 2 * 1024 * 1024)),
        (None, [1, 3], (1024 * 1024, 3 * 1024 * 1024)),  # bucket_cap_mb_list
    ],
)
def test_bucket_sizes_follow_ddp(
    monkeypatch: pytest.MonkeyPatch, cap_mb: Any, cap_list: Any, expected: tuple[int, ...]
) -> None:
    """The cut reads the sizes DDP gives its buckets, the first one included, from the DDP
    module whose forward runs."""
    import types

    import torch
    from torch.nn.parallel import distributed

    from ember.compiler import ddp

    config = distributed._BucketCapacityConfig.create(cap_mb, cap_list, False)
    active = types.SimpleNamespace(_bucket_config=config, bucket_bytes_cap=config.bucket_bytes_cap)
    ddp_class = torch.nn.parallel.DistributedDataParallel
    monkeypatch.setattr(ddp_class, "_get_active_ddp_module", classmethod(lambda cls: active))
    assert ddp._active_bucket_caps() == expected
    monkeypatch.setattr(ddp_class, "_get_active_ddp_module", classmethod(lambda cls: None))
    assert ddp._active_bucket_caps() is None
