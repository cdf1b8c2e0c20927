"""Who imports what on a first call: the stack at the first import of each watched module.

    python3 benchmarks/import_chain.py                       # eager backend, one pointwise fn
    python3 benchmarks/import_chain.py --backend inductor
    python3 benchmarks/import_chain.py --watch torch._dynamo,sympy --depth 20

Runs ``import ember.compiler`` and the first call of ``x.sin() + 1`` compiled with
``--backend`` in this (fresh) process, after ``import torch`` only. For each module of
``--watch`` imported for the first time it prints the innermost ``--depth`` frames
of the stack that asked for it, then how many modules each step added and how long
it took. A watched module already imported by ``import torch`` prints nothing
(torch 2.13 imports ``torch.export`` itself). ``docs/performance.md`` ("Where cold
compile time goes") shows what it found.
"""

from __future__ import annotations

import argparse
import importlib._bootstrap as bootstrap
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

WATCH = (
    "torch._dynamo",
    "torch._inductor",
    "torch._functorch.aot_autograd",
    "torch.export",
    "sympy",
    "networkx",
)


def watch(names: set[str], depth: int) -> Callable[[], None]:
    """Print the stack at the first import of each of ``names``; returns the undo."""
    find_and_load = bootstrap._find_and_load  # type: ignore[attr-defined]

    def hooked(name: str, import_: Any) -> Any:
        if name in names and name not in sys.modules:
            names.discard(name)
            frames = [
                f
                for f in traceback.extract_stack()[:-1]
                if "<frozen" not in f.filename and f.name != "hooked"
            ]
            print(f"\n-- first import of {name}:", file=sys.stderr)
            for f in frames[-depth:]:
                where = f.filename.replace(sys.prefix, "$prefix")
                print(f"   {where}:{f.lineno} {f.name}: {f.line}", file=sys.stderr)
        return find_and_load(name, import_)

    bootstrap._find_and_load = hooked  # type: ignore[attr-defined]
    return lambda: setattr(bootstrap, "_find_and_load", find_and_load)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="eager")
    parser.add_argument("--watch", default=",".join(WATCH), help="comma-separated modules")
    parser.add_argument("--depth", type=int, default=12, help="stack frames to print")
    args = parser.parse_args()
    undo = watch(set(args.watch.split(",")), args.depth)
    before, start = len(sys.modules), time.perf_counter()
    import ember.compiler

    imported, mid = len(sys.modules), time.perf_counter()
    ember.compiler.compile(lambda x: x.sin() + 1, backend=args.backend)(torch.randn(4))
    end = time.perf_counter()
    undo()
    print(
        f"\nimport ember.compiler: +{imported - before} modules, {mid - start:.2f} s; "
        f"first call ({args.backend}): +{len(sys.modules) - imported} modules, "
        f"{end - mid:.2f} s",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
