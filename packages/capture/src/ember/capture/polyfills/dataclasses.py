"""``dataclasses`` introspection, as plain Python over the class's own records."""

from __future__ import annotations

import dataclasses
from typing import Any

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
