"""Lowering of nearest-neighbour resizing (``upsample_nearest1d/2d/3d``), a UNet's upsampler.

Eager picks each output point's source along a resized dim as aten's ``nearest_idx`` does:
the same index when the sizes agree, ``o >> 1`` at twice the size, else
``min(floorf(o * scale), in - 1)`` in float32, with ``scale = (float)(1 / scale_factor)``
when a factor was given and ``(float)in / out`` when not. The float product can round
either way, so the lowering computes that table at compile time and uses the exact
index arithmetic ``floor(o * in / out)`` only where it agrees at every point (always, for
the factor 2 and for downsampling by whole factors); a dim where it does not runs the node
as the aten call. torch's own decomposition computes the table in the graph instead
and gathers with it (an ``index`` call here, since a computed index cannot be checked).

>>> _source(4, 8, None), _source(3, 7, None), _source(5, 3, 1.7)
(floor(i0/2), floor(3*i0/7), None)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import sympy  # type: ignore[import-untyped]
import torch

from ember.inductor.ir import I
from ember.inductor.lowering import Fallback, Lowerer, Value, lowering

__all__: list[str] = []

aten = torch.ops.aten


def _source(n_in: int, n_out: int, factor: float | None, i: sympy.Expr = I[0]) -> Any:
    """The source index along one dim as exact arithmetic of the output index ``i``, or
    None where aten's float32 rounding makes it differ from ``floor(i * in / out)``."""
    o = np.arange(n_out, dtype=np.int64)
    if n_out == n_in:
        table = o
    elif n_out == 2 * n_in:
        table = o >> 1
    else:
        scale = np.float32(1.0 / factor) if factor else np.float32(n_in) / np.float32(n_out)
        table = np.minimum(np.floor(o.astype(np.float32) * scale).astype(np.int64), n_in - 1)
    if not np.array_equal(table, (o * n_in) // n_out):
        return None
    return sympy.floor(i * sympy.Rational(n_in, n_out))


def _factors(args: Sequence[Any], k: int) -> list[float | None]:
    """The scale factors of an ``upsample_nearest`` call: ``.vec``'s list, or the
    ``.default`` overload's ``scales_*`` arguments (one per resized dim)."""
    if len(args) == 1 and (args[0] is None or isinstance(args[0], list | tuple)):
        return list(args[0]) if args[0] is not None else [None] * k
    return [*args, *[None] * (k - len(args))]


@lowering(
    aten.upsample_nearest1d.default, aten.upsample_nearest1d.vec,
    aten.upsample_nearest2d.default, aten.upsample_nearest2d.vec,
    aten.upsample_nearest3d.default, aten.upsample_nearest3d.vec,
)  # fmt: skip
def upsample_nearest(ctx: Lowerer, a: Value, output_size: Any, *scales: Any) -> Value:
    out = ctx.meta
    k = a.ndim - 2  # the resized dims are the last ones, after batch and channels
    factors = _factors(scales, k)
    sizes_in, sizes_out = a.sizes[2:], ctx.shape(out)[2:]
    if not all(isinstance(n, int) for n in (*sizes_in, *sizes_out)):
        raise Fallback("nearest upsampling with symbolic sizes")
    sources = []
    for d, (n_in, n_out, factor) in enumerate(zip(sizes_in, sizes_out, factors, strict=True)):
        src = _source(n_in, n_out, factor, I[0])
        if src is None:
            raise Fallback(f"nearest upsampling of dim {d + 2}: aten's float32 index rounds")
        sources.append(src)

    def loader(idx: Sequence[sympy.Expr]) -> Any:
        at = [s.xreplace({I[0]: i}) for s, i in zip(sources, idx[2:], strict=True)]
        return a.loader([*idx[:2], *at])

    return Value(ctx.shape(out), out.dtype, loader)
