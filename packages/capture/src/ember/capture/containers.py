"""Container modules (``ModuleList``, ``Sequential``, ``ModuleDict``) read in traced code:
iterated, measured, indexed. Their children are reached through the module's own
``_modules`` dict, and whatever depends on all of them (an iteration, ``len``, a negative
index, a slice) guards the children's names, so a child appended after compiling is seen.
"""

from __future__ import annotations

import torch

from ember.capture import guarding
from ember.capture.builder import wrap
from ember.capture.tracer import FrameState, Unsupported
from ember.capture.values import Const, ModuleV, Value

__all__ = ["guard_children"]


def _module_items(fs: FrameState, v: ModuleV) -> list[Value]:
    m = v.module
    guard_children(fs, v)  # an appended or removed child: another iteration
    if isinstance(m, torch.nn.ModuleDict):
        return [Const(k) for k in m.keys()]
    if isinstance(m, torch.nn.ModuleList | torch.nn.Sequential):
        return [_module_child(fs, v, key) for key in m._modules]
    raise Unsupported(f"iterating over a {type(m).__name__}", "iteration")


def guard_children(fs: FrameState, v: ModuleV) -> None:
    """The container's children keep their names (``_modules``' keys, in order): what
    iterating it, its length, a negative index or a slice read depends on them all, not
    only on the children it reached (``layers.append(...)`` after compiling recompiles)."""
    if v.source is not None:
        fs.tracer.guards.dict_keys(guarding.attr(v.source, "_modules"), v.module._modules)


def _module_child(fs: FrameState, v: ModuleV, key: str) -> Value:
    """A submodule of a container module, reached through the module's own dict."""
    src = guarding.module_child(v.source, key, "_modules") if v.source is not None else None
    return wrap(fs.tracer, v.module._modules[key], src)
