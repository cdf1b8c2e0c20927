"""ember.inductor's compile_graph against eager and torch.compile(backend="inductor").

Each workload's forward is traced to an aten graph with make_fx (no grad). For
each we measure steady-state time per call (best batch mean) of eager, of
``compile_graph``'s callable and of ``torch.compile`` (the peer), and the cold
compile time (empty caches) and warm compile time (a fresh process, caches kept)
of both. ember's cold/warm include tracing with make_fx (which ember.capture and
ember.aotgraph replace in the real pipeline); ``compile_graph`` columns are
ember.inductor's own share.

    python benchmarks/bench_inductor.py            # full sizes
    python benchmarks/bench_inductor.py --quick    # small sizes
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

WORKLOADS = ["pointwise", "softmax-ln", "mlp", "gpt"]


def _prepare(name: str, quick: bool) -> tuple[Any, tuple[Any, ...]]:
    from workloads import FAMILIES

    program, args = FAMILIES[name].build(quick)
    if isinstance(program, torch.nn.Module):
        program.eval()
    return program, args


def _time(fn: Any, args: tuple[Any, ...], batches: int = 15, calls: int = 5) -> float:
    """Best mean time per call over batches: the machine is shared, so take the least
    disturbed batch (as timeit does)."""
    for _ in range(3):
        fn(*args)
    best = float("inf")
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def child(name: str, which: str, quick: bool) -> dict[str, float]:
    """One measurement in this (fresh) process."""
    from torch.fx.experimental.proxy_tensor import make_fx

    program, args = _prepare(name, quick)
    with torch.no_grad():
        if which == "eager":
            return {"steady": _time(program, args)}
        start = time.perf_counter()
        if which == "ember":
            from ember.inductor import compile_graph

            gm = make_fx(program)(*args)
            traced = time.perf_counter()
            fn = compile_graph(gm, list(args))
            fn(*args)
            extra = {"compile_graph": time.perf_counter() - traced}
        else:
            fn = torch.compile(program, backend="inductor")  # the peer, measured only
            fn(*args)
            extra = {}
        cold = time.perf_counter() - start
        return {"cold": cold, "steady": _time(fn, args), **extra}


def main() -> None:
    quick = "--quick" in sys.argv
    if "--child" in sys.argv:
        _, _, name, which = sys.argv[:4]
        print(json.dumps(child(name, which, quick)))
        return
    rows = [_measure(name, quick) for name in WORKLOADS]
    print(
        "| workload | eager ms | ember ms | torch.compile ms | ember/torch speed | "
        "ember cold s | torch cold s | ember warm s | torch warm s | "
        "compile_graph cold s | compile_graph warm s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        e, m, t = r["eager"]["steady"], r["ember"]["steady"], r["torch"]["steady"]
        print(
            f"| {r['workload']} | {e * 1e3:.3f} | {m * 1e3:.3f} | {t * 1e3:.3f} | "
            f"{t / m:.2f}x | {r['ember']['cold']:.2f} | {r['torch']['cold']:.2f} | "
            f"{r['ember-warm']['cold']:.2f} | {r['torch-warm']['cold']:.2f} | "
            f"{r['ember']['compile_graph']:.2f} | {r['ember-warm']['compile_graph']:.2f} |"
        )
    geo = statistics.geometric_mean(r["torch"]["steady"] / r["ember"]["steady"] for r in rows)
    print(f"\ngeometric mean speed vs torch.compile: {geo:.2f}x (>1: ember faster)")


def _measure(name: str, quick: bool) -> dict[str, Any]:
    """One workload: eager, then each compiler cold (empty caches) and warm (caches kept)."""
    here = os.path.dirname(os.path.abspath(__file__))
    row: dict[str, Any] = {"workload": name}
    for which in ("eager", "ember", "torch"):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(
                os.environ,
                EMBER_CACHE_DIR=cache,
                TORCHINDUCTOR_CACHE_DIR=cache,
                PYTHONPATH=here + os.pathsep + os.environ.get("PYTHONPATH", ""),
            )
            cmd = [sys.executable, __file__, "--child", name, which] + (
                ["--quick"] if quick else []
            )
            runs = 1 if which == "eager" else 2
            for run in range(runs):  # the second process finds the first one's caches
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                key = which if run == 0 else f"{which}-warm"
                row[key] = json.loads(out.stdout.strip().splitlines()[-1])
    return row


if __name__ == "__main__":
    main()
