"""ember's demo: compile a real transformers model and the model zoo, show what was captured.

    python3 -m nox -s demo            # or: python benchmarks/demo.py [--backend inductor]

First a tiny random-init HuggingFace model (``--hf``, default GPT-2 with its
LM head, inference; ``benchmarks/models/hf.py``), then each model of
``benchmarks/models``. For each: graphs captured, graph breaks, ops in the
graphs, guards protecting them, frames that ran eagerly (with the reason),
compile time of the first call, and the steady-state time of a compiled call
against the same call in eager PyTorch (median of repeated timings, one
thread). It prints what happened, whatever it was: if ember breaks the graph
or falls back to running frames eagerly, the row says so, and an error from
ember is printed in place of the row. It also prints the graph and the guards
of one model, so you can see what ember captured.
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
from models.hf import HF_MODELS, missing

import ember.compiler

HEADER = (
    f"{'model':<20}{'graphs':>7}{'breaks':>7}{'ops':>6}{'guards':>8}{'compile s':>11}"
    f"{'eager ms':>10}{'ember ms':>10}{'ratio':>8}  ran eagerly / broke"
)


def median_seconds(fn: Callable[[], Any], repeats: int, number: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
    return statistics.median(samples)


def row(
    name: str, model: Any, call: Callable[[Any], Any], backend: str, timing: tuple[int, int]
) -> Any:
    """Compile ``model``, time its first call and steady state against eager; print one row.

    ``call(m)`` runs a model on the inputs. Returns the compiled model (its ``stats``).
    """
    eager_model = copy.deepcopy(model)
    compiled = ember.compiler.compile(model, backend=backend)
    with torch.no_grad():
        start = time.perf_counter()
        call(compiled)
        compile_s = time.perf_counter() - start
        eager_t = median_seconds(lambda: call(eager_model), *timing)
        ember_t = median_seconds(lambda: call(compiled), *timing)
    stats = compiled.stats
    ops = sum(c.ops for c in stats.compiled)
    guards = sum(len(c.guards.guards) for c in stats.compiled)
    said = [f"{f.reason} ({f.location.splitlines()[0]})" for f in stats.failures]
    said += [f"break: {f.reason} ({f.location.splitlines()[0]})" for f in stats.breaks]
    print(
        f"{name:<20}{stats.graphs:>7}{len(stats.breaks):>7}{ops:>6}{guards:>8}{compile_s:>11.2f}"
        f"{eager_t * 1e3:>10.3f}{ember_t * 1e3:>10.3f}{ember_t / eager_t:>8.2f}"
        f"  {'; '.join(dict.fromkeys(said)) or '-'}"
    )
    return compiled


def real_model(name: str, backend: str, timing: tuple[int, int]) -> None:
    """The transformers model ``name`` of models/hf.py, inference, as one row (or why not)."""
    reason = missing()
    if reason:
        print(f"{'hf-' + name:<20}skipped: {reason}")
        return
    hf = HF_MODELS[name]
    model, inputs = hf.make()
    model.eval()
    try:
        row(f"hf-{name}", model, lambda m: m(**inputs), backend, timing)
    except Exception as error:  # ember under test: say what failed and go on with the zoo
        first = (str(error).splitlines() or [""])[0]
        print(f"{'hf-' + name:<20}ember raised {type(error).__name__}: {first}")
    finally:
        ember.compiler.reset()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="inductor", help="a registered ember backend")
    parser.add_argument("--show", default="transformer-block", help="model whose graph to print")
    parser.add_argument("--hf", default="gpt2", choices=sorted(HF_MODELS), help="real model")
    parser.add_argument("--quick", action="store_true", help="fewer timing repeats")
    args = parser.parse_args()
    torch.set_num_threads(1)
    timing = (3, 5) if args.quick else (7, 20)
    print(f"ember demo: backend={args.backend}, torch {torch.__version__}, 1 thread\n")
    print(HEADER)
    real_model(args.hf, args.backend, timing)
    shown = None
    for name, case in ZOO.items():
        model, inputs = case.make()
        compiled = row(name, model, lambda m, i=inputs: m(*i), args.backend, timing)
        if name == args.show and compiled.stats.compiled:
            shown = compiled.stats.compiled[0]
        ember.compiler.reset()
    if shown is not None:
        print(f"\nThe graph captured from {args.show} ({shown.code}):")
        print(shown.graph.code.strip())
        print(f"\nIts guards:\n{shown.guards}")


if __name__ == "__main__":
    main()
