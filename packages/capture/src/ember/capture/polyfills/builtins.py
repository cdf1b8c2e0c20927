"""Lazy builtins over generators, as plain Python the translator steps through.

``enumerate``, ``zip``, ``map`` and ``filter`` of a generator ember runs are generators of
their own here, so the generator is resumed one item at a time, as CPython resumes it:
its side effects interleave with the loop's, and it is not run past what is consumed.

>>> list(zip_([1, 2], "ab"))
[(1, 'a'), (2, 'b')]
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def enumerate_(iterable: Any, start: int = 0) -> Iterator[tuple[int, Any]]:
    n = start
    for item in iterable:
        yield n, item
        n += 1


def zip_(*iterables: Any, strict: bool = False) -> Iterator[tuple[Any, ...]]:
    # (one function: a polyfill's own module-level helpers would not be traced)
    iterators = [iter(it) for it in iterables]
    while iterators:
        row = []
        for i, it in enumerate(iterators):
            try:
                row.append(next(it))
            except StopIteration:
                if not strict:
                    return
                if i:  # the errors CPython's zip(strict=True) raises
                    plural = " " if i == 1 else "s 1-"
                    raise ValueError(
                        f"zip() argument {i + 1} is shorter than argument{plural}{i}"
                    ) from None
                for j, rest in enumerate(iterators[1:], 1):
                    for _ in rest:
                        plural = " " if j == 1 else "s 1-"
                        raise ValueError(
                            f"zip() argument {j + 1} is longer than argument{plural}{j}"
                        ) from None
                return
        yield tuple(row)


def map_(fn: Any, *iterables: Any) -> Iterator[Any]:
    for args in zip_(*iterables):
        yield fn(*args)


def filter_(fn: Any, iterable: Any) -> Iterator[Any]:
    for item in iterable:
        if item if fn is None else fn(item):
            yield item


LAZY = {enumerate: enumerate_, zip: zip_, map: map_, filter: filter_}
