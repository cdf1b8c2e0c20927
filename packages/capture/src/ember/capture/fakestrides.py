"""The output layout torch gives a pointwise op of permuted or sliced fakes, without ``SymNode``s.

torch's fake kernels for pointwise ops (``_prims_common.compute_elementwise_output_strides``
and ``empty_like``'s preserve-format path) order the output's dimensions by the inputs'
strides, broadcast inputs expanded first (a broadcast dimension has stride 0 and is
skipped), then give the output the contiguous strides of that order. Each comparison is a
``guard_or_false`` over ``SymNode``s: sympy, value ranges, about 0.1 ms apiece, and an
op of four dimensions and three inputs makes dozens of them (T5's ``where`` on its
permuted position bias: 214 ``SymNode`` operations a call).

:func:`elementwise_order` runs the same insertion sort on the strides as expressions,
with every comparison decided *for all values of the symbols* by a cheap rule: strides and
sizes here are monomials ``c * s0**a * s1**b ...`` with a positive whole ``c``, and every
symbol is at least 2 (its ``ShapeEnv`` range says so: sizes 0 and 1 specialise), so
``x >= y`` holds for all values when ``x / y`` has no negative exponent and ``c_x * 2**(sum of
exponents) >= c_y``; ``x < y`` likewise the other way. Where a comparison is neither (``s0``
against ``4``), or a value is not such a monomial, it returns None and torch's kernel
runs (which would ask the ``ShapeEnv``, perhaps guard). Where it decides, torch's kernel
reaches the same order: its ``guard_or_false`` answers as the rule does whenever the answer
is the same for every value (it may still record a guard on the way, always true, which the
shortcut does not add).

>>> import sympy
>>> s0, s1 = sympy.symbols("s0 s1", positive=True, integer=True)
>>> ranges = {s0: 2, s1: 2}  # lower bounds
>>> elementwise_order([s0, 4, s1, 16], [[64 * s1, 16, 64, 1]], ranges.get)  # q.transpose(1, 2)
[0, 2, 1, 3]
>>> elementwise_order([s0, 4, s1], [[4 * s1, 0, 1], [0, s1, 1]], ranges.get)  # broadcasts
[0, 1, 2]
>>> elementwise_order([s0, s1], [[s1, 4]], ranges.get) is None  # s1 against 4: undecided
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["compare_or_none", "contiguous_in_order", "elementwise_order"]

Bound = Callable[[Any], Any]  # a symbol -> its lower bound (None when unknown)

# expression -> (coefficient, {symbol: exponent}) or None (not a monomial); shared by all
# ShapeEnvs: the parse depends on the expression alone, the bounds are asked per call.
_MONOMIALS: dict[Any, tuple[int, dict[Any, int]] | None] = {}


class _Undecided(Exception):
    """A comparison whose answer depends on the symbols' values (or an unknown form)."""


def elementwise_order(
    sizes: Sequence[Any], strides: Sequence[Sequence[Any]], lower: Bound
) -> list[int] | None:
    """torch's ``compute_elementwise_output_logical_to_physical_perm`` over the expanded
    operands' ``strides`` (expressions), outermost dimension first, or None where a
    comparison is not the same for every value of the symbols (``lower``: a symbol's
    lower bound). ``sizes`` are the output's, none of them 1.

    >>> elementwise_order([3, 5], [[1, 3]], {}.get)  # a transposed (3, 5): dim 1 outermost
    [1, 0]
    """
    ndim = len(sizes)
    perm = list(reversed(range(ndim)))
    try:
        for i in range(1, ndim):  # torch's insertion sort, back to front
            dim1 = i
            for dim0 in reversed(range(i)):
                comparison = _should_swap(perm[dim0], perm[dim1], sizes, strides, lower)
                if comparison > 0:
                    perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                    dim1 = dim0
                elif comparison < 0:
                    break
    except _Undecided:
        return None
    return perm[::-1]


def contiguous_in_order(sizes: Sequence[Any], order: Sequence[int]) -> list[Any]:
    """The strides that make ``sizes`` contiguous with ``order``'s dimensions outermost
    first (``make_contiguous_strides_for`` of the permuted sizes, permuted back); works on
    ints, expressions and ``SymInt``s alike.

    >>> contiguous_in_order([3, 5, 7], [1, 0, 2])
    [7, 21, 1]
    """
    out: list[Any] = [1] * len(sizes)
    acc: Any = 1
    for d in reversed(order):
        out[d] = acc
        acc = acc * sizes[d]
    return out


def compare_or_none(x: Any, y: Any, lower: Bound) -> int | None:
    """-1, 0 or 1 as ``x < y``, ``x == y`` or ``x > y`` for every value of the symbols
    (monomials over symbols at least 2, see the module docstring); None where that
    depends on the values.

    >>> import sympy
    >>> s0 = sympy.Symbol("s0", positive=True, integer=True)
    >>> compare_or_none(4 * s0, 4, {s0: 2}.get), compare_or_none(s0, 4, {s0: 2}.get)
    (1, None)
    """
    try:
        return _compare(x, y, lower)
    except _Undecided:
        return None


def _should_swap(
    a: int, b: int, sizes: Sequence[Any], strides: Sequence[Sequence[Any]], lower: Bound
) -> int:
    """torch's ``should_swap`` (in ``compute_elementwise_output_logical_to_physical_perm``)
    with each ``guard_or_false`` decided for all values, or :class:`_Undecided`."""
    for tensor in strides:
        stride_a, stride_b = tensor[a], tensor[b]
        if _is_zero(stride_a, lower) or _is_zero(stride_b, lower):
            continue
        if _compare(stride_a, stride_b, lower) == 0:
            if _ge(sizes[b], sizes[a], lower):
                continue
            return 1
        if _ge(stride_b, stride_a, lower):
            return -1
        if _ge(stride_a, stride_b, lower):
            return 1
    return 0


def _is_zero(x: Any, lower: Bound) -> bool:
    if type(x) is int:
        return x == 0
    _monomial(x, lower)  # a symbolic monomial is at least 2: never 0
    return False


def _ge(x: Any, y: Any, lower: Bound) -> bool:
    """torch's ``ge``: ``y == 0``, or ``x >= y``, or ``x % y == 0``; for nonzero monomials
    ``x < y`` makes both false (``0 < x < y``: ``x % y`` is ``x``)."""
    if _is_zero(y, lower):
        return True
    if _is_zero(x, lower):
        return False
    return _compare(x, y, lower) >= 0


def _compare(x: Any, y: Any, lower: Bound) -> int:
    """-1, 0 or 1 as ``x < y``, ``x == y`` or ``x > y`` for every value of the symbols;
    :class:`_Undecided` where that depends on the values."""
    if x == y:
        return 0
    cx, px = _monomial(x, lower)
    cy, py = _monomial(y, lower)
    exps = {s: px.get(s, 0) - py.get(s, 0) for s in px.keys() | py.keys()}
    if all(e >= 0 for e in exps.values()) and cx * 2 ** sum(exps.values()) > cy:
        return 1  # x / y >= (cx / cy) * 2**sum > 1 for every value (each symbol >= 2)
    if all(e <= 0 for e in exps.values()) and cy * 2 ** -sum(exps.values()) > cx:
        return -1
    raise _Undecided


def _monomial(x: Any, lower: Bound) -> tuple[int, dict[Any, int]]:
    """``x`` as ``(c, {symbol: exponent})`` with ``c >= 1``, each symbol at least 2."""
    if type(x) is int:
        if x < 1:
            raise _Undecided
        return x, {}
    try:
        found = _MONOMIALS[x]
    except KeyError:
        found = _MONOMIALS[x] = _parse(x)
    except TypeError:
        raise _Undecided from None
    if found is None:
        raise _Undecided
    for symbol in found[1]:
        bound = lower(symbol)
        if bound is None or not bound >= 2:
            raise _Undecided
    return found


def _parse(x: Any) -> tuple[int, dict[Any, int]] | None:
    if getattr(x, "is_Integer", False):
        return (int(x), {}) if int(x) >= 1 else None
    if getattr(x, "is_Symbol", False):
        return 1, {x: 1}
    if not getattr(x, "is_Mul", False) and not getattr(x, "is_Pow", False):
        return None
    coeff, factors = x.as_coeff_mul()
    if not getattr(coeff, "is_Integer", False) or int(coeff) < 1:
        return None
    powers: dict[Any, int] = {}
    for f in factors:
        base, exp = f.as_base_exp()
        if not getattr(base, "is_Symbol", False) or not getattr(exp, "is_Integer", False):
            return None
        if int(exp) < 1:
            return None
        powers[base] = powers.get(base, 0) + int(exp)
    if len(_MONOMIALS) > 4096:
        _MONOMIALS.clear()
    return int(coeff), powers
