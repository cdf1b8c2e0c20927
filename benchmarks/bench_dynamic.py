"""Dynamic shapes: a size sweep, compiles and time per call, ember against torch.compile.

    python benchmarks/bench_dynamic.py [--quick] [--backend aot_eager] [--models gpt2,bert]

For each tiny random-init transformers model (``benchmarks/models/hf.py``) and each
varied dimension (batch, then sequence length), one compiled object per configuration is
called on ten sizes in a row: eager; ember and ``torch.compile`` with ``dynamic=False``,
``None`` (the default: automatic dynamic) and ``True``, all with the same backend name, in
one process. Printed per configuration: the graphs compiled, the seconds the whole sweep
took (compiles included), and the steady time per call on the sweep's sizes once every
graph exists (median of rounds over all sizes), with its ratio to eager and to
``torch.compile`` under the same ``dynamic``. A cache limit of 64 keeps ``dynamic=False``
compiling rather than falling back. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import hf

import ember.compiler

BATCHES = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
LENGTHS = [4, 6, 8, 10, 12, 14, 16, 18, 20, 22]
POLICIES: tuple[bool | None, ...] = (False, None, True)


def model_for(name: str, dim: str) -> tuple[torch.nn.Module, Callable[[int], dict[str, Any]]]:
    """The model (positions for the longest length) and the inputs of each size."""
    spec = hf.HF_MODELS[name]
    base = spec.sizes(True)
    torch.manual_seed(0)
    config = spec.config(dataclasses.replace(base, seq=max(LENGTHS)) if dim == "seq" else base)
    config._attn_implementation = hf.ATTENTION
    model = getattr(hf._transformers(), spec.model_class)(config).eval()

    def inputs(n: int) -> dict[str, Any]:
        torch.manual_seed(n)
        return spec.inputs(dataclasses.replace(base, **{dim: n}))

    return model, inputs


def sweep(call: Callable[..., Any], made: list[dict[str, Any]], rounds: int) -> tuple[float, float]:
    """Seconds of the first pass over the sizes (compiles included), then the median over
    ``rounds`` passes of the mean seconds per call."""
    start = time.perf_counter()
    with torch.no_grad():
        for inputs in made:
            call(**inputs)
        first = time.perf_counter() - start
        per_call = []
        for _ in range(rounds):
            start = time.perf_counter()
            for inputs in made:
                call(**inputs)
            per_call.append((time.perf_counter() - start) / len(made))
    return first, statistics.median(per_call)


def graphs_of_torch() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def run(name: str, dim: str, backend: str, rounds: int) -> None:
    model, inputs = model_for(name, dim)
    made = [inputs(n) for n in (BATCHES if dim == "batch" else LENGTHS)]
    _, eager_s = sweep(model, made, rounds)
    print(f"\n{name}, {dim} sweep of {len(made)} sizes, backend {backend}")
    head = ("graphs", "sweep s", "us/call", "x eager", "x torch")
    print(f"  {'configuration':<28}" + "".join(f"{h:>9}" for h in head))
    print(f"  {'eager':<28}{'-':>9}{'-':>9}{eager_s * 1e6:>9.0f}{1:>9.2f}")
    for dynamic in POLICIES:
        import torch._dynamo

        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()  # graphs are counted from here
        torch._dynamo.config.cache_size_limit = 64
        peer = torch.compile(model, backend=backend, dynamic=dynamic)
        torch_first, torch_s = sweep(peer, made, rounds)
        torch_graphs = graphs_of_torch()
        ember.compiler.reset()
        with ember.compiler.config.patch({"guards.cache_size_limit": 64}):
            mine = ember.compiler.compile(model, backend=backend, dynamic=dynamic)
            first, ember_s = sweep(mine, made, rounds)
        rows = [
            (f"ember dynamic={dynamic}", mine.stats.graphs, first, ember_s, ember_s / torch_s),
            (f"torch.compile dynamic={dynamic}", torch_graphs, torch_first, torch_s, 1.0),
        ]
        for label, graphs, seconds, per, vs_torch in rows:
            print(
                f"  {label:<28}{graphs:>9}{seconds:>9.2f}{per * 1e6:>9.0f}"
                f"{per / eager_s:>9.2f}{vs_torch:>9.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one model, few rounds")
    parser.add_argument("--backend", default="aot_eager", help="the backend both compilers use")
    parser.add_argument("--models", default="gpt2,bert,llama")
    args = parser.parse_args()
    if (missing := hf.missing()) is not None:
        sys.exit(missing)
    torch.set_num_threads(1)
    names = ["gpt2"] if args.quick else args.models.split(",")
    print(f"torch {torch.__version__}, 1 thread; backend {args.backend}")
    for name in names:
        for dim in ("batch", "seq"):
            run(name, dim, args.backend, 3 if args.quick else 9)


if __name__ == "__main__":
    main()
