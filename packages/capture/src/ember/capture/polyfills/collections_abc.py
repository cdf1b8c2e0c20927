"""``collections.abc`` mixin methods whose CPython versions catch exceptions."""

from __future__ import annotations

import collections.abc
from typing import Any

from ember.capture.polyfills import polyfill


@polyfill(collections.abc.Mapping.get)
def mapping_get(self: Any, key: Any, default: Any = None) -> Any:
    # CPython: try: return self[key] except KeyError: return default. The same for any
    # mapping whose __contains__ agrees with its __getitem__, as Mapping's own does.
    if key in self:
        return self[key]
    return default


@polyfill(collections.abc.Sequence.__iter__)
def sequence_iter(self: Any) -> Any:
    # CPython indexes until __getitem__ raises IndexError; a Sequence's __len__ says where
    # that is (both are the abstract methods every Sequence defines).
    i, n = 0, len(self)
    while i < n:
        yield self[i]
        i += 1
