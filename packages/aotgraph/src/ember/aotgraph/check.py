"""Checkers for aotgraph's IRs, run after each pass when ``EMBER_CHECK=1`` (STYLE rule 10).

A joint graph is functional (no op that mutates its arguments) and has as many
placeholders and outputs as its :class:`~ember.aotgraph.trace.JointGraph` says.
A partition passes the saved values between its graphs consistently, and its
backward graph never draws random numbers (masks are saved, never redrawn).

>>> import torch
>>> from ember.aotgraph.trace import Lifted, analyze, trace_joint
>>> x = torch.randn(3, requires_grad=True)
>>> lifted = Lifted.of(torch.fx.symbolic_trace(lambda x: x.exp()), [x])
>>> joint = trace_joint(lifted, [x], analyze(lifted, [x], grad=True), {})
>>> check_joint(joint)
>>> exp = next(n for n in joint.gm.graph.nodes if n.name == "exp")
>>> exp.target = torch.ops.aten.exp_.default
>>> check_joint(joint)
Traceback (most recent call last):
ember.aotgraph.check.CheckError: joint graph: exp mutates its input (aten.exp_.default)
"""

from __future__ import annotations

import torch
import torch.fx

from ember.aotgraph import settings
from ember.aotgraph.ops import OpClass, node_class
from ember.aotgraph.partition import Partition
from ember.aotgraph.trace import JointGraph

__all__ = ["CheckError", "check_joint", "check_partition", "enabled"]


class CheckError(Exception):
    """An aotgraph IR broke one of its invariants (a bug in aotgraph, not in user code).

    >>> raise CheckError("joint graph: 3 placeholders, expected primals + tangents")
    Traceback (most recent call last):
    ember.aotgraph.check.CheckError: joint graph: 3 placeholders, expected primals + tangents
    """


def enabled() -> bool:
    """Whether checkers run: the ``check`` setting (``EMBER_CHECK=1``).

    >>> isinstance(enabled(), bool)
    True
    """
    return settings.section.get().check


def _fail(where: str, message: str) -> None:
    raise CheckError(f"{where}: {message}")


def check_functional(gm: torch.fx.GraphModule, where: str) -> None:
    """No node mutates its arguments; the graph lints."""
    gm.graph.lint()
    for node in gm.graph.nodes:
        target = node.target
        if node.op == "call_function" and isinstance(target, torch._ops.OpOverload):
            if target._schema.is_mutable:
                _fail(where, f"{node.name} mutates its input ({target})")


def _counts(gm: torch.fx.GraphModule) -> tuple[int, int]:
    placeholders = len(gm.graph.find_nodes(op="placeholder"))
    return placeholders, len(gm.graph.output_node().args[0])  # type: ignore[arg-type]


def check_joint(joint: JointGraph) -> None:
    """A joint (or forward-only) graph is functional and shaped as it says."""
    check_functional(joint.gm, "joint graph")
    inputs, outputs = _counts(joint.gm)
    if inputs != joint.num_primals + joint.num_tangents:
        _fail("joint graph", f"{inputs} placeholders, expected primals + tangents")
    if outputs != joint.num_forward_outputs + joint.num_grads:
        _fail("joint graph", f"{outputs} outputs, expected forward outputs + grads")


def check_partition(joint: JointGraph, part: Partition) -> None:
    """Both graphs are functional, agree on the saved values, and backward draws no RNG.

    >>> import torch
    >>> from ember.aotgraph.trace import Lifted, analyze, trace_joint
    >>> from ember.aotgraph.partition import default_partition
    >>> x = torch.randn(3, requires_grad=True)
    >>> lifted = Lifted.of(torch.fx.symbolic_trace(lambda x: x.exp()), [x])
    >>> joint = trace_joint(lifted, [x], analyze(lifted, [x], grad=True), {})
    >>> check_partition(joint, default_partition(joint))
    """
    check_functional(part.forward, "forward graph")
    check_functional(part.backward, "backward graph")
    n_saved = len(part.saved)
    fw_in, fw_out = _counts(part.forward)
    if (fw_in, fw_out) != (joint.num_primals, part.num_forward_outputs + n_saved):
        _fail("forward graph", f"{fw_in} inputs and {fw_out} outputs, expected primals and "
              "forward outputs + saved")  # fmt: skip
    bw_in, bw_out = _counts(part.backward)
    if (bw_in, bw_out) != (n_saved + joint.num_tangents, joint.num_grads):
        _fail("backward graph", f"{bw_in} inputs and {bw_out} outputs, expected saved + "
              "tangents and grads")  # fmt: skip
    for node in part.backward.graph.nodes:
        if node_class(node) is OpClass.RANDOM:
            _fail("backward graph", f"{node.name} draws random numbers; it must be saved")
