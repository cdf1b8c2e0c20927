"""ember's demo: compile every model of the zoo and show what was captured and what it costs.

    python3 -m nox -s demo            # or: python benchmarks/demo.py [--backend inductor]

For each model of ``benchmarks/models``: graphs captured, ops in them,
guards protecting them, frames that ran eagerly (with the reason), compile
time of the first call, and the steady-state time of a compiled call against
the same call in eager PyTorch (median of repeated timings, one thread).
It also prints the graph and the guards of one model, so you can see what
ember captured.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from models import ZOO

import ember.compiler


def median_seconds(fn: Callable[[], Any], repeats: int, number: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="inductor", help="a registered ember backend")
    parser.add_argument("--show", default="transformer-block", help="model whose graph to print")
    parser.add_argument("--quick", action="store_true", help="fewer timing repeats")
    args = parser.parse_args()
    torch.set_num_threads(1)
    repeats, number = (3, 5) if args.quick else (7, 20)
    print(f"ember demo: backend={args.backend}, torch {torch.__version__}, 1 thread\n")
    header = f"{'model':<20}{'graphs':>7}{'ops':>6}{'guards':>8}{'compile s':>11}"
    print(header + f"{'eager ms':>10}{'ember ms':>10}{'ratio':>8}  ran eagerly")
    for name, case in ZOO.items():
        model, inputs = case.make()
        eager_model = copy.deepcopy(model)
        compiled = ember.compiler.compile(model, backend=args.backend)
        with torch.no_grad():
            start = time.perf_counter()
            compiled(*inputs)
            compile_s = time.perf_counter() - start
            eager_t = median_seconds(lambda m=eager_model, i=inputs: m(*i), repeats, number)
            ember_t = median_seconds(lambda m=compiled, i=inputs: m(*i), repeats, number)
        stats = compiled.stats
        ops = sum(c.ops for c in stats.compiled)
        guards = sum(len(c.guards.guards) for c in stats.compiled)
        eagerly = "; ".join(f"{f.reason} ({f.location.splitlines()[0]})" for f in stats.failures)
        print(
            f"{name:<20}{stats.graphs:>7}{ops:>6}{guards:>8}{compile_s:>11.2f}"
            f"{eager_t * 1e3:>10.3f}{ember_t * 1e3:>10.3f}{ember_t / eager_t:>8.2f}"
            f"  {eagerly or '-'}"
        )
        if name == args.show and stats.compiled:
            shown = stats.compiled[0]
        ember.compiler.reset()
    if "shown" in locals():
        print(f"\nThe graph captured from {args.show} ({shown.code}):")
        print(shown.graph.code.strip())
        print(f"\nIts guards:\n{shown.guards}")


if __name__ == "__main__":
    main()
