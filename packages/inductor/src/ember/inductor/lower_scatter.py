"""Lowering of ``slice_scatter``: the backward of slicing, as a select over the output.

``slice_scatter(input, src, dim, start, end, step)`` is ``input`` with ``src`` written over
the slice ``start:end:step`` of ``dim``. Autograd makes one for every slice a forward takes
(Llama's ``rotate_half`` takes two per query and per key: eight in a two-layer model's
backward), each into a tensor of zeros, and adds them up. As aten calls each allocates and
fills its output; lowered, each output point selects ``src`` inside the slice and ``input``
outside, which fuses with the add, and :mod:`ember.inductor.piecewise` cuts the innermost
loop at the slice's ends so each piece reads one operand.

>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from ember.inductor.lowering import lower_graph
>>> z, s = torch.zeros(2, 6), torch.ones(2, 3)
>>> gm = make_fx(lambda z, s: torch.slice_scatter(z, s, 1, 2, 5))(z, s)
>>> print(lower_graph(gm, [z, s]).nodes[0])  # doctest: +NORMALIZE_WHITESPACE
buf0[2, 6] = WHERE(AND(GE((i1), (2)), LT((i1), (5))),
                   s_1[3*i0 + Min(2, Max(0, i1 - 2))], z_1[6*i0 + i1])
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy  # type: ignore[import-untyped]
import torch

from ember.inductor.ir import Expr
from ember.inductor.lower_ops import _clamp, _index, cast
from ember.inductor.lower_views import slice_start
from ember.inductor.lowering import Fallback, Lowerer, Value, lowering
from ember.inductor.ops import Op

__all__: list[str] = []

aten = torch.ops.aten


@lowering(aten.slice_scatter.default)
def slice_scatter(
    ctx: Lowerer,
    a: Value,
    src: Value,
    dim: int = 0,
    start: int | None = None,
    end: int | None = None,
    step: int = 1,
) -> Value:
    out = ctx.meta
    d = dim % a.ndim
    n = a.sizes[d]
    if not isinstance(n, int) or step != 1:
        raise Fallback("slice_scatter of a symbolic size or with a step")
    lo = slice_start(start, n)
    hi = max(slice_start(end, n), lo) if end is not None else n
    if hi <= lo:
        return a  # an empty slice: the input as it is
    if src.sizes[d] != hi - lo:
        raise Fallback("slice_scatter whose source does not fill the slice")

    def loader(idx: Sequence[sympy.Expr]) -> Expr:
        i = idx[d]
        inside = Expr(
            Op.AND,
            torch.bool,
            (
                Expr(Op.GE, torch.bool, (_index(i), _index(sympy.Integer(lo)))),
                Expr(Op.LT, torch.bool, (_index(i), _index(sympy.Integer(hi)))),
            ),
        )
        value = cast(src.loader([*idx[:d], _clamp(i - lo, hi - lo), *idx[d + 1 :]]), out.dtype)
        return Expr(Op.WHERE, out.dtype, (inside, value, cast(a.loader(list(idx)), out.dtype)))

    return Value(ctx.shape(out), out.dtype, loader)
