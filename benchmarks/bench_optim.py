"""One AdamW step over the GPT workload's parameters: ember vs eager and torch.compile.

Every configuration gets its own copy of the parameters and gradients and its own
optimizer; the configurations are timed in one process, interleaved round by round
(``--rounds`` rounds of ``--steps`` steps each), with one thread, in CPU time of this
thread (``time.thread_time``: other processes on a shared machine do not count).
Prints best and median ms/step per configuration (docs/training.md, "How fast").

    python benchmarks/bench_optim.py --rounds 9 --steps 5
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from workloads import FAMILIES

Step = Callable[[], object]


def _params() -> list[torch.nn.Parameter]:
    """The GPT family's parameters (full size) with fixed gradients."""
    torch.manual_seed(0)
    program, _ = FAMILIES["gpt"].build(False)
    params = list(program.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def _fresh(params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    out = copy.deepcopy(params)
    for p, q in zip(params, out, strict=True):
        q.grad = p.grad.clone()  # type: ignore[union-attr]
    return out


def _configs(which: list[str]) -> dict[str, Callable[[list[torch.nn.Parameter]], Step]]:
    def eager(**kw: object) -> Callable[[list[torch.nn.Parameter]], Step]:
        return lambda ps: torch.optim.AdamW(ps, lr=1e-3, **kw).step  # type: ignore[arg-type]

    def ember(foreach: bool) -> Callable[[list[torch.nn.Parameter]], Step]:
        def make(ps: list[torch.nn.Parameter]) -> Step:
            import ember.compiler

            opt = torch.optim.AdamW(ps, lr=1e-3, foreach=foreach)
            return ember.compiler.compile(opt.step, backend="inductor")

        return make

    def torch_compile(ps: list[torch.nn.Parameter]) -> Step:
        opt = torch.optim.AdamW(ps, lr=1e-3, foreach=True)
        return torch.compile(opt.step)

    table = {
        "eager-foreach": eager(foreach=True),
        "eager-fused": eager(fused=True),
        "torch.compile-foreach": torch_compile,
        "ember-inductor-foreach": ember(True),
        "ember-inductor-single": ember(False),
    }
    return {k: v for k, v in table.items() if k in which}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument(
        "--configs",
        default="eager-foreach,eager-fused,torch.compile-foreach,"
        "ember-inductor-foreach,ember-inductor-single",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    base = _params()
    steps = {}
    for name, make in _configs(args.configs.split(",")).items():
        step = make(_fresh(base))
        for _ in range(3):  # lazy state, compile, first run of the compiled step
            step()
        steps[name] = step
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            start = time.thread_time()
            for _ in range(args.steps):
                step()
            times[name].append((time.thread_time() - start) / args.steps * 1e3)
    print(f"{'config':26} best ms  median ms  (thread time, {args.rounds}x{args.steps} steps)")
    for name, ts in times.items():
        print(f"{name:26} {min(ts):7.2f}  {statistics.median(ts):9.2f}")


if __name__ == "__main__":
    main()
