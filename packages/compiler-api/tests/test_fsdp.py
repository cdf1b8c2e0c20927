"""A model sharded with FSDP2 (``fully_shard``), compiled by ember, trained by 2 processes
(gloo on the loopback address) against one process on the concatenated batch (issue 21).

The parameters are DTensors sharded across the two ranks; FSDP's pre-forward hook
all-gathers a module's parameters into unsharded tensors, and its post-forward hook frees
them again (their storage resized to 0) until backward gathers them once more. ember
breaks the graph at each sharded submodule's call (its pre-forward hook runs collectives,
which ember does not capture), runs the submodule as it is, and captures the code between:
``explain()`` lists each break at the user's line that called the module.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import gloo_workers

WORKER = textwrap.dedent(
    """
    import json, os, sys
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    import ember.compiler as ec

    rank, backend, out = int(os.environ["RANK"]), sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 16)
            self.c = torch.nn.Linear(16, 4)

        def forward(self, x):
            h = torch.nn.functional.gelu(self.a(x))
            return self.c(self.b(h).tanh())

    def batches(r):
        g = torch.Generator().manual_seed(100 + r)
        return [torch.randn(6, 8, generator=g) for _ in range(3)]

    def train(model, run, data):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        freed = []
        for x in data:
            run(x).square().mean().backward()
            # between uses FSDP keeps only the shard: the gathered weight's storage is empty
            param = model.a._get_fsdp_state()._fsdp_param_group.fsdp_params[0]
            freed.append(param._unsharded_param.untyped_storage().size() == 0)
            opt.step()
            opt.zero_grad()
        return freed

    torch.manual_seed(0)
    net, one = Net(), Net()
    one.load_state_dict(net.state_dict())
    mesh = init_device_mesh("cpu", (2,))
    for module in (net.a, net.b, net):
        fully_shard(module, mesh=mesh)
    run = ec.compile(net, backend=backend)
    freed = train(net, run, batches(rank))
    whole = [torch.cat(pair) for pair in zip(batches(0), batches(1))]
    opt = torch.optim.SGD(one.parameters(), lr=0.1, momentum=0.9)
    for x in whole:
        one(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    sharded = net.state_dict()
    full = {k: v.full_tensor() for k, v in sharded.items()}
    explained = ec.explain(net)(batches(rank)[0])
    result = {
        "vs_one": max((full[k] - v).abs().max().item() for k, v in one.state_dict().items()),
        "dtensors": all(isinstance(v, DTensor) for v in sharded.values()),
        "freed": freed,
        "graphs": run.stats.graphs,
        "breaks": [(b.reason, b.source) for b in explained.break_reasons],
    }
    with open(out, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_fully_shard_trains_as_one_process(tmp_path: Path, backend: str) -> None:
    for result in gloo_workers.run_two(tmp_path, WORKER, backend):
        assert result["vs_one"] < 1e-5 and result["dtensors"], result
        assert result["freed"] == [True, True, True], result
        # the code before a, between a and b (gelu), after b (tanh and c's linear)
        assert result["graphs"] == 3, result
        assert result["breaks"] == [
            ["calling FSDPState._pre_forward (not a torch operation ember can record)",
             "h = torch.nn.functional.gelu(self.a(x))"],
            ["calling FSDPState._pre_forward (not a torch operation ember can record)",
             "return self.c(self.b(h).tanh())"],
        ], result  # fmt: skip
