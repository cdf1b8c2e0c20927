"""Reductions across memory read a copy laid out along their reduce loop.

``x.t().softmax(-1)`` reduces each row of a transposed tensor: a row lies down a column
of memory, 4 KB between elements. Loop order cannot help (the max, the exp and the sum all
run along the row), and the column kernel of the C++ writer takes reductions only, not
a pointwise pass over the same rows. Such a reduction, and every node of its rows reading
the same buffer across memory, instead
reads a copy of the buffer whose reduce dimension is the contiguous one; the copy is a
pointwise node that :mod:`ember.inductor.looporder` tiles (a 16x16 transpose), so it costs
about two passes over memory where the strided kernel missed the cache at every element.
Static sizes only (the copy's index is simplified with the loop bounds as numbers).

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from ember.inductor.lowering import lower_graph
>>> x = torch.randn(128, 64).t()
>>> def f(x):  # a softmax's first two passes, its result laid out row-major
...     return (x - x.amax(-1, keepdim=True)).contiguous()
>>> prog = restage(lower_graph(make_fx(f)(x), [x]))
>>> print("\\n".join(str(n) for n in prog.nodes))
x_1_r[64, 128] = x_1[i0 + 64*i1]
buf0[64] = MAX[128](x_1_r[128*i0 + r0])
buf1[64, 128] = SUB(x_1_r[128*i0 + i1], buf0[i0])
>>> prog = restage(lower_graph(make_fx(lambda x: x.amax(-1))(x), [x]))
>>> print("\\n".join(str(n) for n in prog.nodes))  # alone: a column kernel, no copy
buf0[64] = MAX[128](x_1[i0 + 64*r0])
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Iterator

import sympy  # type: ignore[import-untyped]

from ember.inductor.indexing import simplify_index
from ember.inductor.ir import (
    Buffer,
    Expr,
    I,
    Layout,
    Node,
    Pointwise,
    Program,
    R,
    Reduction,
    load,
    walk,
)
from ember.inductor.looporder import pick_order
from ember.inductor.ops import WELFORD, Op, Reduce

__all__ = ["restage"]

# reductions the column kernel runs along memory when they are alone in their kernel
# (``codegen_tiles.TILEABLE``; defined here, which the scheduler imports before the writer)
COLUMN = frozenset({Reduce.SUM, Reduce.PROD, Reduce.ANY, Reduce.ALL, Reduce.MAX, Reduce.MIN})
COLUMN |= WELFORD | {Reduce.ARGMAX, Reduce.ARGMIN}
MIN_ELEMENTS = 4096  # a smaller buffer stays in cache: no copy


def restage(prog: Program) -> Program:
    """``prog`` with a copy of each buffer that a reduction reads across memory, read by
    that reduction and by the nodes over its rows that read the buffer across memory too."""
    if prog.size_vars is not None:
        return prog  # symbolic sizes: keep the lowered reads
    orig, prog = prog, dataclasses.replace(prog, buffers=dict(prog.buffers))
    copies: dict[str, str] = {}  # buffer -> its copy
    nodes: list[Node] = []
    inner = _Innermost(prog)
    for node in prog.nodes:
        for name in _across(prog, node, inner):
            if name not in copies and isinstance(node, Reduction):
                copies[name] = _copy(prog, name, node, nodes, inner)
        if copies and isinstance(node, Pointwise | Reduction):
            node = _redirect(prog, node, copies, inner)
        nodes.append(node)
    read = {e.arg[0] for n in nodes if isinstance(n, Pointwise | Reduction) for e in walk(n.body)
            if e.op is Op.LOAD}  # fmt: skip
    unread = {c for c in copies.values() if c not in read}  # no read of it simplified
    if len(unread) == len(copies):
        return orig
    nodes = [n for n in nodes if getattr(n, "name", None) not in unread]
    buffers = {k: v for k, v in prog.buffers.items() if k not in unread}
    return dataclasses.replace(prog, nodes=nodes, buffers=buffers)


def _across(prog: Program, node: Node, inner: _Innermost) -> list[str]:
    """Buffers ``node`` (a reduction) reads with a stride along its innermost reduce loop
    while one of its row loops moves along their memory: the rows lie across memory."""
    if not isinstance(node, Reduction) or not node.reduce_ranges or not node.ranges:
        return []
    if node.kind in COLUMN and not _shared(prog, node, inner):
        return []  # the column kernel (codegen_cpp) runs it along memory already
    r = inner(node)
    if r is None:
        return []
    out = []
    for e in _loads(node.body):
        buf = prog.buffers[e.arg[0]]
        if not _static(buf.layout) or buf.layout.numel < MIN_ELEMENTS:
            continue
        index = e.arg[1]
        step = _coeff(index, r)
        rows = [_coeff(index, i) for i in I[: len(node.ranges)]]
        if step is None or abs(step) <= 1 or 1 not in rows:
            continue
        if any(abs(s) == abs(step) and n > 1 for s, n in zip(*_dims(buf.layout), strict=True)):
            out.append(buf.name)  # the reduce loop moves along one of its dimensions
    return out


def _shared(prog: Program, node: Reduction, inner: _Innermost) -> bool:
    """A pointwise node over the same rows reads what ``node`` reads, across memory along
    its innermost loop (a softmax's or layer norm's last pass): the kernel over those rows
    has a pointwise stage, which the column kernel does not run. (Reductions beside it,
    such as layer norm's weight and bias gradients, share one column kernel; the bias
    gradient's column sum beside the pointwise backward over the whole gradient keeps it
    too: their rows differ.)"""
    mine = {e.arg[0] for e in _loads(node.body)}
    for other in inner.readers(mine):
        if other.ranges[: len(node.ranges)] != node.ranges:
            continue
        v = inner(other)
        if v is None:
            continue
        for e in _loads(other.body):
            step = _coeff(e.arg[1], v)
            if e.arg[0] in mine and (step is None or abs(step) > 1):
                return True
    return False


def _copy(prog: Program, name: str, node: Reduction, nodes: list[Node], inner: _Innermost) -> str:
    """Append a node copying ``name`` into a new buffer whose innermost dimension is the one
    ``node``'s reduce loop moves along; returns the copy's name."""
    buf = prog.buffers[name]
    lay = buf.layout
    r = inner(node)
    assert r is not None  # _across found a reduce loop
    step = next(_coeff(e.arg[1], r) for e in _loads(node.body) if e.arg[0] == name) or 0
    along = next(d for d, s in enumerate(lay.strides) if abs(s) == abs(step) and lay.sizes[d] > 1)
    order = sorted(range(len(lay.sizes)), key=lambda d: (d == along, -abs(lay.strides[d])))
    strides = [0] * len(lay.sizes)
    size = 1
    for d in reversed(order):
        strides[d], size = size, size * max(lay.sizes[d], 1)
    new = f"{name}_r"
    while new in prog.buffers:
        new += "_"
    copy = Buffer(new, buf.dtype, Layout(lay.sizes, tuple(strides)))
    prog.buffers[new] = copy
    nodes.append(Pointwise(new, lay.sizes, load(buf, I[: len(lay.sizes)])))
    return new


def _redirect(
    prog: Program, node: Pointwise | Reduction, copies: dict[str, str], innermost: _Innermost
) -> Node:
    """``node`` reading each copied buffer from its copy where that moves its innermost loop
    along memory and the copy's index simplifies to an affine one."""
    inner = innermost(node)
    bounds = dict(zip(I, node.ranges, strict=False))
    if isinstance(node, Reduction):
        bounds |= dict(zip(R, node.reduce_ranges, strict=False))
    swap: dict[Expr, Expr] = {}
    for e in _loads(node.body):
        if e.arg[0] not in copies or inner is None:
            continue
        old = _coeff(e.arg[1], inner)
        if old is None or abs(old) <= 1:
            continue
        copy = prog.buffers[copies[e.arg[0]]]
        index = _index_in(prog.buffers[e.arg[0]].layout, copy.layout, e.arg[1], bounds)
        if index is not None and _coeff(index, inner) == 1:
            swap[e] = Expr(Op.LOAD, e.dtype, (), (copy.name, index, ()))
    if not swap:
        return node
    return dataclasses.replace(node, body=_replace(node.body, swap))


def _index_in(
    src: Layout, dst: Layout, index: sympy.Expr, bounds: dict[sympy.Symbol, int]
) -> sympy.Expr | None:
    """The element at ``index`` of ``src``, indexed in ``dst`` (same sizes): its coordinates
    taken apart by floor/Mod and simplified within ``bounds`` (None: not affine)."""
    dims = sorted(
        (d for d in range(len(src.sizes)) if src.sizes[d] > 1), key=lambda d: src.strides[d]
    )
    reach = 1
    for d in dims:  # the decomposition holds for layouts whose dims do not overlap
        if src.strides[d] < reach:
            return None
        reach = src.strides[d] * src.sizes[d]
    flat = index - src.offset
    out = sympy.Integer(dst.offset)
    for d in dims:
        coord = sympy.Mod(sympy.floor(flat / src.strides[d]), src.sizes[d])
        out += coord * dst.strides[d]
    out = simplify_index(sympy.expand(out), bounds)
    return None if out.has(sympy.floor, sympy.Mod) else out


class _Innermost:
    """:func:`_innermost` of each node of one program, found once, and the pointwise nodes
    reading each buffer: :func:`_shared` asks about every pointwise reader of every
    reduction, which was quadratic in the nodes (a 12-layer GPT-2 spent 24 s here,
    re-deriving the same loop orders)."""

    def __init__(self, prog: Program) -> None:
        self.prog = prog
        self.memo: dict[str, sympy.Symbol | None] = {}
        self.by_buffer: dict[str, list[Pointwise]] = {}
        self.position = {id(n): k for k, n in enumerate(prog.nodes)}
        for node in prog.nodes:
            if isinstance(node, Pointwise):
                for name in {e.arg[0] for e in _loads(node.body)}:
                    self.by_buffer.setdefault(name, []).append(node)

    def __call__(self, node: Pointwise | Reduction) -> sympy.Symbol | None:
        if node.name not in self.memo:
            self.memo[node.name] = _innermost(self.prog, node)
        return self.memo[node.name]

    def readers(self, names: set[str]) -> list[Pointwise]:
        """The pointwise nodes loading one of ``names``, in program order."""
        found = {id(n): n for name in names for n in self.by_buffer.get(name, [])}
        return sorted(found.values(), key=lambda n: self.position[id(n)])


def _innermost(prog: Program, node: Pointwise | Reduction) -> sympy.Symbol | None:
    """The loop variable of ``node`` that the scheduler runs innermost (its loop order,
    :func:`ember.inductor.looporder.pick_order`; with tiles, the one they run along: read
    from the copy, the node runs untiled, and in one kernel with the reduction's rows)."""
    order = pick_order(prog, node)
    if isinstance(node, Reduction):
        return R[order.reduce[-1]] if node.reduce_ranges else None
    return I[order.outer[-1]] if node.ranges else None


def _replace(e: Expr, swap: dict[Expr, Expr]) -> Expr:
    memo: dict[int, Expr] = {}

    def visit(n: Expr) -> Expr:
        if id(n) not in memo:
            args = tuple(visit(a) for a in n.args)
            memo[id(n)] = swap.get(n) or dataclasses.replace(n, args=args)
        return memo[id(n)]

    return visit(e)


def _loads(e: Expr) -> Iterator[Expr]:
    return (n for n in walk(e) if n.op is Op.LOAD and not n.args)


@functools.lru_cache(maxsize=1 << 16)  # the same indices recur in every layer of a stack
def _coeff(index: sympy.Expr, v: sympy.Symbol) -> int | None:
    """The integer step of ``index`` along ``v`` (None: not affine in ``v``)."""
    if v not in index.free_symbols:
        return 0
    if any(v in a.free_symbols for a in index.atoms(sympy.floor, sympy.Mod)):
        return None
    step = sympy.diff(index, v)
    return int(step) if step.is_Integer else None


def _dims(lay: Layout) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return lay.strides, lay.sizes


def _static(lay: Layout) -> bool:
    return all(isinstance(n, int) for n in itertools.chain(lay.sizes, lay.strides, [lay.offset]))
