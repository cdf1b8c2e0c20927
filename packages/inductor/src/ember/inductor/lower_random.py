"""Lowerings of random ops to counter-based random numbers (:mod:`ember.inductor.philox`).

By default random ops keep torch's kernels, so a compiled program draws exactly
eager's numbers (dropout masks included). With the option
``fallback_random=False`` they are lowered here instead: each op draws one
seed from torch's default generator per call (an extern ``randint``), and each
element's number is ``rand(seed, offset)`` with ``offset`` its position in the
output, so the numbers fuse into the kernels that use them and any kernel that
recomputes one gets the same value.

>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from ember.inductor.lowering import lower_graph
>>> def f(x):
...     y, mask = torch.ops.aten.native_dropout.default(x, 0.5, True)
...     return y + 1
>>> print(lower_graph(make_fx(f)(torch.randn(4)), [torch.randn(4)], fused_random=True))
inputs: x_1
  x_1: float32[4] strides [1]
  buf0: int64[1] strides [1]
  buf1: float32[4] strides [1]
buf0 = extern aten.randint.low(0, 4611686018427387904, [1])
buf1[4] = ADD(MUL(MUL(x_1[i0], CAST.float32(GE(RAND(buf0[0], (i0)), 0.5))), 2.0), 1.0)
outputs: buf1
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch

from ember.inductor.ir import Expr, Extern, Layout, const, load
from ember.inductor.lower_ops import cast
from ember.inductor.lowering import Fallback, Lowerer, Value, lowering
from ember.inductor.ops import Op

__all__ = ["SEED_HIGH", "random_values"]

aten = torch.ops.aten
SEED_HIGH = 1 << 62  # seeds are drawn from [0, SEED_HIGH)


def _seed(ctx: Lowerer) -> Expr:
    """A fresh int64 seed, drawn from torch's default generator at each call."""
    buf = ctx.new_buffer(torch.int64, Layout.contiguous((1,)))
    ctx.nodes.append(
        Extern((buf.name,), aten.randint.low, (0, SEED_HIGH, [1]), {"dtype": torch.int64})
    )
    return load(buf, (sympy.Integer(0),))


def random_values(ctx: Lowerer, op: Op, sizes: Sequence[int], dtype: torch.dtype) -> Value:
    """A tensor of ``sizes`` whose elements are ``op`` (RAND or RANDN) of one fresh seed."""
    if not ctx.fused_random:
        raise Fallback("random ops keep torch's kernels (fallback_random)")
    seed = _seed(ctx)
    strides = Layout.contiguous(tuple(sizes)).strides

    def loader(idx: Sequence[sympy.Expr]) -> Expr:
        offset = sum((i * s for i, s in zip(idx, strides, strict=True)), sympy.Integer(0))
        number = Expr(op, torch.float32, (seed, Expr(Op.INDEX, torch.int64, (), offset)))
        return cast(number, dtype)

    return Value(tuple(sizes), dtype, loader)


def _float_dtype(ctx: Lowerer) -> torch.dtype:
    dtype: torch.dtype = ctx.meta.dtype
    if not dtype.is_floating_point:
        raise Fallback(f"random {dtype}")
    return dtype


@lowering(aten.rand.default, aten.rand_like.default)
def rand(ctx: Lowerer, *args: Any, **kwargs: Any) -> Value:
    return random_values(ctx, Op.RAND, ctx.shape(ctx.meta), _float_dtype(ctx))


@lowering(aten.randn.default, aten.randn_like.default)
def randn(ctx: Lowerer, *args: Any, **kwargs: Any) -> Value:
    return random_values(ctx, Op.RANDN, ctx.shape(ctx.meta), _float_dtype(ctx))


def _compare(ctx: Lowerer, cmp: Op, p: Any, sizes: Sequence[int]) -> Value:
    """A bool mask: ``cmp(u, p)`` for a fresh uniform number ``u`` per element."""
    if not isinstance(p, float | int) or isinstance(p, bool):
        raise Fallback("a probability tensor")
    u = random_values(ctx, Op.RAND, sizes, torch.float32)
    threshold = const(float(p), torch.float32)
    return Value(
        tuple(sizes), torch.bool, lambda idx: Expr(cmp, torch.bool, (u.loader(idx), threshold))
    )


@lowering(aten.bernoulli.p)
def bernoulli(ctx: Lowerer, a: Value, p: Any = 0.5, **kwargs: Any) -> Value:
    hit = _compare(ctx, Op.LT, p, a.sizes)  # P(u < p) = p
    dtype = ctx.meta.dtype
    return Value(a.sizes, dtype, lambda idx: cast(hit.loader(idx), dtype))


@lowering(aten.native_dropout.default)
def native_dropout(ctx: Lowerer, a: Value, p: float, train: bool | None) -> tuple[Value, Value]:
    if not train or not 0.0 < p < 1.0 or a.dtype not in (torch.float32, torch.float64):
        raise Fallback("dropout that keeps or drops everything")
    keep = _compare(ctx, Op.GE, p, a.sizes)  # kept with probability 1 - p
    scale = const(1.0 / (1.0 - p), a.dtype)

    def out(idx: Sequence[sympy.Expr]) -> Expr:
        kept = Expr(Op.MUL, a.dtype, (a.loader(idx), cast(keep.loader(idx), a.dtype)))
        return Expr(Op.MUL, a.dtype, (kept, scale))

    return Value(a.sizes, a.dtype, out), keep
