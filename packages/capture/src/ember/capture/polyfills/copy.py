"""``copy.deepcopy`` and ``copy.copy`` of plain data: containers and plain objects.

Library code copies small configuration objects inside a forward (transformers
copies a legacy encoder-decoder config before renaming its fields). The copy is
built of traced values: containers of the copied items, and a new instance of a
plain class whose ``__dict__`` holds copies of the original's attributes. Anything
else (a tensor, a class with ``__deepcopy__``, ``__reduce_ex__`` or slots) is left
to the real function, which the trace rules run natively: a graph break there.
"""

from __future__ import annotations

import copy
import types
from typing import Any

import torch

from ember.capture import markers
from ember.capture.polyfills import polyfill

# Immutable values a deep copy returns as they are (copy._deepcopy_atomic's list).
_ATOMIC = (
    type(None), int, float, bool, complex, bytes, str, types.CodeType, type, range,
    types.BuiltinFunctionType, types.FunctionType, property, torch.dtype, torch.device,
    torch.layout, torch.memory_format,
)  # fmt: skip


@polyfill(copy.deepcopy)
def deepcopy(x: Any, memo: Any = None, _nil: Any = None) -> Any:
    cls = type(x)
    if cls in _ATOMIC or isinstance(x, type):
        return x
    if cls is list:
        return [deepcopy(item) for item in x]
    if cls is tuple:
        return tuple(deepcopy(item) for item in x)
    if cls is dict:
        return {deepcopy(key): deepcopy(value) for key, value in x.items()}
    if cls is set:
        return {deepcopy(item) for item in x}
    if not _plain(cls):
        return copy.deepcopy(x)  # run natively (a graph break): tensors, __deepcopy__, ...
    new = object.__new__(cls)
    for name, value in x.__dict__.items():
        object.__setattr__(new, name, deepcopy(value))
    return new


@polyfill(copy.copy)
def shallowcopy(x: Any) -> Any:
    cls = type(x)
    if cls in _ATOMIC or isinstance(x, type) or cls is tuple:
        return x
    if cls is list:
        return list(x)
    if cls is dict:
        return dict(x)
    if cls is set:
        return set(x)
    if not _plain(cls):
        return copy.copy(x)
    new = object.__new__(cls)
    for name, value in x.__dict__.items():
        object.__setattr__(new, name, value)
    return new


@markers.assume_constant_result  # a fact about the (identity-guarded) class: folded
def _plain(cls: Any) -> bool:
    # A class copy.deepcopy copies through object.__reduce_ex__(4) -> copyreg.__newobj__:
    # no copy hooks of its own, no slots, a __dict__ (instances of it keep their state there).
    hooks = (
        "__deepcopy__",
        "__copy__",
        "__reduce_ex__",
        "__reduce__",
        "__getstate__",
        "__setstate__",
    )
    for klass in cls.__mro__[:-1]:
        for hook in hooks:
            if hook in klass.__dict__:
                return False
        if klass.__dict__.get("__slots__"):
            return False
    return cls.__new__ is object.__new__ and cls.__dictoffset__ != 0
