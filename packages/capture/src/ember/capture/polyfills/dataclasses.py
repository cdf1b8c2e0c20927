"""``dataclasses`` introspection, as plain Python over the class's own records."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from ember.capture.polyfills import polyfill


@polyfill(dataclasses.fields)
def fields(class_or_instance: Any) -> tuple[Any, ...]:
    try:
        found = class_or_instance.__dataclass_fields__
    except AttributeError:
        raise TypeError("must be called with a dataclass type or instance") from None
    return tuple(f for f in found.values() if f._field_type is dataclasses._FIELD)  # type: ignore[attr-defined]


@polyfill(dataclasses.is_dataclass)
def is_dataclass(obj: Any) -> bool:
    cls = obj if isinstance(obj, type) else type(obj)
    return hasattr(cls, "__dataclass_fields__")


@polyfill(dataclasses.replace)
def replace(obj: Any, /, **changes: Any) -> Any:
    if isinstance(obj, type) or not hasattr(type(obj), "__dataclass_fields__"):
        raise TypeError("replace() should be called on dataclass instances")
    for f in obj.__dataclass_fields__.values():
        if f._field_type is dataclasses._FIELD_CLASSVAR:  # type: ignore[attr-defined]
            continue
        if not f.init:
            if f.name in changes:
                raise ValueError(
                    f"field {f.name} is declared with init=False, it cannot be specified with "
                    "replace()"
                )
            continue
        if f.name not in changes:
            if (
                f._field_type is dataclasses._FIELD_INITVAR  # type: ignore[attr-defined]
                and f.default is dataclasses.MISSING
            ):
                raise ValueError(f"InitVar {f.name!r} must be specified with replace()")
            changes[f.name] = getattr(obj, f.name)
    return obj.__class__(**changes)


@polyfill(dataclasses.asdict)
def asdict(obj: Any, *, dict_factory: Any = dict) -> Any:
    if isinstance(obj, type) or not hasattr(type(obj), "__dataclass_fields__"):
        raise TypeError("asdict() should be called on dataclass instances")
    return _asdict_inner(obj, dict_factory)


def _asdict_inner(obj: Any, dict_factory: Any) -> Any:
    if hasattr(type(obj), "__dataclass_fields__"):
        return dict_factory(
            [(f.name, _asdict_inner(getattr(obj, f.name), dict_factory)) for f in fields(obj)]
        )
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*[_asdict_inner(v, dict_factory) for v in obj])
    if isinstance(obj, list | tuple):
        return type(obj)([_asdict_inner(v, dict_factory) for v in obj])
    if isinstance(obj, dict):
        return type(obj)(
            (_asdict_inner(k, dict_factory), _asdict_inner(v, dict_factory)) for k, v in obj.items()
        )
    if obj is None or type(obj) in (int, float, bool, str, bytes):
        return obj  # deepcopy returns these themselves
    if isinstance(obj, torch.Tensor) and not obj.requires_grad:
        return obj.clone()  # what deepcopy makes of a tensor outside autograd
    return copy.deepcopy(obj)  # anything else: as CPython does (natively)
