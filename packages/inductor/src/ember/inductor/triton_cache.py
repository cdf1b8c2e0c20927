"""The graph cache for Triton graphs: a graph seen before, in any process, skips lowering,
scheduling and printing, and imports its cached Triton module.

The record is the C++ path's (:mod:`ember.inductor.graph_cache`: the wrapper's source, the
kernels' arguments, the constants, the output structure), with ``module``, the key of the
Triton module (``<cache>/triton/<key[:2]>/<key>.py``) in place of the C++ library's. The
graph key adds the printer, the device type, triton's version and whether Triton
interprets, so a record made under the interpreter never serves a GPU and one made for
triton 3.9 never serves 3.10. Triton keeps its own builds (``TRITON_CACHE_DIR``): a warm
process does no lowering and no printing, and Triton loads each kernel's build on its first
launch. A record whose module is gone or lacks a launcher misses, and the graph compiles.

>>> from ember.inductor.wrapper_triton import Target
>>> graph_key(None, Target("triton", "cpu", "")) is None  # graph_cache=False: no record
True
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch.fx
from torch.utils import _pytree as pytree

from ember.inductor import graph_cache
from ember.inductor.wrapper import bind
from ember.inductor.wrapper_triton import Target, _interpreting, _triton, load_module, module_key

__all__ = ["from_record", "graph_key", "module_of"]


def graph_key(key: str | None, target: Target) -> str | None:
    """The graph-cache key of a Triton graph, from the C++ path's ``key`` (None: not cached)."""
    triton = _triton()
    if key is None or triton is None:
        return None
    device = torch.device(target.device).type
    where = f"{target.printer} {device} triton {triton.__version__} {_interpreting(triton)}"
    return hashlib.sha256(f"{key} {where}".encode()).hexdigest()


def module_of(compiled: Any) -> str | None:
    """The key of a compiled graph's Triton module for its record (None: a C++ graph)."""
    if compiled.target is None or compiled.source is None:
        return None
    return module_key(compiled.source)


def from_record(gm: torch.fx.GraphModule, record: dict[str, Any], run: Any, target: Target) -> Any:
    """A ready ``CompiledGraph`` from a graph-cache record, or None if its parts are gone.
    Its first call goes through ``CompiledGraph._first_triton_call`` (a kernel Triton fails
    to build then runs the graph as aten calls), as a fresh compile's does."""
    from ember.inductor.compile import CompiledGraph

    module = record.get("module")
    kernels = None if module is None else load_module(module, list(record["kernel_args"]))
    if kernels is None:
        return None
    try:
        consts = {n: graph_cache.decode(v, gm) for n, v in record["consts"].items()}
    except (graph_cache.Unencodable, AttributeError):
        return None
    spec = None if record["spec"] is None else pytree.treespec_loads(record["spec"])
    compiled = CompiledGraph(gm, run, spec)
    compiled.kernel_args, compiled.wrapper = record["kernel_args"], record["wrapper"]
    compiled.cache_hit, compiled.target, compiled._kernels = True, target, kernels
    call = bind(record["wrapper"], consts, record["kernel_args"], None, kernels, target.device)
    compiled._call = _first_call(compiled, call)
    run.write("06_wrapper.py", compiled.wrapper + "\n# from the graph cache\n")
    return compiled


def _first_call(compiled: Any, call: Callable[..., Any]) -> Callable[..., Any]:
    def first(*args: Any) -> Any:
        compiled._call = call  # from now on, the wrapper itself
        return compiled._first_triton_call(args)

    return first
