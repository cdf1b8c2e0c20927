"""Put each large value next to the values that read it, before grouping into kernels.

A graph that updates many tensors alike (an optimizer's foreach step) lists its nodes one
operation at a time: every ``exp_avg``, then every ``exp_avg_sq``, then every parameter.
Grouped in that order, each parameter's update reads its two new moments back from memory
in a later kernel. In *demand order* the values every extern call needs, and the small
ones (one element: step counts, bias corrections), come first in their own order; then
the rest, depth first from the outputs: a parameter's moments just before the parameter,
so one loop computes all three and reads each input once, as ``AdamW(fused=True)`` does.

The scheduler uses this order only for graphs that write inputs in place
(:func:`~ember.inductor.memplan.write_into_inputs`: optimizer steps, running
statistics), and only when no node draws random numbers or mutates (their order is
observable). Any order that keeps each node after the nodes it reads computes the same
values; this one changes which loops fuse.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from ember.inductor.lowering import lower_graph
>>> def f(a, b):
...     a2, b2 = a * 2, b * 2  # one op over both first ...
...     return a2 + 1, b2 + 1, a2, b2  # ... then the next
>>> x = torch.randn(4, 8)
>>> prog = lower_graph(make_fx(f)(x, torch.randn(8, 4)), [x, torch.randn(8, 4)])
>>> [n.name for n in prog.nodes], [n.name for n in demand_order(prog).nodes]
(['buf0', 'buf1', 'buf2', 'buf3'], ['buf0', 'buf2', 'buf1', 'buf3'])
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ember.aotgraph.order import place_after_needs
from ember.inductor.ir import Extern, Node, Program, Ref, walk
from ember.inductor.ops import Op

__all__ = ["demand_order"]


def demand_order(prog: Program) -> Program:
    """``prog`` with its nodes in demand order (see the module's docstring), or as it is when
    a node's order is observable (random draws, mutation).

    >>> from ember.inductor.ir import Program
    >>> demand_order(Program(buffers={}, inputs=[], nodes=[], outputs=[])).nodes
    []
    """
    nodes = prog.nodes
    if any(_observable(n) for n in nodes):
        return prog
    made = {name: k for k, n in enumerate(nodes) for name in _writes(n)}
    needs = [sorted({made[b] for b in _reads(n) if b in made}) for n in nodes]
    early = [k for k, n in enumerate(nodes) if isinstance(n, Extern) or _small(prog, n)]
    order: list[int] = []
    placed: set[int] = set()
    for root in sorted(_closure(early, needs)):  # (their original order is topological)
        _place(root, needs, order, placed)
    roots = [made[o.name] for o in prog.outputs if isinstance(o, Ref) and o.name in made]
    for root in [*roots, *range(len(nodes))]:
        _place(root, needs, order, placed)
    return dataclasses.replace(prog, nodes=[nodes[k] for k in order])


def _place(root: int, needs: list[list[int]], order: list[int], placed: set[int]) -> None:
    """Append ``root`` after whatever it needs that is not placed yet, depth first."""
    place_after_needs(root, needs.__getitem__, placed, order)


def _closure(start: list[int], needs: list[list[int]]) -> set[int]:
    """``start`` and every node they need, transitively."""
    seen: set[int] = set()
    stack = list(start)
    while stack:
        k = stack.pop()
        if k not in seen:
            seen.add(k)
            stack += needs[k]
    return seen


def _small(prog: Program, node: Node) -> bool:
    """One element (a step count, a bias correction): cheap anywhere, read by many."""
    return not isinstance(node, Extern) and math.prod(node.ranges) == 1


def _observable(node: Node) -> bool:
    """Whether moving ``node`` could change what the graph computes."""
    target = getattr(node, "target", None)
    schema = getattr(target, "_schema", None)
    tags = getattr(target, "tags", ())
    return bool(schema is not None and schema.is_mutable) or (
        torch.Tag.nondeterministic_seeded in tags
    )


def _writes(node: Node) -> tuple[str, ...]:
    return node.names if isinstance(node, Extern) else (node.name,)


def _reads(node: Node) -> set[str]:
    if isinstance(node, Extern):
        return {r.name for r in node.refs()}
    return {e.arg[0] for e in walk(node.body) if e.op is Op.LOAD}
