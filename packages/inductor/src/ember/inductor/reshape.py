"""Index maps between two shapes of the same elements (views, and kernels whose loops cut
a node's rows differently).

>>> k = sympy.Symbol("ks0", integer=True, positive=True)
>>> unflatten(flatten(I[:2], (4 * k, 8)), (k, 4, 8))[0]
Mod(floor(i0/4 + i1/32), ks0)
>>> reshape_index(I[:2], (4 * k, 8), (k, 4, 8))[0]
floor(i0/4)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy  # type: ignore[import-untyped]

from ember.inductor.ir import I  # noqa: F401  (the doctests)

__all__ = ["flatten", "reshape_index", "unflatten"]


def reshape_index(
    idx: Sequence[sympy.Expr], sizes: Sequence[Any], old: Sequence[Any]
) -> list[sympy.Expr]:
    """The index into ``old`` sizes of point ``idx`` of the same elements seen as ``sizes``
    (row-major). Dimensions are matched in groups of equal size products, so a merge is a
    plain sum and a split one floor and Mod of one variable: ``[ks0*4, 8]`` seen as
    ``[ks0, 4, 8]`` reads ``(floor(i0/4), Mod(i0, 4), i1)`` rather than floor/Mod of the
    whole flat index, which needs the loop bounds (symbolic ones too) to simplify.

    >>> k = sympy.Symbol("ks0", integer=True, positive=True)
    >>> reshape_index(I[:2], (4 * k, 8), (k, 4, 8))
    [floor(i0/4), Mod(i0, 4), i1]
    >>> reshape_index(I[:3], (k, 4, 8), (4 * k, 8))
    [4*i0 + i1, i2]
    """
    groups = _groups(sizes, old)
    if groups is None:
        return unflatten(flatten(idx, sizes), old)
    out: list[sympy.Expr] = []
    for new_dims, old_dims in groups:
        flat = flatten([idx[d] for d in new_dims], [sizes[d] for d in new_dims])
        out += unflatten(flat, [old[d] for d in old_dims], bounded=True)
    return out


def _groups(sizes: Sequence[Any], old: Sequence[Any]) -> list[tuple[list[int], list[int]]] | None:
    """Runs of dimensions of ``sizes`` and of ``old`` with equal products, in order, or None
    when no such grouping is found. Trailing size-1 dimensions join the last group."""
    if 0 in sizes or 0 in old:
        return None
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while any(n != 1 for n in sizes[i:]) or any(n != 1 for n in old[j:]):
        group, i, j = _group(sizes, old, i, j)
        if group is None:
            return None
        groups.append(group)
    if not groups:
        return None
    groups[-1][0].extend(range(i, len(sizes)))
    groups[-1][1].extend(range(j, len(old)))
    return groups


def _group(
    sizes: Sequence[Any], old: Sequence[Any], i: int, j: int
) -> tuple[tuple[list[int], list[int]] | None, int, int]:
    """The next group from ``sizes[i:]`` and ``old[j:]``: take a dimension from the side
    whose product is a proper factor of the other's until the products are equal."""
    new_dims: list[int] = []
    old_dims: list[int] = []
    a = b = sympy.Integer(1)
    while not (new_dims and old_dims and _same(a, b)):
        take_new = i < len(sizes) and (j >= len(old) or _divides(a, b, new_dims, old_dims))
        if take_new:
            a, i = a * sizes[i], i + 1
            new_dims.append(i - 1)
        elif j < len(old):
            b, j = b * old[j], j + 1
            old_dims.append(j - 1)
        else:
            return None, i, j
    return (new_dims, old_dims), i, j


def _same(a: Any, b: Any) -> bool:
    return bool(sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0)


def _divides(a: Any, b: Any, new_dims: list[int], old_dims: list[int]) -> bool:
    """Whether the ``new`` side should take its next dimension: it is empty, or its product
    ``a`` is a proper factor of ``b`` (ints: smaller; symbolic: ``b/a`` a polynomial)."""
    if not new_dims:
        return True
    if not old_dims:
        return False
    if isinstance(a, sympy.Integer) and isinstance(b, sympy.Integer):
        return bool(a < b)
    q = sympy.cancel(sympy.sympify(b) / a)
    return bool(sympy.fraction(q)[1] == 1)


def flatten(idx: Sequence[sympy.Expr], sizes: Sequence[int]) -> sympy.Expr:
    """The row-major flat index of point ``idx`` of ``sizes`` (a size-1 dimension's index is
    0: left out)."""
    flat, step = sympy.Integer(0), 1
    for i, n in zip(reversed(idx), reversed(sizes), strict=True):
        flat += 0 if n == 1 else i * step
        step *= n
    return flat


def unflatten(flat: sympy.Expr, sizes: Sequence[int], bounded: bool = False) -> list[sympy.Expr]:
    """Point ``flat`` of ``sizes`` (row-major); ``bounded``: ``flat`` is known to be below
    their product, so the first index needs no Mod."""
    if 0 in sizes:  # nothing is ever loaded from an empty tensor
        return [sympy.Integer(0)] * len(sizes)
    out, step = [], 1
    for d in reversed(range(len(sizes))):
        n = sizes[d]
        whole = sympy.floor(flat / step)
        out.append(
            sympy.Integer(0) if n == 1 else whole if bounded and d == 0 else sympy.Mod(whole, n)
        )
        step *= n
    return list(reversed(out))
