"""Lowering of ``argmax``/``argmin``: along a dim, one ordered reduction; over all elements,
two order-free ones.

``x.argmax()`` is the first position, in logical (row-major) order, of the largest value
(NaN counts as largest). One reduction that carries value and position must visit the
elements in that order and keeps a branch per element: a scalar loop, 0.9 ms over 1M
floats, and over a transposed input 3.3 ms (the flat index unravelled per element and a
4 KB stride between neighbours). Over all elements it is two reductions instead, each in
any order, so each runs in memory order and in vector lanes: the largest value ``m``
(NaN if there is one), then the least logical position holding ``m`` (or a NaN):
``min(where(x == m || x != x, position, numel))``. That is the first maximum: a NaN exists
only when ``m`` is NaN, and ``x == m`` is false for every value then. The Triton printer
keeps the one ordered reduction: it splits that across programs (``triton_split``), which it
cannot do for a reduction that reads another's result.

>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from ember.inductor.lowering import lower_graph
>>> x = torch.randn(4, 3)
>>> for node in lower_graph(make_fx(lambda x: x.argmax())(x), [x]).nodes:
...     print(node)  # doctest: +NORMALIZE_WHITESPACE
buf0[] = MAX[4, 3](x_1[3*r0 + r1])
buf1[] = MIN[4, 3](WHERE(OR(EQ(x_1[3*r0 + r1], buf0[0]), NE(x_1[3*r0 + r1],
    x_1[3*r0 + r1])), (3*r0 + r1), (12)))
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import sympy  # type: ignore[import-untyped]
import torch

from ember.inductor.ir import Expr, Layout
from ember.inductor.lower_ops import _compute, _reduce, cast
from ember.inductor.lower_views import unflatten
from ember.inductor.lowering import Fallback, Lowerer, Value, lowering
from ember.inductor.ops import Op, Reduce

__all__: list[str] = []

aten = torch.ops.aten

# the reduction that finds the extreme value an arg-reduction over everything looks for
_EXTREME = {Reduce.ARGMAX: Reduce.MAX, Reduce.ARGMIN: Reduce.MIN}


@lowering(aten.argmax.default, aten.argmin.default)
def argmax(ctx: Lowerer, a: Value, dim: int | None = None, keepdim: bool = False) -> Value:
    assert ctx.node is not None
    kind = Reduce.ARGMAX if "argmax" in str(ctx.node.target) else Reduce.ARGMIN
    if a.ndim == 0:
        raise Fallback("argmax of a scalar")
    if dim is not None:
        return _reduce(ctx, kind, a, dim, keepdim, _compute(a.dtype))
    if ctx.printer != "cpp":  # one ordered reduction, which Triton splits across programs
        flat = Value(
            (math.prod(a.sizes),), a.dtype, lambda idx: a.loader(unflatten(idx[0], a.sizes))
        )
        return _reduce(ctx, kind, flat, 0, keepdim, _compute(a.dtype))
    if a.dtype == torch.bool:  # no eager kernel (eager_kernels runs the aten call)
        raise Fallback("argmax of bool")
    if math.prod(a.sizes) == 0:  # eager raises: no position to return
        raise Fallback("argmax of an empty tensor")
    first = first_extreme(ctx, kind, a)
    if keepdim:
        return Value((1,) * a.ndim, first.dtype, lambda idx: first.loader([]))
    return first


def first_extreme(ctx: Lowerer, kind: Reduce, a: Value) -> Value:
    """The logical position of the first largest (``ARGMAX``) or smallest value of ``a``,
    or of its first NaN: an extreme value over all elements, then the least position that
    holds it."""
    acc = _compute(a.dtype)
    extreme = _reduce(ctx, _EXTREME[kind], a, None, False, acc, out=acc)
    numel = Expr(Op.INDEX, torch.int64, (), sympy.sympify(math.prod(a.sizes)))

    def position(idx: Sequence[sympy.Expr]) -> Expr:
        v = cast(a.loader(idx), acc)
        hit = Expr(Op.EQ, torch.bool, (v, extreme.loader([])))
        if acc.is_floating_point:  # the first NaN, when the extreme is NaN
            hit = Expr(Op.OR, torch.bool, (hit, Expr(Op.NE, torch.bool, (v, v))))
        at = Expr(Op.INDEX, torch.int64, (), Layout.contiguous(a.sizes).index(idx))
        return Expr(Op.WHERE, torch.int64, (hit, at, numel))

    positions = Value(a.sizes, torch.int64, position)
    return _reduce(ctx, Reduce.MIN, positions, None, False, torch.int64, out=torch.int64)
