"""Views as index transformations.

A view of a buffer window stays a buffer window: its layout is read off the
fx node's fake output, which has exactly eager's sizes, strides and storage
offset (valid when the input window has eager's layout). A view of a lazy
value maps the output index to the input index instead.

>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from ember.inductor.lowering import lower_graph
>>> gm = make_fx(lambda x: x.t().exp())(torch.randn(2, 3))
>>> print(lower_graph(gm, [torch.randn(2, 3)]).nodes[0])
buf0[3, 2] = EXP(x_1[i0 + 3*i1])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch

from ember.inductor.ir import Layout
from ember.inductor.lowering import Fallback, Lowerer, Value, lowering
from ember.inductor.reshape import flatten, reshape_index, unflatten

__all__ = ["broadcast", "flatten", "slice_start", "unflatten"]

aten = torch.ops.aten


def _window(ctx: Lowerer, v: Value, delta: int | None = 0) -> Value | None:
    """The view as a new window of ``v``'s buffer, if ``v`` is a window with eager's layout.
    ``delta``: how far the view starts past ``v``'s start, in elements (None: read it off the
    fake values; only ops given an explicit offset need that, since fake values traced from
    real tensors may have lost their storage offsets)."""
    if v.ref is None or ctx.node is None:
        return None
    src = ctx.node.args[0]
    in_meta, out = getattr(src, "meta", {}).get("val"), ctx.meta
    if not isinstance(in_meta, torch.Tensor) or not isinstance(out, torch.Tensor):
        return None
    buf = ctx.buffers[v.ref.name]
    have = v.ref.layout or buf.layout
    if (have.sizes, have.strides) != (ctx.shape(in_meta), ctx.strides(in_meta)):
        return None
    if delta is None:
        delta = ctx.num(out.storage_offset() - in_meta.storage_offset())
    offset = have.offset + delta
    return ctx.buffer_value(buf, Layout(ctx.shape(out), ctx.strides(out), ctx.num(offset)))


def _dim(d: int, n: int) -> int:
    return d + n if d < 0 else d


def slice_start(start: int | None, n: int) -> int:
    """Where a slice of a dimension of size ``n`` starts, as Python clamps ``start``.

    >>> slice_start(None, 5), slice_start(-2, 5), slice_start(9, 5), slice_start(-9, 5)
    (0, 3, 5, 0)
    """
    return 0 if start is None else min(max(start + n if start < 0 else start, 0), n)


def _lazy(v: Value, sizes: Sequence[int], index: Any) -> Value:
    """A lazy view: ``index`` maps an output index to an input index."""
    return Value(tuple(sizes), v.dtype, lambda idx: v.loader(index(list(idx))))


@lowering(aten.permute.default)
def permute(ctx: Lowerer, v: Value, dims: Sequence[int]) -> Value:
    dims = [_dim(d, v.ndim) for d in dims]

    def index(idx: list[sympy.Expr]) -> list[sympy.Expr]:
        out: list[sympy.Expr] = [sympy.Integer(0)] * v.ndim
        for j, d in enumerate(dims):
            out[d] = idx[j]
        return out

    return _window(ctx, v) or _lazy(v, [v.sizes[d] for d in dims], index)


@lowering(aten.t.default)
def t(ctx: Lowerer, v: Value) -> Value:
    return permute(ctx, v, list(reversed(range(v.ndim))))


@lowering(aten.transpose.int)
def transpose(ctx: Lowerer, v: Value, a: int, b: int) -> Value:
    dims = list(range(v.ndim))
    a, b = _dim(a, v.ndim), _dim(b, v.ndim)
    dims[a], dims[b] = dims[b], dims[a]
    return permute(ctx, v, dims)


def broadcast(v: Value, sizes: Sequence[int]) -> Value:
    """``v`` expanded to ``sizes`` (numpy broadcasting from the right)."""
    if tuple(sizes) == v.sizes:
        return v
    lead = len(sizes) - v.ndim

    def index(idx: list[sympy.Expr]) -> list[sympy.Expr]:
        return [sympy.Integer(0) if n == 1 else i for i, n in zip(idx[lead:], v.sizes, strict=True)]

    return _lazy(v, sizes, index)


@lowering(aten.expand.default)
def expand(ctx: Lowerer, v: Value, sizes: Sequence[int], *, implicit: bool = False) -> Value:
    return _window(ctx, v) or broadcast(v, ctx.shape(ctx.meta))


@lowering(aten.slice.Tensor)
def slice_(
    ctx: Lowerer,
    v: Value,
    dim: int = 0,
    start: int | None = None,
    end: int | None = None,
    step: int = 1,
) -> Value:
    d = _dim(dim, v.ndim)
    n = v.sizes[d]
    lo = slice_start(start, n)
    sizes = list(ctx.shape(ctx.meta))

    def index(idx: list[sympy.Expr]) -> list[sympy.Expr]:
        return [*idx[:d], lo + idx[d] * step, *idx[d + 1 :]]

    return _window(ctx, v, lo * _stride(ctx, v, d)) or _lazy(v, sizes, index)


@lowering(aten.select.int)
def select(ctx: Lowerer, v: Value, dim: int, i: int) -> Value:
    d = _dim(dim, v.ndim)
    i = i + v.sizes[d] if i < 0 else i

    def index(idx: list[sympy.Expr]) -> list[sympy.Expr]:
        return [*idx[:d], sympy.sympify(i), *idx[d:]]

    return _window(ctx, v, i * _stride(ctx, v, d)) or _lazy(v, ctx.shape(ctx.meta), index)


def _stride(ctx: Lowerer, v: Value, d: int) -> int:
    """The stride of ``v``'s dimension ``d`` if ``v`` is a window (else unused: 0)."""
    if v.ref is None:
        return 0
    return (v.ref.layout or ctx.buffers[v.ref.name].layout).strides[d]


@lowering(aten.unsqueeze.default)
def unsqueeze(ctx: Lowerer, v: Value, dim: int) -> Value:
    d = _dim(dim, v.ndim + 1)

    def index(idx: list[sympy.Expr]) -> list[sympy.Expr]:
        return idx[:d] + idx[d + 1 :]

    return _window(ctx, v) or _lazy(v, ctx.shape(ctx.meta), index)


@lowering(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def squeeze(ctx: Lowerer, v: Value, dims: int | Sequence[int] | None = None) -> Value:
    if dims is None:
        dims = range(v.ndim)
    dims = [_dim(d, v.ndim) for d in ([dims] if isinstance(dims, int) else dims)]
    gone = {d for d in dims if v.sizes[d] == 1}

    def index(idx: list[sympy.Expr]) -> list[sympy.Expr]:
        it = iter(idx)
        return [sympy.Integer(0) if d in gone else next(it) for d in range(v.ndim)]

    return _window(ctx, v) or _lazy(v, ctx.shape(ctx.meta), index)


@lowering(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def view(ctx: Lowerer, v: Value, sizes: Sequence[int]) -> Value:
    window = _window(ctx, v)
    if window is not None:
        return window
    out = ctx.shape(ctx.meta)
    return _lazy(v, out, lambda idx: reshape_index(idx, out, v.sizes))


@lowering(aten.as_strided.default, aten.diagonal.default, aten.unfold.default)
def as_strided(ctx: Lowerer, v: Value, *args: Any, **kwargs: Any) -> Value:
    window = _window(ctx, v, None)
    if window is None:
        raise Fallback("a strided view of a computed value")
    return window


@lowering(torch.ops.prims.broadcast_in_dim.default)
def broadcast_in_dim(ctx: Lowerer, a: Value, shape: Sequence[int], dims: Sequence[int]) -> Value:
    def index(idx: Sequence[sympy.Expr]) -> list[sympy.Expr]:
        return [sympy.Integer(0) if a.sizes[j] == 1 else idx[d] for j, d in enumerate(dims)]

    return Value(ctx.shape(ctx.meta), a.dtype, lambda idx: a.loader(index(idx)))


@lowering(aten.alias.default, aten.detach.default)
def alias(ctx: Lowerer, v: Value) -> Value:
    return v
