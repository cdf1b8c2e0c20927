"""Triton kernels built in the background: while a worker thread builds a graph's kernels,
the graph's calls run as aten calls, and the kernels take over once they are built.

Why. Triton builds a kernel on its first launch: its compiler, ``ptxas``, and for a kernel
signature it has not seen a C launcher that ``gcc`` builds. On an H200 (Triton 3.6) that is
0.3-0.6 s for one softmax kernel, 0.2 s of it the launcher, against 0.03 s for ember's own
lowering and code generation (``benchmarks/gpu_check.py --profile``). A user waits for all of
it on the first call, once per graph. Here the first call instead runs the graph as aten calls
(eager's speed, eager's numbers) and hands the build to a worker, and graphs of one program
build side by side (Triton's compiler drops the GIL in ``ptxas`` and ``gcc``).

How. :func:`start` makes the graph's compiled call on a worker thread, with the caller's
arguments and on the caller's CUDA stream, and drops its outputs: launching each kernel
once is what builds it. Until that call returns, :class:`~ember.inductor.compiled.CompiledGraph`
answers with aten calls; then with its kernels. A build that raises is the first call's
failure as before (``ember.inductor: a Triton kernel failed to build, running eagerly``).
:func:`ember.inductor.cache.wait_for_builds` waits for these builds too: a benchmark calls it
before it times the kernels.

When not (:func:`refusal` says why, and the graph builds on its first call as before):
- the setting ``inductor.background_compile`` is ``"off"``; ``"cuda"`` (the default) is CUDA
  graphs only, ``"always"`` also Triton under its interpreter (how the tests check the
  mechanism on a CPU);
- the graph writes into its inputs or draws random numbers: the worker's call would write a
  second time, or move the generator past eager's numbers;
- a CUDA graph is being captured (:func:`capturing`): a call then waits for the build, and
  ``ember.aotgraph.cudagraphs`` waits before it records (``wait_compiled``), so a recording
  holds the kernels, never the aten calls.

>>> refusal(torch.fx.symbolic_trace(lambda x: x + 1), "cuda:0", "cuda")
>>> refusal(torch.fx.symbolic_trace(lambda x: x + 1), "cpu", "cuda")
'background builds are for CUDA graphs (setting background_compile=cuda)'
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.fx

from ember.inductor import cache

__all__ = ["MODES", "capturing", "refusal", "start"]

MODES = ("off", "cuda", "always")  # the values of the setting inductor.background_compile

# Graphs of one program build side by side; a few workers are enough to keep ptxas and gcc
# (subprocesses, the GIL released) busy while Triton's front end (Python) takes turns.
_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ember-triton")


def refusal(gm: torch.fx.GraphModule, device: str, mode: str) -> str | None:
    """Why ``gm``'s kernels must build on its first call instead (None: they may build in
    the background)."""
    if mode not in MODES:
        raise ValueError(f"background_compile={mode!r}: choose one of {MODES}")
    if mode == "off":
        return "the setting background_compile is off"
    if mode == "cuda" and not device.startswith("cuda"):
        return "background builds are for CUDA graphs (setting background_compile=cuda)"
    from ember.aotgraph.hints import input_updates

    if input_updates(gm):
        return "the graph writes into its inputs"
    for node in gm.graph.nodes:
        target = node.target
        if not isinstance(target, torch._ops.OpOverload):
            continue
        if target._schema.is_mutable:
            return f"{node.name} ({target}) writes into a tensor"
        if torch.Tag.nondeterministic_seeded in target.tags:
            return f"{node.name} ({target}) draws random numbers"
    return None


def capturing() -> bool:
    """Whether the current CUDA stream is recording a CUDA graph (never on a CPU build)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def start(call: Callable[..., Any], args: tuple[Any, ...], device: str) -> Future[None]:
    """Build ``call``'s kernels on a worker: call it once with ``args`` on the caller's
    stream of ``device`` (CUDA) and drop the outputs. The future is counted by
    :func:`ember.inductor.cache.wait_for_builds`."""
    stream = torch.cuda.current_stream(device) if device.startswith("cuda") else None
    future = _POOL.submit(_build, call, args, stream)
    cache.track(future)
    return future


def _build(call: Callable[..., Any], args: tuple[Any, ...], stream: Any) -> None:
    with torch.no_grad():
        if stream is None:
            call(*args)
            return
        with torch.cuda.stream(stream):
            call(*args)
