"""Pointwise stages cut where a select changes sides: a cat or a pad copies each piece once.

A cat along the innermost dimension is lowered as one select chain over the output: at
every point ``where(y0 < 128, a[128*x0 + Min(127, y0)], where(y0 < 256, b[...], c[...]))``.
Each point loads from every input, at clamped indices that gcc turns into gathers, and keeps
one value: GPT-2's backward cat of the q, k and v gradients (128x384 floats) took 94 us,
where copying each input once takes under 10. The innermost loop is cut where a comparison
of its variable with a constant changes value (``y0 = 128``, ``y0 = 256``); on each piece the
comparisons are constants, the selects fold to one side, the clamps drop out of the indices
(``Min(127, y0)`` is ``y0`` for ``y0 < 128``) and the piece is a contiguous copy of one
input. The pieces visit the same points as the loop did, in the same order.

>>> import torch
>>> from ember.inductor.ir import Expr, const
>>> from ember.inductor.scheduler import Stage, Store, Y
>>> y = Y[0]
>>> a = Expr(Op.LOAD, torch.float32, (), ("a", sympy.Min(3, y), ()))
>>> b = Expr(Op.LOAD, torch.float32, (), ("b", sympy.Max(0, y - 4), ()))
>>> first = Expr(Op.LT, torch.bool, (Expr(Op.INDEX, torch.int64, (), y), const(4, torch.int64)))
>>> body = Expr(Op.WHERE, torch.float32, (first, a, b))
>>> for lo, st in pieces(Stage((10,), (Store("out", body, y),)), {}):
...     print(lo, st.inner, st.stores[0])
0 (4,) out[y0] = a[y0]
4 (6,) out[y0 + 4] = b[y0]
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import sympy  # type: ignore[import-untyped]

from ember.inductor.indexing import _range, simplify_index
from ember.inductor.ir import Expr, const, map_indices, walk
from ember.inductor.ops import Op
from ember.inductor.rewrite import ALGEBRA, FOLD, Rule, rewrite
from ember.inductor.scheduler import Stage, Y

__all__ = ["MAX_PIECES", "pieces"]

MAX_PIECES = 8  # more pieces than this: the loop overhead outweighs the loads saved

# op -> (does the comparison hold, given the ends lo..hi of its left side and k)
_DECIDE = {
    Op.LT: lambda lo, hi, k: True if hi < k else False if lo >= k else None,
    Op.LE: lambda lo, hi, k: True if hi <= k else False if lo > k else None,
    Op.GT: lambda lo, hi, k: True if lo > k else False if hi <= k else None,
    Op.GE: lambda lo, hi, k: True if lo >= k else False if hi < k else None,
}
_FLIP = {Op.LT: Op.GT, Op.LE: Op.GE, Op.GT: Op.LT, Op.GE: Op.LE}  # k < e is e > k
# op -> the first value of y (in y + c op k) where the comparison's value changes
_CUT = {Op.LT: 0, Op.GE: 0, Op.LE: 1, Op.GT: 1}


def _sides(e: Expr) -> tuple[Op, sympy.Expr, int] | None:
    """``(op, index, k)`` for a comparison ``index op k`` of an index with an integer."""
    if e.op not in _DECIDE:
        return None
    left, right = e.args
    op = e.op
    if _integer(left) is not None and right.op is Op.INDEX:
        left, right, op = right, left, _FLIP[op]
    k = _integer(right)
    if left.op is not Op.INDEX or k is None:
        return None
    return op, left.arg, k


def _integer(e: Expr) -> int | None:
    """The value of an integer constant, or of an index that is one (before simplify folds
    it into a constant)."""
    if e.op is Op.CONST and isinstance(e.arg, int) and not isinstance(e.arg, bool):
        return e.arg
    if e.op is Op.INDEX and e.arg.is_Integer:
        return int(e.arg)
    return None


def _cuts(st: Stage, y: sympy.Symbol, n: int) -> list[int]:
    """Where comparisons of ``y + c`` with constants change value inside ``(0, n)``."""
    found: set[int] = set()
    for s in st.stores:
        for e in walk(s.body):
            sides = _sides(e)
            if sides is None:
                continue
            op, index, k = sides
            c = index - y
            if c.is_Integer:
                found.add(k - int(c) + _CUT[op])
    return sorted(v for v in found if 0 < v < n)


def pieces(st: Stage, bounds: dict[sympy.Symbol, Any]) -> list[tuple[int, Stage]] | None:
    """``(offset, stage)`` for each piece of the innermost loop of a pointwise stage, each
    stage over its piece with its indices shifted (None: no select to cut at, or symbolic
    sizes). ``bounds``: the ranges of the loop variables around the stage."""
    if not st.inner or not all(isinstance(n, int) for n in st.inner):
        return None
    y, n = Y[len(st.inner) - 1], st.inner[-1]
    cuts = _cuts(st, y, n)
    if not cuts or len(cuts) >= MAX_PIECES:
        return None
    out = []
    for lo, hi in zip([0, *cuts], [*cuts, n], strict=True):
        known = {**bounds, **dict(zip(Y, st.inner, strict=False)), y: hi - lo}
        out.append((lo, _piece(st, y, lo, known)))
    return out


def _piece(st: Stage, y: sympy.Symbol, lo: int, known: dict[sympy.Symbol, Any]) -> Stage:
    n = known[y]
    key = tuple(sorted(known.items(), key=lambda kv: str(kv[0])))

    def fix(index: sympy.Expr) -> sympy.Expr:
        shifted = simplify_index(sympy.expand(index.xreplace({y: y + lo})), known)
        return _without_clamps(shifted, key)

    rules: list[Rule] = [(frozenset(_DECIDE), functools.partial(_decided, known)), *ALGEBRA, *FOLD]
    stores = tuple(
        dataclasses.replace(s, body=rewrite(map_indices(s.body, fix), rules), index=fix(s.index))
        for s in st.stores
    )
    return Stage((*st.inner[:-1], n), stores)


def _decided(known: dict[sympy.Symbol, Any], e: Expr) -> Expr | None:
    """A comparison of an index with a constant that the loop bounds decide, as a constant."""
    sides = _sides(e)
    if sides is None:
        return None
    op, index, k = sides
    r = _range(index, known)
    if r is None or not (r[0].is_Integer and r[1].is_Integer):
        return None
    value = _DECIDE[op](int(r[0]), int(r[1]), k)
    return None if value is None else const(value, e.dtype)


@functools.lru_cache(maxsize=4096)
def _without_clamps(index: sympy.Expr, key: tuple[tuple[sympy.Symbol, Any], ...]) -> sympy.Expr:
    """``index`` with each ``Min``/``Max`` that the loop bounds decide replaced by the
    argument it always picks (innermost first)."""
    if not index.has(sympy.Min, sympy.Max):
        return index
    known = dict(key)

    def pick(kind: type, *args: sympy.Expr) -> sympy.Expr:
        ranges = [_range(a, known) for a in args]
        if all(r is not None and r[0].is_Number and r[1].is_Number for r in ranges):
            for a, r in zip(args, ranges, strict=True):
                others = [q for q in ranges if q is not r]
                if kind is sympy.Min and all(r[1] <= q[0] for q in others):  # type: ignore[index]
                    return a
                if kind is sympy.Max and all(r[0] >= q[1] for q in others):  # type: ignore[index]
                    return a
        return kind(*args)

    out = index.replace(sympy.Max, functools.partial(pick, sympy.Max))
    return out.replace(sympy.Min, functools.partial(pick, sympy.Min))
