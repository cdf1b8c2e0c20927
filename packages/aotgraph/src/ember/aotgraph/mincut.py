"""The min-cut partitioner: save the fewest bytes, recompute cheap ops in backward.

Four steps, one function each:

1. :func:`flow_network`: every node of the joint graph that does not depend on a
   tangent becomes an edge ``in -> out`` whose capacity is the bytes it would
   cost to save (graph inputs that eager's own formulas save cost nothing: the
   caller keeps them alive anyway; other graph inputs cannot be saved, nor can a
   tuple). Data edges are infinite; the source
   feeds every primal; every node the backward graph reads feeds the sink.
2. :func:`policy`: a node that may not be recomputed (random ops, matmuls,
   convolutions, large reductions, anything not in
   :data:`~ember.aotgraph.ops.RECOMPUTABLE`) also hangs off the source, so the
   cut always passes at or after it: it runs once, in the forward graph.
   Nodes of a ``torch.utils.checkpoint`` region (torch's ``recompute`` tag, which ember's
   capture writes) may not be saved, except the region's results read outside it, and
   do not hang off the source unless they draw random numbers: the backward graph
   recomputes them from the region's inputs, as eager's checkpoint does, matmuls
   included (random ops run once, in the forward graph, and are saved).
3. ``networkx.minimum_cut`` solves the network (without the regions' rule if it leaves
   no finite cut).
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

from ember.aotgraph.ops import RECOMPUTABLE, OpClass, node_class, tensor_bytes
from ember.aotgraph.partition import (
    Partition,
    ancestors,
    descendants,
    forward_nodes,
    joint_parts,
    partition_from_saved,
    view_root,
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


def capacity(node: Node, free: set[Node] | frozenset[Node] = frozenset()) -> float:
    """Cost of saving ``node``: its bytes (plus one, so fewer tensors win a tie), 1 for a
    number; 0 for a graph input in ``free``, infinite for another one or a tuple."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor | torch.SymFloat | torch.SymInt | torch.SymBool):
        return float("inf")
    if node.op == "placeholder":
        return 0.0 if node in free else float("inf")
    return float(tensor_bytes(val) + 1)


def eager_saved_inputs(joint: JointGraph) -> set[Node]:
    """The graph inputs that the backward formulas read as they are (or through views),
    as eager's saved tensors do. Saving another input to recompute from it would make the
    backward pass check an input eager never saved: a later in-place write of it (after a
    graph break, or by the caller) would raise in backward where eager's does not."""
    _, _, _, grads = joint_parts(joint)
    fw = forward_nodes(joint)
    region = ancestors(grads, stop=fw) - fw
    read = [n for n in fw if any(u in region for u in n.users)]
    read += [g for g in grads if g is not None and g in fw]
    return {root for root in map(view_root, read) if root.op == "placeholder"}


def policy(node: Node) -> bool:
    """Whether ``node`` must run in the forward graph (never recomputed in backward)."""
    return node.op == "placeholder" or node_class(node) not in RECOMPUTABLE


# torch.utils.checkpoint's tags for "recompute this in backward"
RECOMPUTE_TAGS = frozenset(
    {
        torch.utils.checkpoint.CheckpointPolicy.PREFER_RECOMPUTE,
        torch.utils.checkpoint.CheckpointPolicy.MUST_RECOMPUTE,
    }
)


def checkpointed(nodes: list[Node], backward_only: set[Node]) -> set[Node]:
    """The nodes of checkpoint regions to recompute in backward: tagged, not random, not
    writing in place, and not a region's result read outside the region (eager keeps that
    one: it is the checkpoint's output)."""
    tags = RECOMPUTE_TAGS
    region = {n: n.meta.get("ac_graph_id") for n in nodes if n.meta.get("recompute") in tags}

    def inside(node: Node) -> bool:
        if node_class(node) is OpClass.RANDOM:
            return False
        schema = getattr(node.target, "_schema", None)
        if schema is not None and schema.is_mutable:
            return False
        return all(
            u in backward_only or (u.op != "output" and region.get(u, -1) == region[node])
            for u in node.users
        )

    return {n for n in region if inside(n)}


def flow_network(
    joint: JointGraph, every_input: bool = False, checkpoints: bool = True
) -> tuple[nx.DiGraph, list[Node]]:
    """The flow network over the tangent-independent nodes, and those nodes; with
    ``every_input`` any graph input may be saved for free; with ``checkpoints`` the nodes
    of checkpoint regions are recomputed (:func:`checkpointed`)."""
    import networkx as nx

    placeholders = joint.gm.graph.find_nodes(op="placeholder")
    free = set(placeholders) if every_input else eager_saved_inputs(joint)
    _, tangents, _, grads = joint_parts(joint)
    backward_only = descendants(tangents)
    candidates = [n for n in joint.gm.graph.nodes if n.op != "output" and n not in backward_only]
    net = nx.DiGraph()
    net.add_node(SOURCE)
    net.add_node(SINK)
    grad_set = {g for g in grads if g is not None}
    recompute = checkpointed(candidates, backward_only) if checkpoints else set()
    # a region's inputs are saved for its recomputation, as eager's checkpoint keeps them
    free |= {p for p in placeholders if any(u in recompute for u in p.users)}
    for node in candidates:
        if node in recompute:
            net.add_edge(_in(node), _out(node), capacity=float("inf"))
        else:
            net.add_edge(_in(node), _out(node), capacity=capacity(node, free))
        if policy(node) and node not in recompute:
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
    >>> def saved(f):
    ...     x = torch.randn(16, requires_grad=True)
    ...     lifted = Lifted.of(torch.fx.symbolic_trace(f), [x])
    ...     part = min_cut_partition(trace_joint(lifted, [x], analyze(lifted, [x], grad=True), {}))
    ...     return part.saved, part.activation_bytes
    >>> saved(lambda x: x.sin().relu())  # sin's formula reads x: recompute from it
    (('primals_1',), 0)
    >>> saved(lambda x: x.relu().sin())  # eager saves relu's result, never x
    (('relu',), 64)
    """
    import networkx as nx

    # without the checkpoint regions' rule, then with inputs eager does not save, if no
    # cut is finite: a region reading such an input directly, say
    for every_input, checkpoints in ((False, True), (False, False), (True, False)):
        try:
            net, candidates = flow_network(joint, every_input, checkpoints)
            saved = cut_nodes(net, candidates)
        except nx.NetworkXUnbounded:
            continue
        return partition_from_saved(joint, saved)
    raise AssertionError("every input may be saved: a finite cut exists")
