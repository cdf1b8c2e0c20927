"""Per-call overhead of a compiled tiny function: ember against eager and torch.compile.

    python benchmarks/bench_overhead.py [--quick]

The function is one add on a 10-element tensor, so the time of a compiled
call is almost all overhead: the hook, the guard check, loading the graph
inputs, calling the graph, rebuilding the result. Measured in one process,
one thread, for: plain eager, ember (backend "eager"), and
``torch.compile(backend="eager")`` as the peer. The target (issue 4): ember
adds at most a quarter of what torch.compile adds. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import ember.compiler


def tiny(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def ns_per_call(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, n: int, repeats: int
) -> tuple[float, float]:
    for _ in range(n // 10):
        fn(x)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(n):
            fn(x)
        samples.append((time.perf_counter_ns() - start) / n)
    return statistics.median(samples), max(samples) / min(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls, for a smoke run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    n, repeats = (2_000, 3) if args.quick else (20_000, 9)
    x = torch.randn(10)
    ours = ember.compiler.compile(tiny)
    peer = torch.compile(tiny, backend="eager")
    for fn in (ours, peer):
        torch.testing.assert_close(fn(x), tiny(x))
    rows = {}
    # interleave the configurations so that drift on a shared machine hits them alike
    for _ in range(2):
        for name, fn in (("eager", tiny), ("ember", ours), ("torch.compile", peer)):
            rows[name] = min(rows.get(name, (float("inf"), 0.0)), ns_per_call(fn, x, n, repeats))
    eager = rows["eager"][0]
    print(f"one add on a 10-element tensor, torch {torch.__version__}, 1 thread")
    print(f"{'configuration':<16}{'ns/call':>10}{'added':>10}{'spread':>9}")
    for name, (ns, spread) in rows.items():
        print(f"{name:<16}{ns:>10.0f}{ns - eager:>10.0f}{spread:>8.2f}x")
    ember_added = rows["ember"][0] - eager
    torch_added = rows["torch.compile"][0] - eager
    print(
        f"\nember adds {ember_added / torch_added:.2f} of what torch.compile adds (target: <= 0.25)"
    )


if __name__ == "__main__":
    main()
