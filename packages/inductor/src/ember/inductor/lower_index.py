"""Lowerings of gathers: ``embedding``, ``index_select``, ``gather`` and ``x[i, j]``
(``aten.index.Tensor`` with integer index tensors).

Each reads its table through an *indirect* load: a LOAD whose operands are the index
values, bound to symbols (``ind``, ``ind0``, ...) inside its flat index. Kernels clamp
every index into the table; eager raises for one out of range, so each lowering first asks
:func:`ember.inductor.lower_checks.checked` to check its index tensors (an input in the
wrapper, an ``arange`` by its ends, constants now) or falls back to the aten call. An
index of positions known to lie in range (``arange``) needs no load: ``x[i, j]`` reads
the table there, as a view does.

>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from ember.inductor.lowering import lower_graph
>>> def f(x):  # the mask a causal language model builds: positions gathered twice
...     b, q = torch.arange(2).view(2, 1, 1), torch.arange(3).view(1, 3, 1)
...     return x[b, q] <= x[b, q.view(1, 1, 3)]
>>> x = torch.arange(6).view(2, 3)
>>> prog = lower_graph(make_fx(f)(x), [x])
>>> print(prog.nodes[-1])
buf0[2, 3, 3] = LE(x_1[3*i0 + i1], x_1[3*i0 + i2])
>>> prog.index_checks  # each arange's ends lie in its dimension: nothing left to check
[]
>>> g = make_fx(lambda x, i: x[i, -1])(x, torch.tensor([1, 0]))
>>> prog = lower_graph(g, [x, torch.tensor([1, 0])])
>>> print(prog.nodes[-1]), [str(c) for c in prog.index_checks]
buf0[2] = x_1[3*ind0 + 2]
(None, ['check -2 <= i_1 < 2 else IndexError'])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch

from ember.inductor.ir import Expr, I, const
from ember.inductor.lower_checks import checked, positional
from ember.inductor.lower_ops import _ADD, _MAX, _MIN, cast, where_
from ember.inductor.lower_views import broadcast
from ember.inductor.lowering import Fallback, Lowerer, Value, lowering
from ember.inductor.ops import Op

__all__ = ["indirect", "wrap_index"]

aten = torch.ops.aten
INTEGER_INDEX = frozenset({torch.int64, torch.int32})


def indirect(ctx: Lowerer, table: Value, dim: int, index: Expr) -> Callable[..., Expr]:
    """A loader of ``table`` whose index along ``dim`` is the value ``index`` (clamped)."""
    ref = ctx.realize(table)
    buf = ctx.buffers[ref.name]
    layout = ref.layout or buf.layout
    pos = wrap_index(index, table.sizes[dim], negative=False)

    def load_at(idx: Sequence[sympy.Expr]) -> Expr:
        flat = sympy.expand(layout.index([*idx[:dim], IND, *idx[dim:]]))
        return Expr(Op.LOAD, buf.dtype, (pos,), (buf.name, flat, (IND,)))

    return load_at


IND = sympy.Symbol("ind", integer=True)  # an indirect index inside a LOAD's flat index


def wrap_index(index: Expr, n: int, *, negative: bool = True) -> Expr:
    """``index`` as int64, negative values counted from the end (where eager accepts them:
    ``x[i]``; gathers reject them, and the range check runs first), clamped into ``[0, n)``
    so that no value reads outside the table.

    >>> i = Expr(Op.INDEX, torch.int64, (), sympy.Symbol("i0"))
    >>> print(wrap_index(i, 4))
    MIN(MAX(WHERE(LT((i0), 0), ADD((i0), 4), (i0)), 0), 3)
    >>> print(wrap_index(i, 4, negative=False))
    MIN(MAX((i0), 0), 3)
    """
    i = cast(index, torch.int64)
    zero = const(0, torch.int64)
    if negative:
        i = where_(Expr(Op.LT, torch.bool, (i, zero)), _ADD(i, _count(n)), i)
    return _MIN(_MAX(i, zero), _count(n - 1))


def _count(n: Any) -> Expr:
    """The int64 leaf of size ``n``: a constant, or computed from the size arguments."""
    return const(n, torch.int64) if isinstance(n, int) else Expr(Op.INDEX, torch.int64, (), n)


@lowering(aten.index_select.default, aten.embedding.default)
def index_select(ctx: Lowerer, a: Value, dim_or_idx: Any, idx: Any = None) -> Value:
    assert ctx.node is not None
    if ctx.node.target is aten.embedding.default:
        a, dim, idx = a, 0, dim_or_idx
    else:
        dim = dim_or_idx % a.ndim
    if not isinstance(idx, Value) or idx.dtype not in INTEGER_INDEX:
        raise Fallback("index is not an integer tensor")
    checked(ctx, idx, a.sizes[dim], "IndexError", "index out of range in self")
    out = ctx.meta
    k = idx.ndim

    def loader(ix: Sequence[sympy.Expr]) -> Expr:
        pos = idx.loader(ix[dim : dim + k]) if k else idx.loader([])
        rest = [*ix[:dim], *ix[dim + k :]]
        return indirect(ctx, a, dim, pos)(rest)

    return Value(ctx.shape(out), out.dtype, loader)


@lowering(aten.gather.default)
def gather(ctx: Lowerer, a: Value, dim: int, idx: Value, *, sparse_grad: bool = False) -> Value:
    d = dim % max(a.ndim, 1)
    if a.ndim == 0:
        raise Fallback("gather on a scalar")
    message = f"index {{index}} is out of bounds for dimension {d} with size {{size}}"
    checked(ctx, idx, a.sizes[d], "RuntimeError", message)
    out = ctx.meta
    ref = ctx.realize(a)
    buf = ctx.buffers[ref.name]
    layout = ref.layout or buf.layout

    def loader(ix: Sequence[sympy.Expr]) -> Expr:
        pos = wrap_index(idx.loader(ix), a.sizes[d], negative=False)
        flat = sympy.expand(layout.index([*ix[:d], IND, *ix[d + 1 :]]))
        return Expr(Op.LOAD, buf.dtype, (pos,), (buf.name, flat, (IND,)))

    return Value(ctx.shape(out), out.dtype, loader)


@lowering(aten.index.Tensor)
def index(ctx: Lowerer, a: Value, indices: Sequence[Any]) -> Value:
    """``a[i, j]``: numpy's advanced indexing with integer tensors, which broadcast together.

    The broadcast index shape takes the place of the indexed dimensions when those are
    adjacent (``a[:, i, j]``), else it comes first (``a[i, :, j]``); the other dimensions
    keep their order. A ``None`` entry keeps its dimension whole. Negative indices count
    from the end, as in eager; one outside ``[-size, size)`` raises eager's IndexError
    (numbering the dimension among the indexed ones, as eager's message does). Boolean
    masks run as the aten call: their result's size depends on the data."""
    picked = [(d, t) for d, t in enumerate(indices) if t is not None]
    if not picked or a.ndim == 0:
        raise Fallback("nothing indexed, or a scalar table")
    if any(not isinstance(t, Value) or t.dtype not in INTEGER_INDEX for _, t in picked):
        raise Fallback("a boolean mask or a non-tensor index")
    dims = [d for d, _ in picked]
    kept = [d for d in range(a.ndim) if d not in dims]
    out = ctx.meta
    sizes = ctx.shape(out)
    first = dims[0] if dims == list(range(dims[0], dims[-1] + 1)) else 0
    block = len(sizes) - len(kept)  # the broadcast index shape's rank
    shape = sizes[first : first + block]
    if block < max(t.ndim for _, t in picked):
        raise Fallback("an index shape that does not broadcast as expected")
    for k, (d, t) in enumerate(picked):
        message = f"index {{index}} is out of bounds for dimension {k} with size {{size}}"
        checked(ctx, t, a.sizes[d], "IndexError", message, wraps=True)
    spread = [broadcast(t, shape) for _, t in picked]
    # an index of positions (``arange``) known in range reads the table there, as a view
    # would; any other is an indirect load, its value bound to symbol ``ind<k>``
    direct = [positional(t, a.sizes[d]) for (d, _), t in zip(picked, spread, strict=True)]
    symbols = tuple(sympy.Symbol(f"ind{k}", integer=True) for k in range(len(picked)))
    ref = None if all(e is not None for e in direct) else ctx.realize(a)

    def loader(ix: Sequence[sympy.Expr]) -> Expr:
        at = dict(zip(kept, [*ix[:first], *ix[first + block :]], strict=True))
        where = dict(zip(I[:block], ix[first : first + block], strict=False))
        pos, bound = [], []
        for (d, _), t, e, s in zip(picked, spread, direct, symbols, strict=True):
            if e is not None:
                at[d] = e.xreplace(where)
            else:
                at[d] = s
                pos.append(wrap_index(t.loader(list(where.values())), a.sizes[d]))
                bound.append(s)
        full = [at[d] for d in range(a.ndim)]
        if ref is None:
            return a.loader(full)
        layout = ref.layout or ctx.buffers[ref.name].layout
        flat = sympy.expand(layout.index(full))
        return Expr(Op.LOAD, a.dtype, tuple(pos), (ref.name, flat, tuple(bound)))

    return Value(sizes, out.dtype, loader)
