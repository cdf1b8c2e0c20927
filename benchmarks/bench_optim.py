"""One AdamW step over the GPT workload's parameters: ember vs eager and torch.compile.

Every configuration gets its own copy of the parameters and gradients and its own
optimizer; the configurations are timed in one process, interleaved round by round
(``--rounds`` rounds of ``--steps`` steps each), with one thread, in CPU time of this
thread (``time.thread_time``: other processes on a shared machine do not count).
Prints best and median ms/step per configuration (docs/training.md, "How fast").

    python benchmarks/bench_optim.py --rounds 9 --steps 5
    python benchmarks/bench_optim.py --configs eager-fused,ember-inductor-single \
        --wrappers twin,main

``--wrappers`` adds, for each ember configuration, rows of the same configuration (its
own parameters, state and compiled step, like every row) with its inductor wrapper bound
another way, timed in the same rounds: ``twin`` (the Python twins of the C++ launcher,
as where ``ember.inductor._launch`` is not built) and any git ref (the wrapper that ref's
``inductor/wrapper.py`` generates for the same schedule and kernels: the wrapper before a
change). The graph cache is then off, so that every schedule is at hand. With
``--same-step`` those rows run their configuration's step itself (same parameters and
state: the rows differ in the wrapper only, and find the same data in the cache).
Each round runs the rows in another (seeded, random) order, so no row always follows the
same one.

``--before REF`` adds, for each ember configuration, a row ``[before REF]`` as the step was
before the change of issue 21 that cut its runtime's bookkeeping: traced without the
polyfill of ``torch.optim``'s ``_stack_if_compiling`` (the foreach form's step sizes
stacked again) and called through REF's ``aotgraph/runtime.py`` ``_run_replaying`` (the
version counters read and set one tensor at a time). Its optimizer is an ``AdamW``
subclass, so the other rows' graphs fail its guards and it gets a graph of its own.

    python benchmarks/bench_optim.py --configs eager-fused,ember-inductor-single,\
        ember-inductor-foreach --before main --rounds 41 --steps 3
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import random
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from ember.aotgraph.runtime import Runtime

sys.path.insert(0, str(Path(__file__).parent))
from workloads import FAMILIES
from wrapper_variants import rebind, watch_wrappers

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


class _AdamWBefore(torch.optim.AdamW):
    """AdamW under another type (``--before``): the guards of the other rows' graphs check
    the optimizer's type, so its step is compiled apart."""


Make = Callable[[list[torch.nn.Parameter]], Step]


def _configs(which: list[str], before: bool = False) -> dict[str, Make]:
    def eager(**kw: object) -> Make:
        return lambda ps: torch.optim.AdamW(ps, lr=1e-3, **kw).step  # type: ignore[arg-type]

    def ember(foreach: bool) -> Make:
        def make(ps: list[torch.nn.Parameter]) -> Step:
            import ember.compiler

            kind = _AdamWBefore if before else torch.optim.AdamW
            opt = kind(ps, lr=1e-3, foreach=foreach)
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


def _runtime_at(ref: str) -> Callable[..., object]:
    """``Runtime._run_replaying`` as ``ref``'s ``aotgraph/runtime.py`` writes it."""
    text = subprocess.run(
        ["git", "show", f"{ref}:packages/aotgraph/src/ember/aotgraph/runtime.py"],
        capture_output=True, text=True, check=True, cwd=Path(__file__).parent,
    ).stdout  # fmt: skip
    module = types.ModuleType(f"runtime_at_{ref}")
    sys.modules[module.__name__] = module  # its dataclasses look their module up
    exec(compile(text, f"runtime.py at {ref}", "exec"), module.__dict__)
    run: Callable[..., object] = module.Runtime._run_replaying
    return run


@contextlib.contextmanager
def _stacked() -> Iterator[None]:
    """Steps traced here stack the step sizes again (no ``_stack_if_compiling`` polyfill)."""
    from torch.optim.optimizer import _stack_if_compiling

    from ember.capture import polyfills

    polyfills.lookup(_stack_if_compiling)  # every polyfill registered: none comes back later
    saved = polyfills.POLYFILLS.pop(_stack_if_compiling, None)
    try:
        yield
    finally:
        if saved is not None:
            polyfills.POLYFILLS[_stack_if_compiling] = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument(
        "--configs",
        default="eager-foreach,eager-fused,torch.compile-foreach,"
        "ember-inductor-foreach,ember-inductor-single",
    )
    parser.add_argument("--wrappers", default="", help="twin and/or git refs, comma-separated")
    parser.add_argument(
        "--same-step", action="store_true", help="--wrappers rows share their config's step"
    )
    parser.add_argument("--before", default="", help="a git ref: rows as the step was there")
    args = parser.parse_args()
    torch.set_num_threads(1)
    wrappers = [w for w in args.wrappers.split(",") if w]
    seen = watch_wrappers() if wrappers else []
    base = _params()
    steps: dict[str, tuple[Step, str]] = {}  # name -> (step, how its wrappers are bound)
    for name, make in _configs(args.configs.split(",")).items():
        step = None
        for how in ["", *wrappers] if name.startswith("ember") else [""]:
            if step is None or not args.same_step:
                step = make(_fresh(base))
                for _ in range(3):  # lazy state, compile, first run of the compiled step
                    step()
            steps[f"{name} [{how}]" if how else name] = step, how
    replaying = {name: Runtime._run_replaying for name in steps}
    if args.before:
        old = _runtime_at(args.before)
        for name, make in _configs(args.configs.split(","), before=True).items():
            if name.startswith("ember"):
                with _stacked():
                    step = make(_fresh(base))
                    for _ in range(3):
                        step()
                row = f"{name} [before {args.before}]"
                steps[row], replaying[row] = (step, ""), old
    # a later optimizer's step may run an earlier one's graph (its guards pass): every
    # graph is rebound before each row, not only those compiled for the row
    bound = {"": [s.call for s in seen]}
    bound |= {how: [rebind(s, how) for s in seen] for how in wrappers}
    times: dict[str, list[float]] = {k: [] for k in steps}
    names, shuffle = list(steps), random.Random(0).shuffle
    for _ in range(args.rounds):
        # rows in another order each round: no row always runs after the same one (whose
        # data it would find in the cache, or have evicted)
        shuffle(names)
        for name in names:
            step, how = steps[name]
            for switch, call in zip(seen, bound[how], strict=True):
                switch.call = call
            Runtime._run_replaying = replaying[name]  # type: ignore[method-assign]
            start = time.thread_time()
            for _ in range(args.steps):
                step()
            times[name].append((time.thread_time() - start) / args.steps * 1e3)
    print(f"{'config':42} best ms  median ms  (thread time, {args.rounds}x{args.steps} steps)")
    for name, ts in times.items():
        print(f"{name:42} {min(ts):7.2f}  {statistics.median(ts):9.2f}")


if __name__ == "__main__":
    main()
