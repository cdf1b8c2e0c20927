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
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch

from ember.inductor.ir import Expr, Extern, I, Node, Program, R, const
from ember.inductor.ops import LEAF, SEMANTICS, Op

__all__ = ["ALGEBRA", "FOLD", "Rule", "rewrite", "simplify", "simplify_index"]

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
    (frozenset({Op.POW}), _pow),  # x**2 -> x*x, x**1 -> x, x**0.5 -> sqrt x, x**-1 -> 1/x
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


def _range(e: sympy.Expr, bounds: dict[sympy.Symbol, int]) -> tuple[sympy.Expr, sympy.Expr] | None:
    """Lowest and highest value of ``e`` over the box ``bounds`` (interval arithmetic), or None."""
    if e.is_Number:
        return e, e
    if e.is_Symbol:
        return (sympy.Integer(0), sympy.Integer(bounds[e] - 1)) if e in bounds else None
    if isinstance(e, sympy.Add):
        parts = [_range(a, bounds) for a in e.args]
        if any(p is None for p in parts):
            return None
        return sympy.Add(*[p[0] for p in parts]), sympy.Add(*[p[1] for p in parts])  # type: ignore[index]
    if isinstance(e, sympy.Mul) and len(e.args) == 2 and e.args[0].is_Number:
        inner = _range(e.args[1], bounds)
        if inner is None:
            return None
        ends = (e.args[0] * inner[0], e.args[0] * inner[1])
        return min(ends), max(ends)
    if isinstance(e, sympy.floor):
        inner = _range(e.args[0], bounds)
        return None if inner is None else (sympy.floor(inner[0]), sympy.floor(inner[1]))
    if isinstance(e, sympy.Min | sympy.Max):
        parts = [_range(a, bounds) for a in e.args]
        if any(p is None for p in parts):
            return None
        pick = min if isinstance(e, sympy.Min) else max
        return pick(p[0] for p in parts), pick(p[1] for p in parts)  # type: ignore[index]
    if isinstance(e, sympy.Mod) and e.args[1].is_Integer:
        inner = _range(e.args[0], bounds)
        if inner is not None and inner[0] >= 0 and inner[1] < e.args[1]:
            return inner
        return sympy.Integer(0), e.args[1] - 1
    return None


def _split(
    num: sympy.Expr, d: int, bounds: dict[sympy.Symbol, int]
) -> tuple[sympy.Expr, sympy.Expr, int]:
    """``num = m*q + r`` with ``0 <= r < m`` and ``m | d`` (m = 1 when nothing better)."""
    terms = sorted(sympy.Add.make_args(sympy.expand(num)), key=lambda t: abs(_coeff(t)))
    for k in range(len(terms), 0, -1):
        small, rest = sympy.Add(*terms[:k]), terms[k:]
        m = int(sympy.gcd_list([_coeff(t) for t in rest] + [d])) if rest else d
        r = _range(small, bounds)
        if m > 1 and r is not None and r[0] >= 0 and r[1] < m:
            return sympy.expand(sympy.Add(*rest) / m), small, m
    return num, sympy.Integer(0), 1


def _coeff(term: sympy.Expr) -> int:
    c = term.as_coeff_Mul()[0]
    return int(c) if c.is_Integer else 1


def _integer_part(n: sympy.Expr) -> tuple[int, sympy.Expr]:
    """``n = k * size``: its integer coefficient ``k`` and the rest, a product of symbolic
    sizes (positive integers, so the identities of :func:`simplify_index` hold for it as for
    a number); ``(1, n)`` when ``n`` is anything else.

    >>> ks0 = sympy.Symbol("ks0", integer=True, positive=True)
    >>> _integer_part(128 * ks0), _integer_part(sympy.Integer(32)), _integer_part(ks0 - 1)
    ((128, ks0), (32, 1), (1, ks0 - 1))
    """
    k, size = n.as_coeff_Mul()
    sizes = sympy.Mul.make_args(size)
    if not k.is_Integer or k < 1 or not all(s.is_Number or _size_symbol(s) for s in sizes):
        return 1, n
    return int(k), size


def _size_symbol(s: sympy.Expr) -> bool:
    """A symbol that stands for a size: a positive integer (ember.inductor.symbolic)."""
    return bool(s.is_Symbol and s.is_integer and s.is_positive)


def _proved(relation: Any) -> bool:
    """True only when sympy decides ``relation`` (with a symbolic size it may not)."""
    return relation is sympy.true


def simplify_index(e: sympy.Expr, bounds: dict[sympy.Symbol, Any]) -> sympy.Expr:
    """Drop or shrink ``Mod``/``floor`` using the loop bounds: values that cannot wrap
    (``Mod(i1, 8) -> i1`` when ``i1 < 8``) and low terms that cannot carry
    (``floor((512*x0 + y0)/32768) -> floor(x0/64)`` when ``y0 < 512``). Variables with a
    symbolic bound are left alone."""
    bounds = {v: n for v, n in bounds.items() if isinstance(n, int)}

    def mod(x: sympy.Expr, n: sympy.Expr) -> sympy.Expr:
        r = _range(x, bounds)
        if r is not None and r[0] >= 0 and _proved(sympy.Lt(r[1], n)):
            return x
        k, size = _integer_part(n)
        if k > 1:
            q, rest, m = _split(x, k, bounds)
            if m > 1:  # m*q + r mod m*c == m*(q mod c) + r when 0 <= r < m
                return m * sympy.Mod(q, (k // m) * size) + rest
        return sympy.Mod(x, n)

    def floor(x: sympy.Expr) -> sympy.Expr:
        r = _range(x, bounds)
        if r is not None and sympy.floor(r[0]) == sympy.floor(r[1]):
            return sympy.floor(r[0])
        num, den = sympy.fraction(sympy.together(x))
        k, size = _integer_part(den)
        if k > 1:
            q, _, m = _split(num, k, bounds)
            if m > 1:  # floor((m*q + r)/(m*c)) == floor(q/c) when 0 <= r < m
                return sympy.floor(q / ((k // m) * size))
        return sympy.floor(x)

    for _ in range(6):
        new = _recombine(sympy.expand(e.replace(sympy.floor, floor).replace(sympy.Mod, mod)))
        if new == e:
            break
        e = new
    return e


def _recombine(e: sympy.Expr) -> sympy.Expr:
    """``a*Mod(x, n) + a*n*floor(x/n) -> a*x`` (a split index put back together)."""
    terms = {t.as_coeff_Mul()[1]: t.as_coeff_Mul()[0] for t in sympy.Add.make_args(e)}
    for term, a in list(terms.items()):
        if not isinstance(term, sympy.Mod) or term not in terms:
            continue
        x, n = term.args
        whole = sympy.floor(x / n)
        if terms.get(whole) == a * n:
            del terms[term], terms[whole]
            terms[x] = terms.get(x, 0) + a
    return sympy.Add(*[c * t for t, c in terms.items()])


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
