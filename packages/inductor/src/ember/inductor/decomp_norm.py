"""Layer norm written for the decomposition table, in the fewest ops torch's tracer sees.

torch's reference decomposition of ``native_layer_norm`` (``torch._refs``) goes through
``var_mean``, ``_reduction`` and ``broadcast_in_dim``: its graph is ``prims.var``,
``prims.sum``, a ``div``, then ``unsqueeze`` + ``expand`` for each statistic and the
arithmetic. With symbolic sizes every helper on that path computes with ``SymInt``s
(dims canonicalised, shapes broadcast, contiguity rechecked on each intermediate):
about 1,100 ``SymNode`` operations for one layer norm, which is most of the aot trace's
cost on a transformer. This one emits the same graph minus the ``expand`` nodes (a
``keepdim`` statistic already has the broadcast shape) and does only the size
arithmetic the graph needs: the same ops in the same order, so the kernels ember
generates and their numbers are unchanged.

>>> x, w, b = torch.randn(2, 3, 4), torch.randn(4), torch.randn(4)
>>> out, mean, rstd = native_layer_norm(x, [4], w, b, 1e-5)
>>> want = torch.ops.aten.native_layer_norm(x, [4], w, b, 1e-5)
>>> all(torch.allclose(g, e, atol=1e-6) for g, e in zip((out, mean, rstd), want))
True
>>> mean.shape
torch.Size([2, 3, 1])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["native_layer_norm"]

aten = torch.ops.aten
prims = torch.ops.prims

# what half and bfloat16 statistics are computed in (torch's computation dtype)
_WIDER = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
# devices whose kernel returns mean and rstd in the input's dtype (CUDA keeps float32)
_STATS_IN_INPUT_DTYPE = ("cpu", "mtia")


def native_layer_norm(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> Any:
    """``aten.native_layer_norm`` as ``prims.var``/``prims.sum`` and pointwise ops.

    Returns ``NotImplemented`` (``make_fx`` then records the op itself, whose kernel
    raises eager's error) for what eager rejects: complex input, or a ``normalized_shape``
    that is not the input's trailing sizes.
    """
    n_dims = len(normalized_shape)
    if x.is_complex() or n_dims < 1 or x.ndim < n_dims:
        return NotImplemented
    trailing = x.shape[x.ndim - n_dims :]
    if any(s is not n and s != n for s, n in zip(trailing, normalized_shape, strict=True)):
        return NotImplemented
    if not x.is_contiguous():  # eager's outputs are contiguous, as the reference's are
        x = aten.clone.default(x, memory_format=torch.contiguous_format)
    dims = list(range(x.ndim - n_dims, x.ndim))
    acc = x
    if x.dtype in _WIDER:
        acc = prims.convert_element_type.default(x, _WIDER[x.dtype])
    count = 1
    for d in dims:
        count = count * x.shape[d]
    var = prims.var.default(acc, dims, 0.0)
    mean = prims.div.default(prims.sum.default(acc, dims), torch.sym_float(count))  # type: ignore[no-untyped-call]
    for d in dims:  # keepdim: the statistics broadcast against the input as they are
        var = aten.unsqueeze.default(var, d)
        mean = aten.unsqueeze.default(mean, d)
    rstd = aten.rsqrt.default(aten.add.Tensor(var, eps))
    out = aten.mul.Tensor(aten.sub.Tensor(acc, mean), rstd)
    if weight is not None:
        out = aten.mul.Tensor(out, weight)
    if bias is not None:
        out = aten.add.Tensor(out, bias)
    if acc.dtype != x.dtype:
        out = prims.convert_element_type.default(out, x.dtype)
        if x.device.type in _STATS_IN_INPUT_DTYPE:
            mean = prims.convert_element_type.default(mean, x.dtype)
            rstd = prims.convert_element_type.default(rstd, x.dtype)
    return out, mean, rstd
