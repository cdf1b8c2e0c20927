"""Orders of graph nodes: each node after what it needs.

A small module of its own, without torch: ember.inductor's demand order imports it
alongside the partitioner's late order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["place_after_needs"]

T = TypeVar("T")


def place_after_needs(
    root: T, needs: Callable[[T], Sequence[T]], placed: set[T], order: list[T]
) -> None:
    """Append ``root`` to ``order`` after whatever it ``needs`` that is not ``placed`` yet,
    depth first, in the order ``needs`` gives (a stack, not recursion: graphs run to
    thousands of nodes). Shared by the partitioner's ``late_order`` and ember.inductor's
    demand order.

    >>> order: list[str] = []
    >>> place_after_needs("c", {"a": [], "b": ["a"], "c": ["b", "a"]}.__getitem__, set(), order)
    >>> order
    ['a', 'b', 'c']
    """
    stack = [(root, False)]
    while stack:
        node, ready = stack.pop()
        if node in placed:
            continue
        if ready:
            placed.add(node)
            order.append(node)
            continue
        stack.append((node, True))
        stack += [(n, False) for n in reversed(needs(node)) if n not in placed]
