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
Records of both printers are read back by :func:`ember.inductor.compiled.from_record`.

>>> from ember.inductor.wrapper_triton import Target
>>> graph_key(None, Target("triton", "cpu", "")) is None  # graph_cache=False: no record
True
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch.fx

from ember.inductor.wrapper_triton import Target, _interpreting, _triton, module_key

__all__ = ["graph_key", "module_of"]


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
