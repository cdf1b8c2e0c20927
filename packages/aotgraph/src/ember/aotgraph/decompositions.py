"""The decomposition table aotgraph traces with: aten op -> a function of simpler aten ops.

Two kinds of entries. ember's own (registered with :func:`decomposition` in this
module) fix semantics the tracer needs: ``native_batch_norm`` updates its
running statistics in place without saying so in its schema, so it is
rewritten to ``_native_batch_norm_legit``, whose schema marks the mutation and
which functionalization turns into a pure op plus a write-back. The others are
taken from ``torch._decomp`` for backward formulas that become pointwise ops,
so that the min-cut partitioner can recompute them and a fusing backend can
fuse them. Both keep eager's kernels for forward numerics.

>>> import torch
>>> table = default_decompositions()
>>> torch.ops.aten.native_batch_norm.default in table, torch.ops.aten.gelu_backward.default in table
(True, True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._decomp import get_decompositions

__all__ = ["DECOMPOSITIONS", "TORCH_DECOMPOSED", "decomposition", "default_decompositions"]

aten = torch.ops.aten

DecompositionTable = dict[torch._ops.OperatorBase, Callable[..., Any]]

# ember's own decompositions, filled by @decomposition below.
DECOMPOSITIONS: DecompositionTable = {}

# Backward (and a few forward) ops whose torch._decomp decompositions are pointwise math.
TORCH_DECOMPOSED = (
    aten.threshold_backward,
    aten.gelu_backward,
    aten.tanh_backward,
    aten.sigmoid_backward,
    aten.silu_backward,
    aten.hardtanh_backward,
    aten.leaky_relu_backward,
    aten.elu_backward,
    aten.softplus_backward,
    aten._softmax_backward_data,
    aten._log_softmax_backward_data,
    aten.native_dropout_backward,
    aten.mse_loss_backward,
)


def decomposition(
    op: torch._ops.OpOverload,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as ember's decomposition of ``op`` (once per op).

    >>> @decomposition(torch.ops.aten.native_batch_norm.default)
    ... def again(*args):
    ...     pass
    Traceback (most recent call last):
    ValueError: aten.native_batch_norm.default already has a decomposition
    """

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        if op in DECOMPOSITIONS:
            raise ValueError(f"{op} already has a decomposition")
        DECOMPOSITIONS[op] = fn
        return fn

    return register


@decomposition(aten.native_batch_norm.default)
def native_batch_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``native_batch_norm`` as the op whose schema declares the running-stat update.

    >>> x = torch.randn(4, 3)
    >>> mean, var = torch.zeros(3), torch.ones(3)
    >>> out = native_batch_norm(x, None, None, mean, var, True, 0.1, 1e-5)[0]
    >>> torch.allclose(mean, 0.1 * x.mean(0))
    True
    """
    if running_mean is None or running_var is None:
        out = aten._native_batch_norm_legit.no_stats(x, weight, bias, training, momentum, eps)
    else:
        out = aten._native_batch_norm_legit.default(
            x, weight, bias, running_mean, running_var, training, momentum, eps
        )
    return out[0], out[1], out[2]


def default_decompositions() -> DecompositionTable:
    """A fresh copy of the table ``aot_compile`` uses when ``decompositions=None``.

    Callers may add or remove entries before passing it to ``aot_compile``; an
    explicit table replaces this one (ember's own entries are always added).

    >>> table = default_decompositions()
    >>> table.pop(torch.ops.aten.gelu_backward.default) is not None
    True
    >>> torch.ops.aten.gelu_backward.default in default_decompositions()
    True
    """
    table: DecompositionTable = dict(get_decompositions(list(TORCH_DECOMPOSED)))
    table.update(DECOMPOSITIONS)
    return table
