"""Loop nests for code generation: an inner loop cut by ``floor``/``Mod`` becomes nested loops.

A stage looping over ``y0 < 384`` that reads ``x[Mod(y0, 32) + 32*Mod(floor(y0/32), 4)]``
and ``mask[floor(y0/128)]`` (the backward of selecting q, k and v out of one projection)
computes its indices with divisions at every point, and nothing vectorises. Run as loops
over ``y0_0 < 3``, ``y0_1 < 4``, ``y0_2 < 32`` with ``y0 = 128*y0_0 + 32*y0_1 + y0_2``, every
index is affine, the innermost loop is contiguous and the mask load is invariant in it.
The points are visited in the same order, so this is a change of loop variables only.

>>> import torch
>>> from ember.inductor.scheduler import Stage, Store, Y
>>> index = sympy.Mod(Y[0], 32) + 64 * sympy.floor(Y[0] / 32)  # a strided copy
>>> body = Expr(Op.LOAD, torch.float32, (), ("x", index, ()))
>>> nest = split_inner(Stage((128,), (Store("buf0", body, Y[0]),)), {})
>>> nest.ranges, nest.defs, str(nest.stage.stores[0].body)
((4, 32), {y0: 32*y0_0 + y0_1}, 'x[64*y0_0 + y0_1]')
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import sympy  # type: ignore[import-untyped]

from ember.inductor.indexing import simplify_index
from ember.inductor.ir import Expr, map_indices, walk
from ember.inductor.ops import Op
from ember.inductor.scheduler import Stage, Y

__all__ = ["Nest", "replace_indices", "split_inner", "stage_indices", "without_unit_loops"]

MIN_INNERMOST = 4  # a smaller innermost loop is not worth its own level


@dataclass(frozen=True)
class Nest:
    """A stage's loops after splitting: variables, ranges, the old variables defined in terms
    of the new ones (for code that still names them), and the stage over the new ones."""

    vars: list[sympy.Symbol]
    ranges: tuple[int, ...]
    defs: dict[sympy.Symbol, sympy.Expr]
    stage: Stage


def stage_indices(st: Stage) -> list[sympy.Expr]:
    """Every index of ``st``: its stores', then those of the loads and index values read.

    >>> import torch
    >>> from ember.inductor.scheduler import Store
    >>> body = Expr(Op.LOAD, torch.float32, (), ("x", 2 * Y[0], ()))
    >>> stage_indices(Stage((4,), (Store("out", body, Y[0]),)))
    [y0, 2*y0]
    """
    out = [s.index for s in st.stores]
    for s in st.stores:
        out += [e.arg[1] if e.op is Op.LOAD else e.arg for e in _leaves(s.body)]
    return out


def _leaves(e: Expr) -> list[Expr]:
    return [n for n in walk(e) if n.op in (Op.LOAD, Op.INDEX)]


def _cuts(indices: list[sympy.Expr], y: sympy.Symbol, n: int) -> list[int]:
    """Positions where ``floor``/``Mod`` of ``y`` cut its range, as a chain of divisors of n
    (each dividing the next), smallest first."""
    found: set[int] = set()
    for index in indices:
        for atom in index.atoms(sympy.floor, sympy.Mod):
            arg = atom.args[0]
            if isinstance(atom, sympy.floor):
                num, den = sympy.fraction(sympy.together(arg))
                if num == y and den.is_Integer:
                    found.add(int(den))
            elif atom.args[1].is_Integer:
                m = int(atom.args[1])
                if arg == y:
                    found.add(m)
                elif isinstance(arg, sympy.floor):
                    num, den = sympy.fraction(sympy.together(arg.args[0]))
                    if num == y and den.is_Integer:
                        found |= {int(den), int(den) * m}
    chain: list[int] = []
    for c in sorted(c for c in found if 1 < c < n and n % c == 0):
        if all(c % p == 0 for p in chain):
            chain.append(c)
    return chain


def split_inner(st: Stage, bounds: dict[sympy.Symbol, int]) -> Nest | None:
    """The stage's inner loops split where their indices cut them (None: nothing to gain).
    ``bounds``: the ranges of the outer loop variables, for index simplification."""
    if not all(isinstance(n, int) for n in st.inner):
        return None  # symbolic sizes: cut points are not known (divisions stay in indices)
    indices = stage_indices(st)
    vars_: list[sympy.Symbol] = []
    ranges: list[int] = []
    defs: dict[sympy.Symbol, sympy.Expr] = {}
    for j, n in enumerate(st.inner):
        y = Y[j]
        chain = _cuts(indices, y, n)
        if not chain:
            vars_.append(y)
            ranges.append(n)
            continue
        bounds_ = [n, *reversed(chain)]  # n > c_k > ... > c_1: digit sizes between cuts
        sizes = [*(a // b for a, b in itertools.pairwise(bounds_)), chain[0]]
        digits = [
            sympy.Symbol(f"{y}_{d}", integer=True, nonnegative=True) for d in range(len(sizes))
        ]
        steps = [math.prod(sizes[d + 1 :]) for d in range(len(sizes))]
        defs[y] = sympy.Add(*[s * v for s, v in zip(steps, digits, strict=True)])
        vars_ += digits
        ranges += sizes
    if not defs or ranges[-1] < MIN_INNERMOST:
        return None
    known = bounds | dict(zip(vars_, ranges, strict=True))

    def fix(index: sympy.Expr) -> sympy.Expr:
        return simplify_index(sympy.expand(index.xreplace(defs)), known)

    stage = replace_indices(st, fix)
    innermost = vars_[-1]
    for index in stage_indices(stage):
        if any(innermost in a.free_symbols for a in index.atoms(sympy.floor, sympy.Mod)):
            return None  # the innermost loop still divides: no better than before
    return _merge(Nest(vars_, tuple(ranges), defs, stage))


def without_unit_loops(st: Stage) -> Stage:
    """A stage over one point (``inner`` all 1s) with its loop variables set to 0: it runs
    without loops, so the values it keeps in variables are seen by the stages after it."""
    zero = {y: sympy.Integer(0) for y in Y[: len(st.inner)]}
    return dataclasses.replace(replace_indices(st, _substitution(zero)), inner=())


def _merge(nest: Nest) -> Nest:
    """Adjacent loops that every index reads as one (``32*y0_1 + y0_2``) become one loop."""
    vars_, ranges, defs, stage = list(nest.vars), list(nest.ranges), nest.defs, nest.stage
    k = 0
    while k + 1 < len(vars_):
        a, b, n = vars_[k], vars_[k + 1], ranges[k + 1]
        indices = stage_indices(stage) + list(defs.values())
        if not all(_as_one(index, a, b, n) for index in indices):
            k += 1
            continue
        sub = {a: sympy.Integer(0)}  # n*a + b -> b, the merged loop's variable
        stage = replace_indices(stage, _substitution(sub))
        defs = {y: v.xreplace(sub) for y, v in defs.items()}
        del vars_[k]
        ranges[k : k + 2] = [ranges[k] * n]
    return Nest(vars_, tuple(ranges), defs, stage)


def _as_one(index: sympy.Expr, a: sympy.Symbol, b: sympy.Symbol, n: int) -> bool:
    """``index`` is linear in ``a`` and ``b`` with ``coeff(a) == n * coeff(b)``."""
    if any({a, b} & atom.free_symbols for atom in index.atoms(sympy.floor, sympy.Mod)):
        return False
    da, db = sympy.diff(index, a), sympy.diff(index, b)
    return bool(da.is_Integer and db.is_Integer and da == n * db)


def _substitution(sub: dict[sympy.Symbol, sympy.Expr]) -> Callable[[sympy.Expr], sympy.Expr]:
    def apply(index: sympy.Expr) -> sympy.Expr:
        return index.xreplace(sub)

    return apply


def replace_indices(st: Stage, fix: Callable[[sympy.Expr], sympy.Expr]) -> Stage:
    """``st`` with every index (stores, loads, index values) passed through ``fix``.

    >>> import torch
    >>> from ember.inductor.scheduler import Store
    >>> body = Expr(Op.LOAD, torch.float32, (), ("x", Y[0], ()))
    >>> st = replace_indices(Stage((4,), (Store("out", body, Y[0]),)), lambda i: i + 1)
    >>> str(st.stores[0])
    'out[y0 + 1] = x[y0 + 1]'
    """
    stores = tuple(
        dataclasses.replace(s, body=map_indices(s.body, fix), index=fix(s.index)) for s in st.stores
    )
    return dataclasses.replace(st, stores=stores)
