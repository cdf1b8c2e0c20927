"""Rewrite rules over body expressions and sympy indices.

A rule is ``(ops, fn)``: ``fn(e)`` returns a replacement for an :class:`Expr`
whose op is in ``ops``, or ``None``. Rule lists compose with ``+``.
:func:`simplify` applies rules bottom-up until none fires, and simplifies
every index with the loop bounds of its node (``Mod(i1, 8) -> i1`` when
``i1 < 8``).

>>> from ember.inductor.ir import I, Buffer, Layout, const, load
>>> x = Buffer("x", torch.float32, Layout.contiguous((8,)))
>>> e = Expr(Op.MUL, torch.float32, (load(x, (I[0],)), const(1.0, torch.float32)))
>>> print(rewrite(e, ALGEBRA + FOLD))
x[i0]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import sympy  # type: ignore[import-untyped]
import torch

from ember.inductor.indexing import simplify_index
from ember.inductor.ir import Expr, Extern, I, Node, Program, R, const
from ember.inductor.ops import LEAF, SEMANTICS, Op

__all__ = ["ALGEBRA", "FOLD", "Rule", "rewrite", "simplify"]

Rule = tuple[frozenset[Op], Callable[[Expr], Expr | None]]


def _is(e: Expr, value: float) -> bool:
    return e.op is Op.CONST and e.arg == value and not isinstance(e.arg, bool)


def _fold(e: Expr) -> Expr | None:
    if not e.args or any(a.op is not Op.CONST for a in e.args) or e.op is Op.CAST:
        return None
    args = [torch.tensor(a.arg, dtype=a.dtype) for a in e.args]
    out = SEMANTICS[e.op](*args).to(e.dtype).item()
    return const(out, e.dtype)


def _cast(e: Expr) -> Expr | None:
    (a,) = e.args
    if a.dtype == e.dtype:
        return a
    if a.op is Op.CONST:
        return const(torch.tensor(a.arg, dtype=a.dtype).to(e.dtype).item(), e.dtype)
    return None


def _pow(e: Expr) -> Expr | None:
    x, p = e.args
    if _is(p, 2):
        return Expr(Op.MUL, e.dtype, (x, x))
    if _is(p, 3):  # (x*x)*x, as aten's pow kernel computes it (same rounding)
        return Expr(Op.MUL, e.dtype, (Expr(Op.MUL, e.dtype, (x, x)), x))
    if not e.dtype.is_floating_point:
        return None
    if _is(p, -2):  # 1/(x*x), as aten
        return Expr(Op.RECIPROCAL, e.dtype, (Expr(Op.MUL, e.dtype, (x, x)),))
    if _is(p, -0.5):
        return Expr(Op.RSQRT, e.dtype, (x,))
    if _is(p, 1):
        return x
    if _is(p, 0.5):
        return Expr(Op.SQRT, e.dtype, (x,))
    if _is(p, -1):
        return Expr(Op.RECIPROCAL, e.dtype, (x,))
    return None


def _mul(e: Expr) -> Expr | None:
    a, b = e.args
    return a if _is(b, 1) else b if _is(a, 1) else None


def _add(e: Expr) -> Expr | None:
    a, b = e.args
    if e.dtype.is_floating_point:
        return None  # x + 0.0 is not x when x is -0.0
    return a if _is(b, 0) else b if _is(a, 0) else None


def _where(e: Expr) -> Expr | None:
    c, a, b = e.args
    if c.op is Op.CONST:
        return a if c.arg else b
    return a if a == b else None


def _neg_neg(e: Expr) -> Expr | None:
    return e.args[0].args[0] if e.args[0].op is Op.NEG else None


ALGEBRA: list[Rule] = [
    (frozenset({Op.POW}), _pow),  # x**2 -> x*x, x**3 -> x*x*x, x**-2 -> 1/(x*x), x**1 -> x, ...
    (frozenset({Op.MUL}), _mul),  # x*1 -> x, 1*x -> x
    (frozenset({Op.ADD}), _add),  # x+0 -> x (integers only)
    (frozenset({Op.WHERE}), _where),  # where(c, x, y) with constant c -> x or y; where(c,x,x) -> x
    (frozenset({Op.NEG}), _neg_neg),  # -(-x) -> x
    (frozenset({Op.CAST}), _cast),  # cast(x: T) to T -> x; cast of a constant -> constant
]
FOLD: list[Rule] = [
    (frozenset(SEMANTICS), _fold),  # op(c1, c2, ...) -> the constant SEMANTICS gives
]


def rewrite(e: Expr, rules: Iterable[Rule], index: Callable[[Expr], Expr] | None = None) -> Expr:
    """``e`` with ``rules`` applied bottom-up to a fixed point (``index`` maps leaves)."""
    by_op: dict[Op, list[Callable[[Expr], Expr | None]]] = {}
    for ops, fn in rules:
        for op in ops:
            by_op.setdefault(op, []).append(fn)
    memo: dict[int, Expr] = {}

    def visit(node: Expr) -> Expr:
        done = memo.get(id(node))
        if done is not None:
            return done
        args = tuple(visit(a) for a in node.args)
        out = dataclasses.replace(node, args=args) if args != node.args else node
        if out.op in LEAF and index is not None:
            out = index(out)
        for _ in range(8):
            new = next((r for fn in by_op.get(out.op, ()) if (r := fn(out)) is not None), None)
            if new is None:
                break
            out = visit(new) if new is not out else out
        memo[id(node)] = out
        return out

    return visit(e)


def _index_leaf(bounds: dict[sympy.Symbol, int]) -> Callable[[Expr], Expr]:
    def fix(e: Expr) -> Expr:
        if e.op is Op.LOAD:
            name, index, indirect = e.arg
            new = simplify_index(index, bounds)
            return e if new == index else dataclasses.replace(e, arg=(name, new, indirect))
        if e.op is Op.INDEX:
            new = simplify_index(e.arg, bounds)
            return (
                const(int(new), torch.int64) if new.is_Integer else dataclasses.replace(e, arg=new)
            )
        return e

    return fix


def simplify(prog: Program) -> Program:
    """Every body rewritten with :data:`ALGEBRA` + :data:`FOLD`, every index simplified."""
    nodes: list[Node] = []
    for node in prog.nodes:
        if isinstance(node, Extern):
            nodes.append(node)
            continue
        reduce_ranges = getattr(node, "reduce_ranges", ())
        bounds = dict(zip(I, node.ranges, strict=False)) | dict(zip(R, reduce_ranges, strict=False))
        body = rewrite(node.body, ALGEBRA + FOLD, _index_leaf(bounds))
        nodes.append(dataclasses.replace(node, body=body))
    return dataclasses.replace(prog, nodes=nodes)
