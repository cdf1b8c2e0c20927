"""Per-call overhead of a compiled tiny function: ember against eager and torch.compile.

    python benchmarks/bench_overhead.py [--quick] [--backend inductor [--wrappers twin,main]]

Two functions, each measured in one process, one thread, for plain eager,
ember (backend "eager"), and ``torch.compile(backend="eager")`` as the peer
(``--backend inductor``: both compilers' inductor, so a call also runs the generated
wrapper and its C++ kernel; issue 21's per-call overhead of a kernel launch;
``--wrappers``: rows for ember's compiled function with its wrapper bound other ways,
interleaved with the others, see ``wrapper_variants.py``):

- ``tiny``: one add on a 10-element tensor, so a compiled call is almost all
  overhead (hook, guard check, loading inputs, calling the graph, rebuilding the
  result). Target (issue 4): ember adds at most a quarter of what torch adds.
- ``one_break``: a few ops around one graph break, called in a loop (issue 5):
  two graphs, the native call between them, and the resume function's own
  guard check.

Times are CPU time of the calling thread (``time.thread_time_ns``), best of two
interleaved passes of the median of ``repeats`` samples. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import ember.compiler

sys.path.insert(0, str(Path(__file__).parent))
from wrapper_variants import Switch, rebind, watch_wrappers


def tiny(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def one_break(x: torch.Tensor) -> torch.Tensor:
    """Two small graphs around one graph break (a call ember and torch cannot trace)."""
    y = torch.sin(x) + 1
    torch._C._get_tracing_state()  # an opaque C function: a graph break for both compilers
    return torch.cos(y) * 2


def ns_per_call(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, n: int, repeats: int
) -> tuple[float, float]:
    for _ in range(n // 10):
        fn(x)
    samples = []
    for _ in range(repeats):
        start = time.thread_time_ns()  # CPU time of this thread: other processes do not count
        for _ in range(n):
            fn(x)
        samples.append((time.thread_time_ns() - start) / n)
    return statistics.median(samples), max(samples) / min(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls, for a smoke run")
    parser.add_argument("--backend", default="eager", choices=("eager", "inductor"))
    parser.add_argument("--wrappers", default="", help="twin and/or git refs, comma-separated")
    args = parser.parse_args()
    torch.set_num_threads(1)
    n, repeats = (2_000, 3) if args.quick else (20_000, 9)
    print(f"torch {torch.__version__}, 1 thread, backend {args.backend}")
    wrappers = [w for w in args.wrappers.split(",") if w]
    for fn in (tiny, one_break):
        report(fn, n, repeats, args.backend, wrappers)


def report(
    fn: Callable[[torch.Tensor], torch.Tensor],
    n: int,
    repeats: int,
    backend: str = "eager",
    wrappers: list[str] | None = None,
) -> None:
    """Time eager, ember and torch.compile on ``fn`` and print the overhead each adds."""
    x = torch.randn(10)
    seen = watch_wrappers() if wrappers else []
    first = len(seen)
    ours = ember.compiler.compile(fn, backend=backend)
    peer = torch.compile(fn, backend=backend)
    for compiled in (ours, peer):
        torch.testing.assert_close(compiled(x), fn(x))
    seen = seen[first:]
    configs: list[tuple[str, Callable[[torch.Tensor], Any], list[tuple[Switch, Any]]]] = [
        ("eager", fn, []),
        ("ember", ours, [(s, s.call) for s in seen]),
        *((f"ember [{how}]", ours, [(s, rebind(s, how)) for s in seen]) for how in wrappers or ()),
        ("torch.compile", peer, []),
    ]
    rows: dict[str, tuple[float, float]] = {}
    # interleave the configurations so that drift on a shared machine hits them alike
    for _ in range(2):
        for name, f, calls in configs:
            for switch, call in calls:
                switch.call = call
            rows[name] = min(rows.get(name, (float("inf"), 0.0)), ns_per_call(f, x, n, repeats))
    eager = rows["eager"][0]
    print(f"\n{fn.__name__}: {(fn.__doc__ or 'one add on a 10-element tensor').splitlines()[0]}")
    print(f"  graphs {ours.stats.graphs}, breaks {len(ours.stats.breaks)}")
    print(f"  {'configuration':<16}{'ns/call':>10}{'added':>10}{'spread':>9}")
    for name, (ns, spread) in rows.items():
        print(f"  {name:<16}{ns:>10.0f}{ns - eager:>10.0f}{spread:>8.2f}x")
    ember_added = rows["ember"][0] - eager
    torch_added = rows["torch.compile"][0] - eager
    print(f"  ember adds {ember_added / torch_added:.2f} of what torch.compile adds")


if __name__ == "__main__":
    main()
