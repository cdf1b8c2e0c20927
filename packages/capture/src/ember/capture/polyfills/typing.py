"""``typing``'s runtime helpers, as traced code sees them.

``typing.cast`` is an identity function that type checkers read: library code calls it
on hot paths (every ``torch.optim`` step starts with ``self = cast(Optimizer, self)``).
Run natively it would end the graph, so it is written here as what it does at runtime.

>>> cast(int, "not checked")
'not checked'
"""

from __future__ import annotations

import typing
from typing import Any

from ember.capture.polyfills import polyfill


@polyfill(typing.cast)
def cast(typ: Any, val: Any) -> Any:
    return val
