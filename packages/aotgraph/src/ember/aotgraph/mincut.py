"""The min-cut partitioner: save the fewest bytes, recompute cheap ops in backward.

Four steps, one function each:

1. :func:`flow_network`: every node of the joint graph that does not depend on a
   tangent becomes an edge ``in -> out`` whose capacity is the bytes it would
   cost to save (graph inputs cost nothing: the caller keeps them alive anyway,
   and a tuple cannot be saved at all). Data edges are infinite; the source
   feeds every primal; every node the backward graph reads feeds the sink.
2. :func:`policy`: a node that may not be recomputed (random ops, matmuls,
   convolutions, large reductions, anything not in
   :data:`~ember.aotgraph.ops.RECOMPUTABLE`) also hangs off the source, so the
   cut always passes at or after it: it runs once, in the forward graph.
3. ``networkx.minimum_cut`` solves the network.
4. :func:`cut_nodes`: the cut edges ``in -> out`` are the saved values, and
   :func:`~ember.aotgraph.partition.partition_from_saved` builds the graphs.

>>> import torch
>>> from ember.aotgraph.trace import Lifted, analyze, trace_joint
>>> from ember.aotgraph.partition import default_partition
>>> f = lambda x, w: torch.nn.functional.gelu(x @ w).sin()
>>> x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
>>> lifted = Lifted.of(torch.fx.symbolic_trace(f), [x, w])
>>> joint = trace_joint(lifted, [x, w], analyze(lifted, [x, w], grad=True), {})
>>> default_partition(joint).saved, min_cut_partition(joint).saved
(('primals_1', 'mm', 'gelu'), ('primals_1', 'mm'))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.fx

from ember.aotgraph.ops import RECOMPUTABLE, node_class, tensor_bytes
from ember.aotgraph.partition import (
    Partition,
    descendants,
    joint_parts,
    partition_from_saved,
)
from ember.aotgraph.trace import JointGraph

if TYPE_CHECKING:  # networkx is imported when a graph is partitioned (0.1 s), not before
    import networkx as nx  # type: ignore[import-untyped]

__all__ = ["min_cut_partition"]

Node = torch.fx.Node
SOURCE, SINK = "source", "sink"


def _in(node: Node) -> str:
    return node.name + ".in"


def _out(node: Node) -> str:
    return node.name + ".out"


def capacity(node: Node) -> float:
    """Cost of saving ``node``: its bytes (plus one, so fewer tensors win a tie), 1 for a
    number; 0 for a graph input; infinite for a tuple, which cannot be saved."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor | torch.SymFloat | torch.SymInt | torch.SymBool):
        return float("inf")
    if node.op == "placeholder":
        return 0.0
    return float(tensor_bytes(val) + 1)


def policy(node: Node) -> bool:
    """Whether ``node`` must run in the forward graph (never recomputed in backward)."""
    return node.op == "placeholder" or node_class(node) not in RECOMPUTABLE


def flow_network(joint: JointGraph) -> tuple[nx.DiGraph, list[Node]]:
    """The flow network over the tangent-independent nodes, and those nodes."""
    import networkx as nx

    _, tangents, _, grads = joint_parts(joint)
    backward_only = descendants(tangents)
    candidates = [n for n in joint.gm.graph.nodes if n.op != "output" and n not in backward_only]
    net = nx.DiGraph()
    net.add_node(SOURCE)
    net.add_node(SINK)
    grad_set = {g for g in grads if g is not None}
    for node in candidates:
        net.add_edge(_in(node), _out(node), capacity=capacity(node))
        if policy(node):
            net.add_edge(SOURCE, _in(node))
        for user in node.users:
            if user in backward_only:
                net.add_edge(_out(node), SINK)
            elif user.op != "output":
                net.add_edge(_out(node), _in(user))
        if node in grad_set:
            net.add_edge(_out(node), SINK)
    return net, candidates


def cut_nodes(net: nx.DiGraph, candidates: list[Node]) -> list[Node]:
    """The nodes whose ``in -> out`` edge the minimum cut crosses."""
    import networkx as nx

    if not net.in_edges(SINK):
        return []
    _, (reachable, _) = nx.minimum_cut(net, SOURCE, SINK)
    return [n for n in candidates if _in(n) in reachable and _out(n) not in reachable]


def min_cut_partition(joint: JointGraph) -> Partition:
    """Save the cheapest set of values that cuts every primal from the backward graph.

    Pointwise ops, views, creation ops and small reductions whose inputs are saved
    are recomputed in the backward graph instead of being saved themselves.

    >>> import torch
    >>> from ember.aotgraph.trace import Lifted, analyze, trace_joint
    >>> f = lambda x: x.relu().sin()
    >>> x = torch.randn(16, requires_grad=True)
    >>> lifted = Lifted.of(torch.fx.symbolic_trace(f), [x])
    >>> part = min_cut_partition(trace_joint(lifted, [x], analyze(lifted, [x], grad=True), {}))
    >>> part.saved, part.activation_bytes
    (('primals_1',), 0)
    """
    net, candidates = flow_network(joint)
    return partition_from_saved(joint, cut_nodes(net, candidates))
