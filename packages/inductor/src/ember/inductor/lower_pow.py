"""``aten.pow.Scalar`` (a number raised to a tensor) as a pointwise op in the kernels.

Optimizers compute their bias corrections as ``beta ** step`` on step tensors
(``torch._foreach_pow(beta, steps)`` in Adam's foreach form, written as one op per
tensor by ember's capture): as an extern call each costs a Python call and an aten
dispatch (about 3 us, 106 of them in an AdamW step over GPT's 53 parameters), where in a
kernel it is one ``pow`` beside the ops that read it.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from ember.inductor.lowering import lower_graph
>>> from ember.inductor.scheduler import schedule
>>> step = torch.tensor(3.0)
>>> gm = make_fx(lambda s: 1 - torch.pow(0.9, s))(step)
>>> print(schedule(lower_graph(gm, [step])))
kernel0 over []
  stage []: buf0[0] = SUB(1.0, POW(0.9, s_1[0]))
"""

from __future__ import annotations

from typing import Any

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as KIND

from ember.inductor.lower_ops import FLOAT_ONLY, _bin, pointwise
from ember.inductor.lowering import Lowerer, Value, lowering
from ember.inductor.ops import Op

aten = torch.ops.aten

_POW = _bin(Op.POW)
FLOAT_ONLY.add(_POW)  # (an integer power of an integer: aten's kernel)


@lowering(aten.pow.Scalar, scalars=True)
def pow_scalar(ctx: Lowerer, base: Any, exponent: Any) -> Value:
    """``base ** exponent`` for a number ``base`` and a tensor ``exponent``."""
    return pointwise(ctx, _POW, base, exponent, kind=KIND.BOOL_TO_LONG)
