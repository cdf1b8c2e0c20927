"""ember.guards: decide, on every call, whether a cached translation still applies.

A *source* names how a value is reached from a frame (``x``,
``self.layers[0].weight``, ``G['config'].eps``). A *guard* is a source, a
kind and an expected value. A :class:`GuardSet` deduplicates and orders its
guards and compiles them into one check over the frame's argument slots,
which can also say in words why it failed. A :class:`CodeCache` keeps the
translations of one code object and decides when to recompile and when to
give up.

>>> import torch
>>> from ember.guards import (FrameSpec, GuardSet, Local, backend, backend_scope,
...                           equals, global_state, tensor_match)
>>> def scale(x, k):
...     return x * k
>>> guards = GuardSet([
...     tensor_match(Local("x"), torch.zeros(8, 4), where="demo.py:2"),
...     equals(Local("k"), 2, where="demo.py:2"),
...     *global_state(),
...     backend("eager"),
... ])
>>> print(guards)
GuardSet of 10 guards:
  BACKEND       backend == 'eager'
  GLOBAL_STATE  grad mode == enabled
  GLOBAL_STATE  inference mode == disabled
  GLOBAL_STATE  autocast == disabled
  GLOBAL_STATE  default dtype == torch.float32
  GLOBAL_STATE  deterministic algorithms == disabled
  GLOBAL_STATE  torch function == enabled, no modes
  GLOBAL_STATE  global module hooks == no global module hooks
  EQUALS        k == 2  # demo.py:2
  TENSOR_MATCH  x: Tensor(torch.float32, cpu, size=(8, 4), stride=(4, 1))  # demo.py:2
>>> compiled = guards.compile(FrameSpec.from_function(scale))
>>> with backend_scope("eager"):
...     compiled.check(torch.ones(8, 4), 2), compiled.check(torch.ones(12, 4), 2)
(True, False)
>>> with backend_scope("eager"):
...     compiled.explain_failure(torch.ones(12, 4), 2)
'x: size[0] expected 8, got 12'
>>> with backend_scope("eager"), torch.no_grad():
...     compiled.explain_failure(torch.ones(8, 4), 2)
'grad mode: expected enabled, got disabled'
>>> compiled.explain_failure(torch.ones(8, 4), 2)
"backend: expected 'eager', got None"

``compiled.check`` is what ``ember.capture`` stores per code object; it takes
exactly the frame's argument slots and never raises. Tensor and module
checks run in a small C extension when it is built (:data:`NATIVE`).
"""

import sys
import types

from ember.guards import settings
from ember.guards._accel import NATIVE, TENSOR_MATCH_CXX
from ember.guards.cache import (
    CacheEntry,
    CacheLimitWarning,
    CodeCache,
    Decision,
    RecompileReason,
    all_caches,
    code_name,
    recompile_reasons,
    reset,
)
from ember.guards.frame import FrameSpec, arg_count
from ember.guards.guardset import CompiledGuards, GuardSet
from ember.guards.kinds import (
    KINDS,
    Guard,
    GuardKind,
    KindRule,
    WeakIdentity,
    backend,
    dict_keys,
    equals,
    global_state,
    id_match,
    is_none,
    length,
    module_state,
    no_aliasing,
    not_none,
    same_tensor,
    shape_relation,
    storage_aliasing,
    tensor_match,
    type_match,
    weakref_alive,
)
from ember.guards.relations import ShapeRelation
from ember.guards.sources import (
    BUFFERS,
    MODULES,
    PARAMETERS,
    Attr,
    Backend,
    Cell,
    Computed,
    Default,
    DictItem,
    GenericAttr,
    Global,
    Item,
    Local,
    ModuleChild,
    ModuleGlobal,
    Source,
    TensorAttr,
    TensorSize,
    TensorStride,
    TorchState,
    TypeOf,
    read_module_global,
)
from ember.guards.specs import ModuleSpec, TensorSpec
from ember.guards.state import (
    STATE_FIELDS,
    StateField,
    backend_scope,
    current_backend,
    reset_backend,
    set_backend,
)

__version__ = "0.1.0"

__all__ = [
    "BUFFERS",
    "KINDS",
    "MODULES",
    "NATIVE",
    "PARAMETERS",
    "STATE_FIELDS",
    "TENSOR_MATCH_CXX",
    "Attr",
    "Backend",
    "CacheEntry",
    "CacheLimitWarning",
    "Cell",
    "CodeCache",
    "CompiledGuards",
    "Computed",
    "Decision",
    "Default",
    "DictItem",
    "FrameSpec",
    "GenericAttr",
    "Global",
    "Guard",
    "GuardKind",
    "GuardSet",
    "Item",
    "KindRule",
    "Local",
    "ModuleChild",
    "ModuleGlobal",
    "ModuleSpec",
    "RecompileReason",
    "ShapeRelation",
    "Source",
    "StateField",
    "TensorAttr",
    "TensorSize",
    "TensorSpec",
    "TensorStride",
    "TorchState",
    "TypeOf",
    "WeakIdentity",
    "__version__",
    "all_caches",
    "arg_count",
    "backend",
    "backend_scope",
    "code_name",
    "current_backend",
    "dict_keys",
    "equals",
    "global_state",
    "id_match",
    "is_none",
    "length",
    "module_state",
    "no_aliasing",
    "not_none",
    "read_module_global",
    "recompile_reasons",
    "reset",
    "reset_backend",
    "same_tensor",
    "set_backend",
    "shape_relation",
    "storage_aliasing",
    "tensor_match",
    "type_match",
    "weakref_alive",
]


class _GuardsModule(types.ModuleType):
    """``ember.guards`` itself: ``DEFAULT_CACHE_SIZE_LIMIT`` is a view of the
    ``cache_size_limit`` setting, so setting it takes effect (it used to change nothing)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name == "DEFAULT_CACHE_SIZE_LIMIT":
            settings.section.set(cache_size_limit=value)
        else:
            super().__setattr__(name, value)


def __getattr__(name: str) -> object:
    """``DEFAULT_CACHE_SIZE_LIMIT``: the ``cache_size_limit`` setting in effect.

    >>> import ember.guards
    >>> ember.guards.DEFAULT_CACHE_SIZE_LIMIT
    8
    """
    if name == "DEFAULT_CACHE_SIZE_LIMIT":
        return settings.section.get().cache_size_limit
    raise AttributeError(f"module 'ember.guards' has no attribute {name!r}")


sys.modules[__name__].__class__ = _GuardsModule
