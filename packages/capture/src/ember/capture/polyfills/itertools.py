"""``itertools`` as generators the translator steps through.

``itertools.chain`` is a C iterator; library code chains hook tables with it (each
``Optimizer.step`` walks ``chain(global_hooks.values(), self_hooks.values())``). As a
generator here it is resumed one item at a time, as CPython resumes the real one.

>>> list(chain([1, 2], (3,)))
[1, 2, 3]
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from ember.capture.polyfills import polyfill


@polyfill(itertools.chain)
def chain(*iterables: Iterable[Any]) -> Iterator[Any]:
    for iterable in iterables:
        yield from iterable


@polyfill(itertools.chain.from_iterable)
def chain_from_iterable(iterables: Iterable[Iterable[Any]]) -> Iterator[Any]:
    for iterable in iterables:
        yield from iterable
