"""Partitioning a joint graph into a forward graph and a backward graph.

A partitioner chooses the *saved* values: nodes of the joint graph that the
forward graph returns after its outputs and the backward graph takes before
the tangents. Everything else follows (:func:`partition_from_saved`): the
forward graph computes its outputs and the saved values from the primals; the
backward graph computes the gradients from the saved values and the tangents,
recomputing whatever else it needs.

>>> import torch
>>> from ember.aotgraph.trace import Lifted, analyze, trace_joint
>>> gm = torch.fx.symbolic_trace(lambda x: (x.sin() * 2).cos())
>>> x = torch.randn(8, requires_grad=True)
>>> lifted = Lifted.of(gm, [x])
>>> joint = trace_joint(lifted, [x], analyze(lifted, [x], grad=True), {})
>>> part = default_partition(joint)
>>> part.saved, part.saved_bytes
(('primals_1', 'mul'), 64)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.fx

from ember.aotgraph.ops import OpClass, node_class, tensor_bytes
from ember.aotgraph.order import place_after_needs
from ember.aotgraph.trace import JointGraph

__all__ = [
    "Partition",
    "Partitioner",
    "default_partition",
    "partition_from_saved",
]

Node = torch.fx.Node


@dataclass(frozen=True, slots=True)
class Partition:
    """A forward graph and a backward graph cut from one joint graph.

    ``forward``: ``(*primals) -> [*outputs, *mutations, *saved]``.
    ``backward``: ``(*saved, *tangents) -> [*grads]`` (``None`` for unused inputs).

    >>> from ember.aotgraph.trace import Lifted, analyze, trace_joint
    >>> x = torch.randn(4, requires_grad=True)
    >>> lifted = Lifted.of(torch.fx.symbolic_trace(lambda x: x.exp().sum()), [x])
    >>> part = default_partition(trace_joint(lifted, [x], analyze(lifted, [x], grad=True), {}))
    >>> part.saved, part.num_forward_outputs
    (('exp',), 1)
    >>> [n.name for n in part.backward.graph.find_nodes(op="placeholder")]
    ['exp', 'tangents_1']
    """

    forward: torch.fx.GraphModule
    backward: torch.fx.GraphModule
    saved: tuple[str, ...]  # names of the saved joint-graph nodes, in forward-output order
    saved_bytes: int  # bytes of every saved tensor, primals included
    activation_bytes: int  # bytes of the saved tensors that are not inputs or views of inputs
    num_forward_outputs: int  # forward outputs before the saved values

    def summary(self) -> str:
        """One line: how much the forward graph keeps alive for the backward graph.

        >>> print(Partition(None, None, ("mm",), 64, 64, 1).summary())  # type: ignore[arg-type]
        saves 1 tensors, 64 bytes (64 bytes of activations)
        """
        n = len(self.saved)
        activations = f"{self.activation_bytes} bytes of activations"
        return f"saves {n} tensors, {self.saved_bytes} bytes ({activations})"


Partitioner = Callable[[JointGraph], Partition]


def joint_parts(joint: JointGraph) -> tuple[list[Node], list[Node], list[Node], list[Node | None]]:
    """Primal placeholders, tangent placeholders, forward outputs and gradient outputs."""
    placeholders = list(joint.gm.graph.find_nodes(op="placeholder"))
    outs = list(joint.gm.graph.output_node().args[0])  # type: ignore[arg-type]
    k = joint.num_forward_outputs
    primals, tangents = placeholders[: joint.num_primals], placeholders[joint.num_primals :]
    return primals, tangents, outs[:k], outs[k:]


def ancestors(
    roots: Iterable[Node | None], stop: set[Node] | frozenset[Node] = frozenset()
) -> set[Node]:
    """``roots`` and every node they read, not looking past nodes in ``stop``."""
    seen: set[Node] = set()
    todo = [r for r in roots if r is not None]
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if node not in stop:
            todo.extend(node.all_input_nodes)
    return seen


def descendants(roots: Iterable[Node]) -> set[Node]:
    """``roots`` and every node that reads them, transitively (the output node excluded)."""
    seen: set[Node] = set()
    todo = list(roots)
    while todo:
        node = todo.pop()
        if node in seen or node.op == "output":
            continue
        seen.add(node)
        todo.extend(node.users)
    return seen


def extract(
    joint: torch.fx.GraphModule,
    inputs: Sequence[Node],
    outputs: Sequence[Node | None],
    what: str,
    keep: Sequence[Node] = (),
    late_from: Sequence[Node] = (),
) -> torch.fx.GraphModule:
    """A new graph module computing ``outputs`` from ``inputs`` with the joint graph's nodes
    (and the nodes in ``keep``, which no output reads: random draws). Nodes that do not
    depend on ``late_from`` go just before their first reader (see :func:`late_order`)."""
    graph = torch.fx.Graph()
    env: dict[Node, Node] = {}
    for node in inputs:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
    needed = ancestors([*outputs, *keep], stop=set(inputs))
    order = [n for n in joint.graph.nodes if n in needed]
    if late_from:
        order = late_order(order, descendants(late_from))
    for node in order:
        if node in env:
            continue
        if node.op == "placeholder":
            raise ValueError(
                f"the {what} graph reads {node.name}, which is neither saved nor an input"
            )
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output([env[o] if o is not None else None for o in outputs])
    gm = torch.fx.GraphModule(joint, graph, class_name=what.capitalize())
    gm.graph.lint()
    return gm


def late_order(nodes: Sequence[Node], anchors: set[Node]) -> list[Node]:
    """``nodes`` (in a topological order) with each one outside ``anchors`` moved to just
    before the first node that needs it; anchors and nodes with effects keep their order.

    A backward graph recomputes forward values (the saved activations' cheap neighbours:
    GELU's inner ``tanh``, an attention mask). In the joint graph's order they all come
    first, so every layer's recomputed values were alive through the whole backward pass
    (hf-gpt2's training step: two 256 KiB GELU derivatives held from the first kernel);
    placed late, each is made where its layer's gradient needs it. The anchors of a
    backward graph are the nodes that read the tangents.

    >>> g = torch.fx.Graph()
    >>> x, t = g.placeholder("x"), g.placeholder("t")
    >>> early = g.call_function(torch.sin, (x,))
    >>> a = g.call_function(torch.mul, (t, 2))
    >>> b = g.call_function(torch.mul, (a, early))
    >>> [n.name for n in late_order([x, t, early, a, b], descendants([t]))]
    ['x', 't', 'mul', 'sin', 'mul_1']
    """
    known = set(nodes)
    placed: set[Node] = set()
    out: list[Node] = []

    def needs(node: Node) -> list[Node]:
        return [n for n in node.all_input_nodes if n in known]

    for node in nodes:
        if node.op == "placeholder" or node in anchors or node.is_impure():
            place_after_needs(node, needs, placed, out)
    for node in nodes:
        place_after_needs(node, needs, placed, out)
    return out


def partition_from_saved(joint: JointGraph, saved: Iterable[Node]) -> Partition:
    """Build the forward and backward graphs that pass exactly ``saved`` between them.

    >>> from ember.aotgraph.trace import Lifted, analyze, trace_joint
    >>> gm = torch.fx.symbolic_trace(lambda x: x.exp())
    >>> x = torch.randn(4, requires_grad=True)
    >>> lifted = Lifted.of(gm, [x])
    >>> joint = trace_joint(lifted, [x], analyze(lifted, [x], grad=True), {})
    >>> exp = next(n for n in joint.gm.graph.nodes if n.name == "exp")
    >>> "aten.exp" in partition_from_saved(joint, [exp]).backward.code
    False
    """
    primals, tangents, fw_outs, grads = joint_parts(joint)
    order = {n: i for i, n in enumerate(joint.gm.graph.nodes)}
    saved_nodes = sorted(set(saved), key=order.__getitem__)
    forward = extract(joint.gm, primals, [*fw_outs, *saved_nodes], "forward", _draws(joint))
    backward = extract(joint.gm, [*saved_nodes, *tangents], grads, "backward", late_from=tangents)
    sizes = [tensor_bytes(n.meta.get("val")) for n in saved_nodes]
    inputs = [s for s, n in zip(sizes, saved_nodes, strict=True) if _view_of_input(n)]
    return Partition(
        forward,
        backward,
        tuple(n.name for n in saved_nodes),
        sum(sizes),
        sum(sizes) - sum(inputs),
        joint.num_forward_outputs,
    )


def _draws(joint: JointGraph) -> list[Node]:
    """The forward's random ops that nothing reads: they still move torch's generator, so
    the forward graph runs them (a later draw would see other numbers without them)."""
    _, tangents, _, _ = joint_parts(joint)
    backward = descendants(tangents)
    nodes = joint.gm.graph.nodes
    return [n for n in nodes if node_class(n) is OpClass.RANDOM and n not in backward]


def _view_of_input(node: Node) -> bool:
    """Whether ``node`` is a graph input or a chain of views of one (it costs no memory)."""
    return view_root(node).op == "placeholder"


def view_root(node: Node) -> Node:
    """The node that ``node`` is a chain of views of (``node`` itself if not a view)."""
    while node_class(node) is OpClass.VIEW and isinstance(node.args[0], Node):
        node = node.args[0]
    return node


def forward_nodes(joint: JointGraph) -> set[Node]:
    """Nodes the forward graph must compute: ancestors of its outputs and of random ops, and
    the ``getitem`` users of multi-output nodes among them (a tuple cannot be saved)."""
    primals, _, fw_outs, _ = joint_parts(joint)
    random = [n for n in joint.gm.graph.nodes if node_class(n) is OpClass.RANDOM]
    nodes = ancestors([*fw_outs, *random, *primals])
    for node in list(nodes):
        if isinstance(node.meta.get("val"), tuple | list):
            nodes.update(u for u in node.users if u.op == "call_function")
    return nodes


def default_partition(joint: JointGraph) -> Partition:
    """Save what the backward graph reads from the forward graph; recompute nothing.

    The forward graph computes its outputs (and every random op); the backward graph
    reads any of those values it needs as saved values and computes the rest.

    >>> from ember.aotgraph.trace import Lifted, analyze, trace_joint
    >>> gm = torch.fx.symbolic_trace(lambda x, w: torch.nn.functional.gelu(x @ w))
    >>> x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
    >>> lifted = Lifted.of(gm, [x, w])
    >>> joint = trace_joint(lifted, [x, w], analyze(lifted, [x, w], grad=True), {})
    >>> default_partition(joint).saved
    ('primals_1', 'mm')
    """
    _, _, _, grads = joint_parts(joint)
    fw = forward_nodes(joint)
    backward_region = ancestors(grads, stop=fw) - fw
    saved = [n for n in fw if any(u in backward_region for u in n.users)]
    saved += [g for g in grads if g is not None and g in fw]
    return partition_from_saved(joint, saved)
