"""Tidying a traced aten graph: input writes lifted to outputs, detaches dropped, CSE.

The last passes of :func:`~ember.aotgraph.trace.trace_joint` (see ``_finish`` there):
:func:`lift_mutations` turns functionalization's trailing ``copy_`` into an input into
an extra output the runtime writes back (or drops it, where it would write the input's
own values back); :func:`strip_detach` drops ``detach`` (the
identity once autograd is traced away); :func:`eliminate_common_subexpressions` merges
repeated pure nodes.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx

from ember.aotgraph.eager_checks import Unsupported

__all__ = ["eliminate_common_subexpressions", "lift_mutations", "strip_detach"]

aten = torch.ops.aten


def lift_mutations(gm: torch.fx.GraphModule, n_outs: int) -> tuple[int, ...]:
    """Replace each trailing ``copy_(input, new)`` by ``new`` as an output after the first
    ``n_outs``; return the indices of the inputs written back."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    output = gm.graph.output_node()
    mutated: list[int] = []
    news: list[torch.fx.Node] = []
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.copy_.default:
            dest, new = node.args[0], node.args[1]
            if dest not in placeholders or node.users:
                raise Unsupported(
                    f"aot_compile: {node.format_node()} survived functionalization; in-place "
                    "changes to an input's metadata (t_, transpose_, resize_) are not supported"
                )
            gm.graph.erase_node(node)
            if _unchanged(dest, new):  # eval batch norm's running stats: eager never writes
                continue
            mutated.append(placeholders.index(dest))
            news.append(new)
    outs = list(output.args[0])  # type: ignore[arg-type]
    output.args = ([*outs[:n_outs], *news, *outs[n_outs:]],)
    return tuple(mutated)


def _same_dtype_copy(dest: torch.fx.Node, new: torch.fx.Node) -> bool:
    val, dest_val = new.meta.get("val"), dest.meta.get("val")
    if not isinstance(val, torch.Tensor) or not isinstance(dest_val, torch.Tensor):
        return False
    return new.args[0] is dest and val.dtype == dest_val.dtype and val.device == dest_val.device


def _stats_of_eval_batch_norm(dest: torch.fx.Node, new: torch.fx.Node) -> bool:
    norm, index = new.args[0], new.args[1]
    if not isinstance(norm, torch.fx.Node) or norm.target not in _BATCH_NORMS:
        return False  # outputs 3 and 4 are the running mean and var, returned as they came
    if not isinstance(index, int) or index not in (3, 4):
        return False
    return norm.args[5] is False and norm.args[index] is dest


_BATCH_NORMS = (aten._native_batch_norm_legit_functional.default,)

# How a value that is its input unchanged shows up as a write-back's source; a write-back
# of one is dropped (eager writes nothing there, so the version counter stays put).
_UNCHANGED = {
    aten._to_copy.default: _same_dtype_copy,
    aten.clone.default: _same_dtype_copy,
    operator.getitem: _stats_of_eval_batch_norm,
}


def _unchanged(dest: torch.fx.Node, new: Any) -> bool:
    """Whether ``new`` holds exactly ``dest``'s values (so writing it back is a no-op)."""
    if new is dest:
        return True
    if not isinstance(new, torch.fx.Node) or new.op != "call_function":
        return False
    rule = _UNCHANGED.get(new.target)
    return rule is not None and rule(dest, new)


def _frozen(value: Any) -> Any:
    """``value`` as a key part: numbers keyed by type, floats by sign too (``1 == 1.0 ==
    True`` and ``0.0 == -0.0`` in Python, not as arguments: ``x + 1`` of an int tensor is
    an int, ``x + 1.0`` a float; ``x + -0.0`` keeps a -0.0 that ``x + 0.0`` does not)."""
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, float):
        return (float, value, math.copysign(1.0, value))
    if isinstance(value, int):  # bool too
        return (type(value), value)
    return value


def _pure(node: torch.fx.Node) -> bool:
    """A node whose result depends only on its op and arguments: it can be shared."""
    target = node.target
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload) or target._schema.is_mutable:
        return False
    return torch.Tag.nondeterministic_seeded not in target.tags  # two dropouts: two masks


def eliminate_common_subexpressions(gm: torch.fx.GraphModule) -> None:
    """Merge nodes that apply the same pure op to the same arguments.

    >>> graph = torch.fx.Graph()
    >>> w = graph.placeholder("w")
    >>> a = graph.call_function(torch.ops.aten.t.default, (w,))
    >>> b = graph.call_function(torch.ops.aten.t.default, (w,))
    >>> _ = graph.output([a, b])
    >>> gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    >>> eliminate_common_subexpressions(gm)
    >>> [n.name for n in gm.graph.nodes]
    ['w', 't_default', 'output']
    """
    seen: dict[Any, torch.fx.Node] = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not _pure(node):
            continue
        key = (node.target, _frozen(node.args), _frozen(node.kwargs))
        try:
            first = seen.setdefault(key, node)
        except TypeError:  # an unhashable argument: leave the node alone
            continue
        if first is not node:
            node.replace_all_uses_with(first)
            gm.graph.erase_node(node)


def strip_detach(gm: torch.fx.GraphModule) -> None:
    """Remove ``detach`` nodes: in a graph without autograd they are the identity."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.detach.default:
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
