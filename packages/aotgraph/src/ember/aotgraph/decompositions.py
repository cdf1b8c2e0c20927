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

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._decomp import get_decompositions

__all__ = [
    "DECOMPOSITIONS",
    "TORCH_DECOMPOSED",
    "decomposition",
    "default_decompositions",
    "for_symbolic_sizes",
    "mean_dim",
]

aten = torch.ops.aten
prims = torch.ops.prims

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


def mean_dim(
    x: torch.Tensor,
    dim: int | Sequence[int] | None,
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
    fallback: Callable[..., Any],
) -> Any:
    """``aten.mean.dim`` as ``prims.sum``, an ``unsqueeze`` per reduced dimension if
    ``keepdim``, and ``prims.div`` by the count: the ops of torch's reference
    decomposition (``torch._refs.mean``) minus its identity ``expand``, without its
    broadcasting and dtype checks, which with symbolic sizes are 80-90 ``SymNode``
    operations a call (hf-t5-infer's RMS norms: 12 calls, 8 ms each). Only a float32 or
    float64 input reduced over dimensions of static sizes (a float count, as the
    reference's) takes this path; anything else goes to ``fallback``, the table's entry.

    >>> ref = torch._decomp.decomposition_table[torch.ops.aten.mean.dim]
    >>> x = torch.randn(2, 3, 4)
    >>> torch.allclose(mean_dim(x, [-1], True, fallback=ref), x.mean(-1, keepdim=True))
    True
    """
    dims: list[Any] = [dim] if isinstance(dim, int) else list(dim) if dim is not None else []
    ndim = x.dim()
    plain = (
        dtype is None
        and x.dtype in (torch.float32, torch.float64)
        and x.layout is torch.strided
        and ndim > 0
        and dims
        and all(type(d) is int and -ndim <= d < ndim for d in dims)
        and len({d % ndim for d in dims}) == len(dims)  # torch rejects a repeated dim
    )
    if not plain:
        return fallback(x, dim, keepdim, dtype=dtype)
    dims = sorted(d % ndim for d in dims)
    count = 1
    for d in dims:
        size = x.shape[d]
        if type(size) is not int:
            return fallback(x, dim, keepdim, dtype=dtype)  # a symbolic count: torch's path
        count *= size
    out = prims.sum.default(x, dims)
    if keepdim:
        for d in dims:
            out = aten.unsqueeze.default(out, d)
    return prims.div.default(out, float(count))


def for_symbolic_sizes(table: DecompositionTable) -> DecompositionTable:
    """``table`` for a trace with symbolic sizes: where it decomposes ``aten.mean.dim``,
    :func:`mean_dim` does, falling back to that entry.

    >>> ref = torch._decomp.decomposition_table[torch.ops.aten.mean.dim]
    >>> lean = for_symbolic_sizes({torch.ops.aten.mean.dim: ref})[torch.ops.aten.mean.dim]
    >>> lean.func is mean_dim, lean.keywords["fallback"] is ref, for_symbolic_sizes({}) == {}
    (True, True, True)
    """
    given = table.get(aten.mean.dim)
    if given is None or getattr(given, "func", None) is mean_dim:
        return table
    return {**table, aten.mean.dim: functools.partial(mean_dim, fallback=given)}
