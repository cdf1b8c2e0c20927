"""Backward time: eager's autograd engine against ember's compiled autograd.

    python benchmarks/bench_compiled_autograd.py [MODEL] [BATCH_REPEAT]

One zoo model (default ``transformer-block``), its forward run eagerly, then
``loss.backward()`` timed three ways, interleaved in one process, one thread:
eager's engine, ``compiled_autograd(compiler="aot_eager")`` and
``compiled_autograd(compiler="inductor")``. Prints the first backward (the
compile), the best of 30 backward calls after it (``time.perf_counter``), and
the compiles, hits and eager fallbacks each compiled mode counted. Asserts
nothing. ``BATCH_REPEAT`` concatenates the model's example batch that many times.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from models import ZOO

import ember.compiler

MODES = {"eager engine": None, "aot_eager": "aot_eager", "inductor": "inductor"}


def main() -> None:
    torch.set_num_threads(1)
    name = sys.argv[1] if len(sys.argv) > 1 else "transformer-block"
    model, args = ZOO[name].make()
    repeat = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    args = tuple(torch.cat([a] * repeat) for a in args)
    counts: dict[str, list[int]] = {m: [0, 0, 0] for m in MODES if MODES[m]}

    def backward(mode: str) -> float:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        loss = model(*args).float().square().mean()
        start = time.perf_counter()
        if MODES[mode] is None:
            loss.backward()
            return time.perf_counter() - start
        with ember.compiler.compiled_autograd(compiler=MODES[mode]) as ca:
            loss.backward()
        took = time.perf_counter() - start
        for k, v in enumerate((ca.stats.compiles, ca.stats.hits, ca.stats.eager)):
            counts[mode][k] += v
        return took

    first = {m: backward(m) for m in MODES}
    best = dict.fromkeys(MODES, float("inf"))
    for _ in range(30):
        for m in MODES:
            best[m] = min(best[m], backward(m))
    print(f"{name} x{repeat}: first backward (s):", {m: round(v, 2) for m, v in first.items()})
    print(f"{name} x{repeat}: best of 30 (ms):", {m: round(v * 1e3, 3) for m, v in best.items()})
    print("compiles/hits/eager:", counts)


if __name__ == "__main__":
    main()
