"""One fill per in-place reader: a zeros tensor that several scatters start from is made anew
before each.

Autograd's embedding backward is ``zeros(weight.shape).index_put(indices, grad,
accumulate=True)``. A model that uses one embedding twice (T5's shared table, read by the
encoder and the decoder) gets two of them, and the joint graph's common-subexpression pass
merges their two ``zeros`` into one node. The scheduler writes an ``index_put`` into its
``self`` only where that buffer is read for the last time there
(:data:`~ember.inductor.scheduler.EXTERN_IN_PLACE`), so with the zeros shared the first
scatter allocated a copy, and the zeros lived from the decoder's backward to the
encoder's: two embedding-sized buffers at hf-t5's training peak. Filling is as cheap as
the copy it saves, so each such reader gets a fill of its own, made just before it.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> def f(i, j, g):
...     z = torch.zeros(6, 2)
...     return z.index_put((i,), g, True), z.index_put((j,), g, True)
>>> i, g = torch.tensor([0, 2, 2]), torch.ones(3, 2)
>>> gm = fresh_fills(make_fx(f)(i, i, g))  # (traced: one zeros, read by both scatters)
>>> [n.name for n in gm.graph.nodes if n.op == "call_function"]
['zeros_default', 'index_put', 'zeros_default_1', 'index_put_1']
"""

from __future__ import annotations

import torch
import torch.fx

__all__ = ["FILLS", "applies", "fresh_fills"]

aten = torch.ops.aten

FILLS = {aten.full.default, aten.zeros.default, aten.full_like.default, aten.zeros_like.default}


def applies(gm: torch.fx.GraphModule) -> bool:
    """Whether :func:`fresh_fills` would change ``gm`` (only then is it a compile phase, with
    a trace file of its own)."""
    return any(_in_place_readers(node) for node in gm.graph.nodes)


def _in_place_readers(node: torch.fx.Node) -> list[torch.fx.Node]:
    from ember.inductor.scheduler import EXTERN_IN_PLACE

    if node.op != "call_function" or node.target not in FILLS or len(node.users) < 2:
        return []
    return [u for u in node.users if u.target in EXTERN_IN_PLACE and u.args and u.args[0] is node]


def fresh_fills(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Give each reader of a shared fill that may write into it (an op of
    :data:`~ember.inductor.scheduler.EXTERN_IN_PLACE`, the fill as its ``self``) a copy of
    the fill placed just before it: ``gm``, changed in place (and recompiled) if need be."""
    changed = False
    for node in list(gm.graph.nodes):
        readers = _in_place_readers(node)
        for user in readers:
            with gm.graph.inserting_before(user):
                copy = gm.graph.call_function(node.target, node.args, node.kwargs)
            copy.meta = dict(node.meta)
            user.replace_input_with(node, copy)
        if readers and not node.users:
            gm.graph.erase_node(node)
        changed |= bool(readers)
    if changed:
        gm.recompile()
    return gm
