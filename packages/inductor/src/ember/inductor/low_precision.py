"""Half and bfloat16 operands, rounded where eager rounds them.

Eager computes a half/bfloat16 op in float, but TensorIterator first casts every operand
to the op's common dtype: ``x_bf16 + 0.3`` adds bf16(0.3) = 0.30078125, not 0.3. Mul and
div are the exception: they read a number or a 0-dim operand at its own precision.
:func:`pointwise <ember.inductor.lower_ops.pointwise>` wraps such operands' loaders in
:func:`rounded`.

>>> import torch
>>> from ember.inductor.ir import const
>>> rounded(lambda idx: const(0.3, torch.float32), torch.bfloat16)([]).arg
0.30078125
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch

from ember.inductor.ir import Expr, const
from ember.inductor.lowering import Value
from ember.inductor.ops import Op

__all__ = ["LOW", "rounded", "to_common"]

LOW = (torch.float16, torch.bfloat16)
OPMATH_SCALAR = frozenset({"mul", "div"})  # names of the ops that keep a number's digits

Loader = Callable[[Sequence[sympy.Expr]], Expr]


def to_common(fn: Callable[..., Expr], a: Any, low: torch.dtype) -> bool:
    """Whether eager rounds operand ``a`` of ``fn`` to the common dtype ``low`` first.

    >>> to_common(lambda x, y: x, 0.3, torch.bfloat16)  # an add, say
    True
    """
    if isinstance(a, Value) and a.dtype == low:
        return False
    scalar_like = not isinstance(a, Value) or a.ndim == 0
    return not (scalar_like and getattr(fn, "__name__", "") in OPMATH_SCALAR)


def rounded(load: Loader, low: torch.dtype) -> Loader:
    """``load``, whose values (in the computation dtype) are rounded to ``low``; see the
    module's example."""

    def loader(idx: Sequence[sympy.Expr]) -> Expr:
        e = load(idx)
        if e.op is Op.CONST and isinstance(e.arg, float):  # a cast would keep its digits
            return const(torch.tensor(e.arg, dtype=low).item(), e.dtype)
        return Expr(Op.CAST, e.dtype, (Expr(Op.CAST, low, (e,)),))

    return loader
