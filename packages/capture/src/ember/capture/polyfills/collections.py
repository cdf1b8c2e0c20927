"""``collections.namedtuple``'s helper methods, as plain Python over the tuple's class.

Every namedtuple class gets its own ``_replace``, ``_asdict`` and ``_make`` functions,
closures of ``collections.namedtuple`` (whose module the trace rules run natively), all
sharing one code object each; the polyfills are keyed by that code, so they stand in for
the methods of every namedtuple class. (``OrderedDict`` and ``defaultdict`` need no
polyfill: they are made in a trace as instances of the C type itself, with their items
in a view, like the user subclasses of dict: ``userobjects.BUILTIN_DICTS``.)
"""

from __future__ import annotations

import collections
from typing import Any

from ember.capture.polyfills import polyfill

# A namedtuple class's own methods, whose code every namedtuple class shares.
_METHODS: dict[str, Any] = dict(vars(collections.namedtuple("_Sample", "a")))


@polyfill(_METHODS["_make"].__func__.__code__)
def _make(cls: Any, iterable: Any) -> Any:
    items = tuple(iterable)  # checked before the namedtuple is made, not after
    if len(items) != len(cls._fields):
        raise TypeError(f"Expected {len(cls._fields)} arguments, got {len(items)}")
    return tuple.__new__(cls, items)


@polyfill(_METHODS["_replace"].__code__)
def _replace(self: Any, /, **kwds: Any) -> Any:
    result = self._make(
        [kwds.pop(name, value) for name, value in zip(self._fields, self, strict=True)]
    )
    if kwds:
        raise ValueError(f"Got unexpected field names: {list(kwds)!r}")
    return result


@polyfill(_METHODS["_asdict"].__code__)
def _asdict(self: Any) -> Any:
    return dict(zip(self._fields, self, strict=True))
