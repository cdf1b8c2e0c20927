"""Values made anew for each extern call that reads them: a scatter's zeros, an attention mask.

Two values that several aten calls read are cheaper to make again before each reader than to
keep between them:

- **Fills a scatter writes into.** Autograd's embedding backward is ``zeros(weight.shape)
  .index_put(indices, grad, accumulate=True)``. A model that uses one embedding twice (T5's
  shared table, read by the encoder and the decoder) gets two of them, and the joint graph's
  common-subexpression pass merges their ``zeros`` into one node. The scheduler writes an
  ``index_put`` into its ``self`` only where that buffer is read for the last time there
  (:data:`~ember.inductor.memplan.EXTERN_IN_PLACE`), so the first scatter allocated a
  copy, and the zeros lived from the decoder's backward to the encoder's: two
  embedding-sized buffers at hf-t5's training peak. Filling costs what the copy did.
- **Attention masks.** A causal or padding mask is built once from a few small index
  tensors and read by every layer's attention call: kept, a ``batch x 1 x seq x seq`` float
  buffer lives through the whole model (32 KiB of hf-gpt2's 0.47 MiB inference peak, at
  its first MLP). Each attention call after the first gets its own copy of the mask's
  pointwise chain, back to inputs at most 1/16 of its size, placed just before it.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> def f(i, j, g):
...     z = torch.zeros(6, 2)
...     return z.index_put((i,), g, True), z.index_put((j,), g, True)
>>> i, g = torch.tensor([0, 2, 2]), torch.ones(3, 2)
>>> gm = fresh_fills(make_fx(f)(i, i, g))  # (traced: one zeros, read by both scatters)
>>> [n.name for n in gm.graph.nodes if n.op == "call_function"]
['zeros_1', 'index_put', 'zeros_2', 'index_put_1']
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx

__all__ = ["FILLS", "MASK_READERS", "applies", "fresh_fills"]

aten = torch.ops.aten

FILLS = {aten.full.default, aten.zeros.default, aten.full_like.default, aten.zeros_like.default}
# extern calls whose mask argument is made anew for each (the keyword the mask is passed by)
MASK_READERS: dict[Any, str] = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: "attn_mask"
}
SMALL = 16  # a mask's chain is copied back to inputs at most 1/SMALL of its size
CHAIN_MAX = 24  # nodes a copied chain may have


def applies(gm: torch.fx.GraphModule) -> bool:
    """Whether :func:`fresh_fills` would change ``gm`` (only then is it a compile phase, with
    a trace file of its own)."""
    return any(_in_place_readers(n) or _mask_readers(n)[1:] for n in gm.graph.nodes)


def fresh_fills(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Give each reader of a shared fill that may write into it (an op of
    :data:`~ember.inductor.memplan.EXTERN_IN_PLACE`, the fill as its ``self``) a copy of
    the fill, and each attention call after the first a copy of its mask's chain, placed
    just before it: ``gm``, changed in place (and recompiled) if need be."""
    changed = False
    for node in list(gm.graph.nodes):
        readers = _in_place_readers(node)
        chain = _chain(node) if not readers else []
        if not readers and chain:
            readers = _mask_readers(node)[1:]
        for user in readers:
            user.replace_input_with(node, _copy(gm.graph, chain or [node], user))
        if readers and not node.users:
            gm.graph.erase_node(node)
        changed |= bool(readers)
    if changed:
        gm.recompile()
    return gm


def _in_place_readers(node: torch.fx.Node) -> list[torch.fx.Node]:
    from ember.inductor.memplan import EXTERN_IN_PLACE

    if node.op != "call_function" or node.target not in FILLS or len(node.users) < 2:
        return []
    return [u for u in node.users if u.target in EXTERN_IN_PLACE and u.args and u.args[0] is node]


def _mask_readers(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The attention calls reading ``node`` as their mask, when nothing else reads it."""
    users = list(node.users)
    if node.op != "call_function" or len(users) < 2:
        return []
    for u in users:
        key = MASK_READERS.get(u.target)
        if key is None or u.kwargs.get(key) is not node or node in u.args:
            return []
    return users


def _chain(node: torch.fx.Node) -> list[torch.fx.Node]:
    """``node`` and the nodes it is computed from, in graph order, back to values at most
    1/:data:`SMALL` of its size (or nothing: a node that is not pure, too long a chain)."""
    if not _mask_readers(node):
        return []
    size = _numel(node)
    if size is None:
        return []
    found: dict[torch.fx.Node, None] = {}
    todo = [node]
    while todo:
        n = todo.pop()
        if n in found:
            continue
        if n.op != "call_function" or not _pure(n) or len(found) >= CHAIN_MAX:
            return []
        found[n] = None
        for arg in n.all_input_nodes:
            small = _numel(arg)
            if arg.op == "call_function" and small is not None and small * SMALL > size:
                todo.append(arg)
    order = {n: k for k, n in enumerate(node.graph.nodes)}
    return sorted(found, key=order.__getitem__)


def _copy(
    graph: torch.fx.Graph, chain: list[torch.fx.Node], before: torch.fx.Node
) -> torch.fx.Node:
    """Copies of ``chain`` (in order, reading each other) inserted before ``before``; the
    copy of the last."""
    made: dict[torch.fx.Node, torch.fx.Node] = {}
    with graph.inserting_before(before):
        for n in chain:
            copy = graph.node_copy(n, lambda a: made.get(a, a))
            copy.meta = dict(n.meta)
            made[n] = copy
    return made[chain[-1]]


def _numel(node: torch.fx.Node) -> int | None:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not all(type(n) is int for n in val.shape):
        return None  # (a symbolic size: reading its value would specialise it)
    return math.prod(val.shape)


def _pure(node: torch.fx.Node) -> bool:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return target is operator.getitem
    schema = target._schema
    return not schema.is_mutable and torch.Tag.nondeterministic_seeded not in target.tags
