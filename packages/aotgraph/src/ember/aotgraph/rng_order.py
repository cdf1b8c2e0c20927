"""In-place random fills draw their numbers in the order eager does.

Eager's ``t.bernoulli_(p)`` (and ``uniform_``, ``exponential_``, ``random_``, ...) on a
tensor whose strides are not in row-major order, such as dropout's ``empty_like`` of a
transposed input, draws numbers in the order of memory, not of indices: its
TensorIterator walks the written tensor by its strides. Functionalization turns the
write into the out-of-place twin (``bernoulli.p``), which returns a fresh contiguous
tensor filled in index order: the same numbers in other places, a different dropout
mask from the same seed. :func:`draw_in_memory_order` rewrites such a write, before
functionalization, as the same write to a permuted view of the tensor whose index
order is its memory order; functionalization then fills that view in index order,
which is eager's order, and scatters it back through the permutation.

``normal_`` is the exception: eager fills a contiguous tensor of 16 or more elements
with a vectorised Box-Muller that pairs numbers differently from its strided loop, so
no order of ours gives eager's numbers; the graph runs eagerly (:class:`EagerOnly`).

>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> def f(x):
...     return torch.empty_like(x).bernoulli_(0.5)
>>> gm = make_fx(f, tracing_mode="fake")(torch.ones(4, 3).t())
>>> draw_in_memory_order(gm)
>>> [n.target.__name__ for n in gm.graph.nodes if n.op == "call_function"]
['empty_like.default', 'permute.default', 'bernoulli_.float']
"""

from __future__ import annotations

import torch
import torch.fx
from torch.fx.node import Argument

from ember.aotgraph.eager_checks import EagerOnly

__all__ = ["draw_in_memory_order", "memory_order"]

aten = torch.ops.aten
# eager's normal_ takes a vectorised path for contiguous tensors of at least this many
# elements (ATen's normal_kernel), so a permuted contiguous view draws other numbers
_NORMAL_VECTORISED = 16


def memory_order(t: torch.Tensor) -> list[int]:
    """The dimensions of ``t`` from the largest stride to the smallest (stable): the order
    eager's TensorIterator walks memory in, as a permutation.

    >>> memory_order(torch.ones(4, 3).t())
    [1, 0]
    """
    unit = [d for d in range(t.dim()) if t.size(d) == 1]  # any place walks them alike
    return unit + sorted(
        (d for d in range(t.dim()) if t.size(d) > 1), key=lambda d: -int(t.stride()[d])
    )


def _random_fill(node: torch.fx.Node) -> bool:
    """An in-place random op that writes its first argument only."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or not target._schema.is_mutable:
        return False
    if torch.Tag.nondeterministic_seeded not in target.tags:
        return False
    args = target._schema.arguments
    return args[0].alias_info is not None and args[0].alias_info.is_write


def draw_in_memory_order(gm: torch.fx.GraphModule) -> None:
    """Rewrite each in-place random fill of a tensor whose index order is not its memory
    order as the fill of a permuted view (see the module docstring)."""
    graph, changed = gm.graph, False
    for node in list(graph.nodes):
        if node.op != "call_function" or not _random_fill(node):
            continue
        target, dest = node.target, node.args[0]
        value = dest.meta.get("val") if isinstance(dest, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or value.dim() < 2:
            continue
        order = memory_order(value)
        walked = [d for d in order if value.size(d) > 1]
        if walked == sorted(walked):  # index order is memory order already
            continue
        if target is aten.normal_.default and value.numel() >= _NORMAL_VECTORISED:
            raise EagerOnly(
                "normal_ on a tensor whose strides are not row-major: eager's numbers "
                "come from a strided loop no graph op reproduces"
            )
        with graph.inserting_before(node):
            view = graph.call_function(aten.permute.default, (dest, order))
            view.meta["val"] = value.permute(order)
            rest = [_permuted(graph, a, value, order) for a in node.args[1:]]
            fill = graph.call_function(target, (view, *rest), dict(node.kwargs))
            fill.meta["val"] = view.meta["val"]
        node.replace_all_uses_with(dest)  # an in-place op returns its destination
        graph.erase_node(node)
        changed = True
    if changed:
        gm.recompile()


def _permuted(
    graph: torch.fx.Graph, arg: Argument, like: torch.Tensor, order: list[int]
) -> Argument:
    """A tensor argument read element by element with the destination (``bernoulli_``'s
    probabilities), broadcast to it and permuted the same way; anything else as is."""
    value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return arg
    shape = list(like.shape)
    expanded = graph.call_function(aten.expand.default, (arg, shape))
    expanded.meta["val"] = value.expand(shape)
    out = graph.call_function(aten.permute.default, (expanded, order))
    out.meta["val"] = expanded.meta["val"].permute(order)
    return out
