"""Dynamic shapes: the first call's compile time, ``dynamic=True`` against static (issue 18).

    python benchmarks/bench_dynamic_compile.py [--workloads gpt-infer,hf-gpt2-infer] [--rounds 2]

For each workload of ``benchmarks/workloads.py`` and each round, two fresh processes run
interleaved, static (``dynamic=False``) then ``dynamic=True``: each imports everything
first, then times one ``Prepared.step()`` (capture, aot trace, lowering, C++ build, one
run) with an empty ``EMBER_CACHE_DIR``, the ``inductor`` backend and one thread. Printed
per workload: the best wall and process-CPU seconds of each (CPU includes the C++
compiler's, which runs as a child process), their ratio dynamic/static, the capture and
aot-trace phases (thread CPU seconds), the binary ``SymNode``
operations counted in each of those two phases (deterministic, unlike the times), and the
seconds spent in full (generation 2) garbage collections during the call: one costs about
0.2 s with torch and transformers loaded, and whether it falls inside the call depends on
how much the compile allocated (hf-llama-infer's dynamic compile crosses CPython's
threshold, its static one does not).
``--one WORKLOAD static|dynamic`` is the child run (prints one JSON line).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT = "gpt-infer,bert-infer,hf-gpt2-infer,hf-bert-infer,hf-llama-infer,hf-t5-infer"


def _count_symnode_ops(phases: list[Any]) -> dict[str, int]:
    """Count torch's binary ``SymNode`` operations by the innermost ember phase running."""
    from torch.fx.experimental import sym_node

    counts: dict[str, int] = {}
    binary = [m for m in sym_node.magic_methods if m not in sym_node.unary_methods]

    def counted(impl: Callable[..., Any]) -> Callable[..., Any]:
        def op(*args: Any, **kwargs: Any) -> Any:
            active = [p for rec in phases for p in rec.active]
            name = max(active, key=lambda p: p[1])[0] if active else "other"
            counts[name] = counts.get(name, 0) + 1
            return impl(*args, **kwargs)

        return op

    for m in binary:
        trailing = m in sym_node.magic_methods_on_operator_with_trailing_underscore
        attr = f"_{m}_" if trailing else f"_{m}"
        if hasattr(sym_node.SymNode, attr):
            setattr(sym_node.SymNode, attr, counted(getattr(sym_node.SymNode, attr)))
    return counts


def _thread_times(recorders: list[Any]) -> dict[str, float]:
    """Thread CPU seconds per phase of ``recorders`` (wall times mislead on a shared
    machine): each one's ``timed`` wrapped for this process."""
    spent: dict[str, float] = {}

    def wrap(timed: Callable[[str], Any]) -> Callable[[str], Any]:
        @contextlib.contextmanager
        def thread_timed(phase: str) -> Iterator[None]:
            start = time.thread_time()
            with timed(phase):
                yield
            spent[phase] = spent.get(phase, 0.0) + time.thread_time() - start

        return thread_timed

    for rec in recorders:
        rec.timed = wrap(rec.timed)
    return spent


def _cpu() -> float:
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _gc_seconds() -> list[float]:
    """A list whose first item accumulates the thread CPU seconds of full collections
    from now on (a ``gc`` callback)."""
    import gc

    spent = [0.0, 0.0]  # total, start of the running collection

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            spent[1] = time.thread_time()
        else:
            spent[0] += time.thread_time() - spent[1]

    gc.callbacks.append(on_gc)
    return spent


def one(name: str, sizes: str) -> dict[str, Any]:
    """The child run: one first call, timed, in this (fresh) process."""
    import torch

    sys.path.insert(0, str(HERE))
    import workloads

    import ember.compiler
    from ember.aotgraph import timing as aot_timing
    from ember.capture import timing as capture_timing

    torch.set_num_threads(1)
    prepared = workloads.WORKLOADS[name].prepare()
    counts = _count_symnode_ops([capture_timing.TIMES, aot_timing.TIMES])
    spent = _thread_times([capture_timing.TIMES, aot_timing.TIMES])
    prepared.compile(
        lambda p: ember.compiler.compile(p, backend="inductor", dynamic=sizes == "dynamic")
    )
    ember.compiler.reset()
    full_gc = _gc_seconds()
    cpu, thread, wall = _cpu(), time.thread_time(), time.perf_counter()
    prepared.step()
    wall, thread, cpu = time.perf_counter() - wall, time.thread_time() - thread, _cpu() - cpu
    times = ember.compiler.compile_times()
    return {
        "wall": wall,
        "cpu": cpu,
        "thread": thread,
        "capture": spent.get("capture", 0.0),
        "aot": spent.get("aot trace", 0.0),
        "wall capture": times["capture"][1],
        "wall aot": times["aot trace"][1],
        "ops": counts,
        "gc": full_gc[0],
    }


@contextlib.contextmanager
def _empty_cache() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="ember-dyn-") as path:
        yield path


def _child(name: str, sizes: str, tree: str | None) -> dict[str, Any]:
    with _empty_cache() as cache:
        env = {**os.environ, "EMBER_CACHE_DIR": cache, "OMP_NUM_THREADS": "1", "EMBER_CHECK": "0"}
        if tree is not None:  # that checkout's packages first on the path
            src = [str(p) for p in sorted(Path(tree).glob("packages/*/src"))]
            env["PYTHONPATH"] = os.pathsep.join([*src, env.get("PYTHONPATH", "")])
        cmd = [sys.executable, __file__, "--one", name, sizes]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{name} {sizes} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=DEFAULT)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "SIZES"))
    parser.add_argument(
        "--trees",
        help="comma-separated checkouts to compare (each run with its packages on the path, "
        "interleaved in every round); default: the packages already on the path",
    )
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(*args.one)))
        return
    print(f"load {os.getloadavg()}")
    head = "workload        static wall/cpu   dynamic wall/cpu  d/s wall  d/s cpu"
    print(head + "  capture s/d    aot s/d      SymNode ops capture s/d, aot s/d  gc s/d")
    trees: list[str | None] = list(args.trees.split(",")) if args.trees else [None]
    for name in args.workloads.split(","):
        best: dict[tuple[str | None, str], dict[str, Any]] = {}
        for _ in range(args.rounds):
            for tree in trees:
                for sizes in ("static", "dynamic"):
                    got = _child(name, sizes, tree)
                    old = best.get((tree, sizes))
                    best[tree, sizes] = got if old is None or got["cpu"] < old["cpu"] else old
        for tree in trees:
            s, d = best[tree, "static"], best[tree, "dynamic"]
            ops = [r["ops"].get(p, 0) for p in ("capture", "aot trace") for r in (s, d)]
            label = name if tree is None else f"{name} {Path(tree).name}"
            print(
                f"{label:<15} {s['wall']:>6.2f}/{s['cpu']:<6.2f}    "
                f"{d['wall']:>6.2f}/{d['cpu']:<6.2f}"
                f"  {d['wall'] / s['wall']:>7.2f}  {d['cpu'] / s['cpu']:>7.2f}"
                f"  {s['capture']:.2f}/{d['capture']:.2f}  {s['aot']:.2f}/{d['aot']:.2f}"
                f"   {ops[0]}/{ops[1]}, {ops[2]}/{ops[3]}"
                f"  {s.get('gc', 0.0):.2f}/{d.get('gc', 0.0):.2f}",
                flush=True,
            )
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
