"""Loop order from memory: a node's loops run in the order its loads and stores lay out.

A node is lowered over its logical dimensions (``i0`` rows, ``i1`` columns). When its
output takes eager's transposed strides (``exp(x.t())``), looping in that order walks
memory with a 4 KB stride in every load and store. :func:`pick_order` chooses, for each
node, the order of its loops from the strides of its accesses: each access votes, for
two loops, that the one with the smaller stride runs inside, weighted by the bytes it
moves; the loop that wins most contests is innermost. A reduction orders its row loops
the same way (the store counts), and its reduce loops by its loads alone (not for
``argmax``/``argmin``, whose result is the position in logical order).
:func:`reordered` applies the order as a change of loop variables: the node's body and
its output layout are permuted together, so every index still names the same element.

Under symbolic sizes a stride is an expression (``ks0``, ``ks0*ks1``): one is smaller
than another only where that holds for every size the shape guards allow (each size
``>= 2``); otherwise the access casts no vote, and with no votes the order is kept.

>>> import torch
>>> from ember.inductor.ir import Buffer, I, Layout, Pointwise, Program, load
>>> x = Buffer("x", torch.float32, Layout.contiguous((8, 4)))
>>> out = Buffer("buf0", torch.float32, Layout((4, 8), (1, 4)))  # x.t()'s strides
>>> body = Expr(Op.EXP, torch.float32, (load(x, (I[1], I[0])),))  # exp(x.t())
>>> prog = Program({"x": x, "buf0": out}, ["x"], [Pointwise("buf0", (4, 8), body)], [])
>>> order = pick_order(prog, prog.nodes[0])
>>> order
Order(outer=(1, 0), reduce=(), tile=None)
>>> node, layout = reordered(prog, prog.nodes[0], order)
>>> print(node, layout.strides)
buf0[8, 4] = EXP(x[4*i0 + i1]) (4, 1)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy  # type: ignore[import-untyped]

from ember.inductor.indexing import nonnegative
from ember.inductor.ir import Expr, I, Layout, Pointwise, Program, R, Reduction, map_indices, walk
from ember.inductor.ops import Op, Reduce

__all__ = ["Order", "pick_order", "reordered"]

# reductions whose result depends on the order of the reduce loops (a position in them)
ORDERED = frozenset({Reduce.ARGMAX, Reduce.ARGMIN})
TILE = 16  # a tile's side: 16 floats fill a 64-byte cache line


@dataclass(frozen=True, slots=True)
class Order:
    """Loop orders of one node, outermost first: ``outer`` permutes its ``ranges``,
    ``reduce`` its ``reduce_ranges`` (empty: kept as lowered).

    >>> Order((0, 1)).kept, Order((1, 0)).kept, Order((0, 1), (), (0, 16)).kept
    (True, False, False)
    """

    outer: tuple[int, ...]
    reduce: tuple[int, ...] = ()
    # (loop j of the new order, t): loop j and the innermost one run in t x t tiles, for an
    # access that moves along memory with j while the others do with the innermost loop
    tile: tuple[int, int] | None = None

    @property
    def kept(self) -> bool:
        """Both orders are the lowered one, untiled."""
        return _identity(self.outer) and _identity(self.reduce) and self.tile is None


# one access: the bytes it moves per point and its stride along each loop (None: unknown,
# the loop appears under a floor or Mod)
Access = tuple[int, list[Any]]


def pick_order(prog: Program, node: Pointwise | Reduction) -> Order:
    """The loop order that walks ``node``'s memory most nearly in sequence.

    >>> import torch
    >>> from ember.inductor.ir import Buffer, I, R, Layout, Reduction, Program, load
    >>> x = Buffer("x", torch.float32, Layout.contiguous((8, 4)))
    >>> out = Buffer("buf0", torch.float32, Layout.contiguous(()))
    >>> body = load(x, (R[1], R[0]))  # x.t().sum()
    >>> node = Reduction("buf0", (), (4, 8), Reduce.SUM, body)
    >>> pick_order(Program({"x": x, "buf0": out}, ["x"], [node], []), node)
    Order(outer=(), reduce=(1, 0), tile=None)
    """
    out = prog.buffers[node.name]
    loads = [e for e in walk(node.body) if e.op is Op.LOAD]
    n = len(node.ranges)
    store: Access = (out.dtype.itemsize, list(out.layout.strides))
    accesses = [store, *_accesses(loads, I[:n])]
    outer = _order(node.ranges, accesses)
    if isinstance(node, Pointwise):
        return Order(outer, (), _tile(node.ranges, accesses, outer))
    if node.kind in ORDERED:
        return Order(outer, tuple(range(len(node.reduce_ranges))))
    m = len(node.reduce_ranges)
    return Order(outer, _order(node.reduce_ranges, _accesses(loads, R[:m])))


def reordered(
    prog: Program, node: Pointwise | Reduction, order: Order
) -> tuple[Pointwise | Reduction, Layout]:
    """``node`` with its loops permuted by ``order`` (loop ``j`` is the old loop
    ``order.outer[j]``), and its output's layout permuted alike: the same element stored at
    each point, only visited in another order.

    >>> import torch
    >>> from ember.inductor.ir import Buffer, I, Layout, Pointwise, Program, load
    >>> x = Buffer("x", torch.float32, Layout.contiguous((32, 32)))
    >>> out = Buffer("buf0", torch.float32, Layout.contiguous((32, 32)))
    >>> node = Pointwise("buf0", (32, 32), load(x, (I[1], I[0])))  # x.t().contiguous()
    >>> prog = Program({"x": x, "buf0": out}, ["x"], [node], [])
    >>> tiled, layout = reordered(prog, node, pick_order(prog, node))  # 16x16 tiles
    >>> print(tiled, layout.strides)
    buf0[2, 2, 16, 16] = x[16*i0 + 512*i1 + i2 + 32*i3] (512, 16, 32, 1)
    """
    layout = prog.buffers[node.name].layout
    if order.kept:
        return node, layout
    sub = {I[old]: I[new] for new, old in enumerate(order.outer)}
    sub |= {R[old]: R[new] for new, old in enumerate(order.reduce)}
    body = map_indices(node.body, _renaming(sub))
    ranges = _permute(node.ranges, order.outer)
    layout = Layout(ranges, _permute(layout.strides, order.outer), layout.offset)
    if isinstance(node, Pointwise) and order.tile is not None:
        node = dataclasses.replace(node, ranges=ranges, body=body)
        return _tiled(node, layout, *order.tile)
    if isinstance(node, Reduction):
        reduce_ranges = _permute(node.reduce_ranges, order.reduce)
        return dataclasses.replace(
            node, ranges=ranges, reduce_ranges=reduce_ranges, body=body
        ), layout
    return dataclasses.replace(node, ranges=ranges, body=body), layout


def _tiled(node: Pointwise, layout: Layout, j: int, t: int) -> tuple[Pointwise, Layout]:
    """Loops ``j`` and the innermost (``k``) split by ``t``: ``i_j = t*a + b``,
    ``i_k = t*c + e``, run as ``..., a, ..., c, b, e``. The loop over ``b`` keeps the ``t``
    memory lines of the strided access in cache while the ``e`` loop reads along the others."""
    n, k = len(node.ranges), len(node.ranges) - 1
    sub = {I[j]: t * I[j] + I[n], I[k]: t * I[k] + I[n + 1]}
    body = map_indices(node.body, lambda index: sympy.expand(index.xreplace(sub)))
    sizes, strides = list(layout.sizes), list(layout.strides)
    sj, sk = strides[j], strides[k]
    sizes[j], sizes[k] = sizes[j] // t, sizes[k] // t
    strides[j], strides[k] = t * sj, t * sk
    out = Layout((*sizes, t, t), (*strides, sj, sk), layout.offset)
    return dataclasses.replace(node, ranges=out.sizes, body=body), out


def _tile(
    sizes: tuple[Any, ...], accesses: list[Access], outer: tuple[int, ...]
) -> tuple[int, int] | None:
    """Tile loops (position ``j`` of ``outer``, ``t``) when an access moves along memory with
    another loop than the innermost, while the innermost loop moves other accesses along
    memory (``x.t() + y``, ``x.t().contiguous()``): static sizes that ``t`` divides only."""
    k = outer[-1] if outer else None
    if k is None or not isinstance(sizes[k], int) or sizes[k] < 2 * TILE:
        return None
    if not any(abs(st[k]) == 1 for _, st in accesses if isinstance(st[k], int)):
        return None
    across = [d for _, st in accesses if _strided(st[k]) for d in _unit_dims(st)]
    for d in across:
        if d != k and isinstance(sizes[d], int) and sizes[d] >= 2 * TILE:
            if sizes[d] % TILE == 0 and sizes[k] % TILE == 0:
                return outer.index(d), TILE
    return None


def _strided(stride: Any) -> bool:
    return stride is not None and (not isinstance(stride, int) or abs(stride) > 1)


def _unit_dims(strides: list[Any]) -> list[int]:
    return [d for d, s in enumerate(strides) if isinstance(s, int) and abs(s) == 1]


def _renaming(sub: dict[sympy.Symbol, sympy.Symbol]) -> Callable[[sympy.Expr], sympy.Expr]:
    def apply(index: sympy.Expr) -> sympy.Expr:
        return index.xreplace(sub)  # simultaneous: i0 <-> i1 swaps

    return apply


def _permute(values: Sequence[Any], perm: tuple[int, ...]) -> tuple[Any, ...]:
    return tuple(values[p] for p in perm)


def _identity(perm: tuple[int, ...]) -> bool:
    return perm == tuple(range(len(perm)))


def _accesses(loads: list[Expr], vars_: Sequence[sympy.Symbol]) -> list[Access]:
    """Each load's bytes and its stride along each of ``vars_``."""
    return [(e.dtype.itemsize, [_stride(e.arg[1], v) for v in vars_]) for e in loads]


# Each layer of a transformer stack indexes its buffers with the same expressions: a memo
# keyed by the expression (sympy's structural equality) derives each stride once, where a
# 24-layer GPT-2 differentiated 24 copies of it (a pure function of its arguments: exact).
@functools.lru_cache(maxsize=1 << 16)
def _stride(index: sympy.Expr, v: sympy.Symbol) -> Any:
    """How far ``index`` moves when ``v`` steps by one (None: not affine in ``v``)."""
    if v not in index.free_symbols:
        return 0
    index = _unclamped(index, v)
    if any(v in a.free_symbols for a in index.atoms(sympy.floor, sympy.Mod)):
        return None
    step = sympy.diff(index, v)
    if step.free_symbols & (set(I) | set(R)):
        return None  # a product of loop variables: not a stride
    return int(step) if step.is_Integer else step


def _unclamped(index: sympy.Expr, v: sympy.Symbol) -> sympy.Expr:
    """``index`` with each clamp of ``v`` (``Min(1023, Max(0, v - 1))``: pad, cat) replaced
    by its argument that moves with ``v``: inside the clamp's range that is its stride."""

    def inner(*args: sympy.Expr) -> sympy.Expr:
        moving = [a for a in args if v in a.free_symbols]
        return moving[0] if len(moving) == 1 else sympy.Min(*args)

    def inner_max(*args: sympy.Expr) -> sympy.Expr:
        moving = [a for a in args if v in a.free_symbols]
        return moving[0] if len(moving) == 1 else sympy.Max(*args)

    return index.replace(sympy.Max, inner_max).replace(sympy.Min, inner)


def _order(sizes: tuple[Any, ...], accesses: list[Access]) -> tuple[int, ...]:
    """A permutation of ``range(len(sizes))``, outermost first: loops of one point first (they
    cost nothing anywhere), then the others by :func:`_inner_first`. The lowered order
    when the loops of more than one point keep their order."""
    keep = tuple(range(len(sizes)))
    long = [d for d in keep if sizes[d] != 1]
    if len(long) < 2:
        return keep
    ranked = _inner_first(long, accesses)[::-1]
    if ranked == long:
        return keep
    return tuple(d for d in keep if sizes[d] == 1) + tuple(ranked)


def _inner_first(dims: list[int], accesses: list[Access]) -> list[int]:
    """``dims`` from innermost out: each time, the loop that beats most of those left (ties:
    the later one, as lowered)."""
    wins = {(a, b): _beats(a, b, accesses) for a in dims for b in dims if a != b}
    rest, out = list(dims), []
    while rest:
        best = max(rest, key=lambda a: (sum(wins[a, b] for b in rest if b != a), a))
        out.append(best)
        rest.remove(best)
    return out


def _beats(a: int, b: int, accesses: list[Access]) -> bool:
    """More bytes move with a smaller stride along loop ``a`` than along ``b`` than the
    other way round: ``a`` belongs inside ``b``. A stride of 0 (the access does not move
    along that loop) or an unknown one casts no vote."""
    for_a = for_b = 0
    for weight, strides in accesses:
        sa, sb = strides[a], strides[b]
        if sa is None or sb is None or sa == 0 or sb == 0:
            continue
        if _less(sa, sb):
            for_a += weight
        elif _less(sb, sa):
            for_b += weight
    return for_a > for_b


def _less(p: Any, q: Any) -> bool:
    """``|p| < |q|`` for every size the guards allow (each symbolic size ``>= 2``)."""
    if isinstance(p, int) and isinstance(q, int):
        return abs(p) < abs(q)
    p, q = (abs(v) if v.is_Number else v for v in (sympy.sympify(p), sympy.sympify(q)))
    found = _monomial_less(p, q)
    if found is not None:
        return found
    return nonnegative(p, least=2) and nonnegative(q - p - 1, least=2)


def _monomial_less(p: Any, q: Any) -> bool | None:
    """:func:`_less` for strides that are monomials ``c * ks0**a * ...`` (``c >= 1``, sizes
    ``>= 2``), without a polynomial proof: when the exponents of ``q / p`` are all
    ``>= 0`` it is smallest where every size is 2, so ``p < q`` holds for every size
    exactly when it holds there; when they are all ``<= 0`` (one ``< 0``) it falls below 1
    for large sizes. None for other forms (mixed signs, sums): the proof decides.

    >>> ks0, ks1 = sympy.symbols("ks0 ks1", integer=True, positive=True)
    >>> _monomial_less(ks0, 2 * ks0), _monomial_less(2 * ks0, ks0 * ks1), _monomial_less(4, ks0)
    (True, False, False)
    >>> _monomial_less(ks0, ks1) is None  # either way round: the proof decides (it cannot)
    True
    """
    mp, mq = _monomial(sympy.sympify(p)), _monomial(sympy.sympify(q))
    if mp is None or mq is None:
        return None
    exps = {s: mq[1].get(s, 0) - mp[1].get(s, 0) for s in mp[1].keys() | mq[1].keys()}
    if all(e >= 0 for e in exps.values()):  # q / p grows with every size: least at 2
        return bool(mq[0] * 2 ** sum(exps.values()) > mp[0])
    if all(e <= 0 for e in exps.values()):  # q / p shrinks towards 0: not below p for all
        return False
    return None


@functools.lru_cache(maxsize=4096)
def _monomial(v: Any) -> tuple[Any, dict[Any, int]] | None:
    """``v`` as ``(c, {size: exponent})``, a whole ``c >= 1`` and positive exponents of
    size symbols; None for any other form."""
    c, factors = v.as_coeff_mul()
    if not (c.is_Integer and c >= 1):
        return None
    powers: dict[Any, int] = {}
    for f in factors:
        base, exp = f.as_base_exp()
        if not (base.is_Symbol and base.is_integer and base.is_positive and exp.is_Integer):
            return None
        if exp < 1:
            return None
        powers[base] = powers.get(base, 0) + int(exp)
    return c, powers
