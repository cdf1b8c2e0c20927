"""What aotgraph knows about aten ops: one table of op classes, read by the partitioners.

Every node of a joint graph falls in exactly one :class:`OpClass`. The min-cut
partitioner may recompute a node in the backward graph only if its class is in
:data:`RECOMPUTABLE`; the checker refuses a backward graph that contains a
:data:`OpClass.RANDOM` node.

>>> import torch
>>> aten = torch.ops.aten
>>> [op_class(op).name for op in (aten.relu.default, aten.mm.default, aten.bernoulli.p)]
['POINTWISE', 'COMPUTE', 'RANDOM']
>>> [op_class(aten.sum.default, input_numel=n).name for n in (64, 10**6)]
['SMALL_REDUCTION', 'LARGE_REDUCTION']
"""

from __future__ import annotations

import enum
import operator
from typing import Any

import torch
import torch.fx

__all__ = [
    "RECOMPUTABLE",
    "OpClass",
    "node_class",
    "op_class",
    "tensor_bytes",
]

aten = torch.ops.aten


class OpClass(enum.Enum):
    """The classes of ops the partitioners and checkers tell apart."""

    PLACEHOLDER = enum.auto()  # a graph input: primal or tangent
    VIEW = enum.auto()  # shares storage with its input: view, t, permute, expand, getitem
    POINTWISE = enum.auto()  # elementwise (torch.Tag.pointwise)
    CREATION = enum.auto()  # a fresh constant tensor: zeros, full, arange, scalar_tensor
    SMALL_REDUCTION = enum.auto()  # a reduction over at most LARGE_REDUCTION elements
    LARGE_REDUCTION = enum.auto()  # a reduction over more than LARGE_REDUCTION elements
    COMPUTE = enum.auto()  # matmuls and convolutions: never recomputed
    RANDOM = enum.auto()  # draws from the RNG (torch.Tag.nondeterministic_seeded)
    OTHER = enum.auto()  # anything else (norms, softmax, embedding, ...): never recomputed


# The classes the min-cut partitioner may recompute in backward instead of saving.
RECOMPUTABLE = frozenset(
    {OpClass.VIEW, OpClass.POINTWISE, OpClass.CREATION, OpClass.SMALL_REDUCTION}
)

# Reductions over more input elements than this are never recomputed.
LARGE_REDUCTION = 4096

COMPUTE_OPS = frozenset(
    {
        aten.mm.default,
        aten.addmm.default,
        aten.bmm.default,
        aten.baddbmm.default,
        aten.matmul.default,
        aten.convolution.default,
        aten.convolution_backward.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
    }
)

CREATION_OPS = frozenset(
    {
        aten.zeros.default,
        aten.ones.default,
        aten.full.default,
        aten.scalar_tensor.default,
        aten.arange.default,
        aten.arange.start,
        aten.arange.start_step,
        aten.empty.memory_format,
        aten.full_like.default,
        aten.zeros_like.default,
        aten.ones_like.default,
        aten.empty_like.default,
    }
)

# Ops that are not tagged as views but only reinterpret or select their input.
EXTRA_VIEW_TARGETS: frozenset[Any] = frozenset({operator.getitem})


def op_class(target: Any, *, input_numel: int = 0) -> OpClass:
    """The class of a call_function target; ``input_numel`` sizes reductions.

    >>> op_class(torch.ops.aten.t.default).name
    'VIEW'
    """
    if target in EXTRA_VIEW_TARGETS:
        return OpClass.VIEW
    if not isinstance(target, torch._ops.OpOverload):
        return OpClass.OTHER
    tags = target.tags
    if torch.Tag.nondeterministic_seeded in tags:
        return OpClass.RANDOM
    if target in COMPUTE_OPS:
        return OpClass.COMPUTE
    if target.is_view:
        return OpClass.VIEW
    if target in CREATION_OPS:
        return OpClass.CREATION
    if torch.Tag.pointwise in tags:
        return OpClass.POINTWISE
    if torch.Tag.reduction in tags:
        small = input_numel <= LARGE_REDUCTION
        return OpClass.SMALL_REDUCTION if small else OpClass.LARGE_REDUCTION
    return OpClass.OTHER


def node_class(node: torch.fx.Node) -> OpClass:
    """The class of a node of a traced aten graph (reductions sized by their first input).

    >>> gm = torch.fx.symbolic_trace(lambda x: x)
    >>> node_class(next(iter(gm.graph.nodes))).name
    'PLACEHOLDER'
    """
    if node.op == "placeholder":
        return OpClass.PLACEHOLDER
    if node.op != "call_function":
        return OpClass.OTHER
    first = node.args[0] if node.args else None
    numel = 0
    if isinstance(first, torch.fx.Node) and isinstance(first.meta.get("val"), torch.Tensor):
        numel = _hint(first.meta["val"].numel())  # symbolic sizes: no guard for a heuristic
    return op_class(node.target, input_numel=numel)


def tensor_bytes(value: Any) -> int:
    """Bytes of a tensor's elements (0 for anything that is not a tensor).

    >>> tensor_bytes(torch.zeros(4, 8)), tensor_bytes(3)
    (128, 0)
    """
    if isinstance(value, torch.Tensor):
        return _hint(value.numel()) * value.element_size()
    return 0


def _hint(n: Any) -> int:
    """A count that may be a SymInt, as its example value (``int()`` would add a guard)."""
    if isinstance(n, torch.SymInt):
        return int(n.node.hint) if n.node.has_hint() else 0
    return int(n)
