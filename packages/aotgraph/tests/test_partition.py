"""Partitioners: what they save, what min-cut recomputes, and the checkers that hold them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ember.aotgraph import (
    CheckError,
    default_decompositions,
    default_partition,
    min_cut_partition,
    partition_from_saved,
)
from ember.aotgraph.check import check_joint, check_partition
from ember.aotgraph.ops import OpClass, node_class
from ember.aotgraph.partition import descendants, joint_parts
from ember.aotgraph.trace import JointGraph, Lifted, analyze, trace_joint


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 64), nn.Linear(64, 16)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return self.drop(self.down(F.gelu(self.up(x)).tanh())) + x


def joint_of(fn, *inputs) -> JointGraph:
    lifted = Lifted.of(torch.fx.symbolic_trace(fn), list(inputs))
    flat = lifted.flat_inputs(list(inputs))
    signature = analyze(lifted, flat, grad=True)
    return trace_joint(lifted, flat, signature, default_decompositions())


@pytest.fixture
def mlp_joint() -> JointGraph:
    return joint_of(Mlp().train(), torch.randn(8, 16, requires_grad=True))


def test_min_cut_saves_fewer_bytes_than_default(mlp_joint):
    default, min_cut = default_partition(mlp_joint), min_cut_partition(mlp_joint)
    check_partition(mlp_joint, default)
    check_partition(mlp_joint, min_cut)
    assert min_cut.saved_bytes < default.saved_bytes
    assert min_cut.activation_bytes < default.activation_bytes


def test_min_cut_never_recomputes_random_ops_or_matmuls(mlp_joint):
    part = min_cut_partition(mlp_joint)
    for node in part.backward.graph.nodes:
        kind = node_class(node)
        assert kind is not OpClass.RANDOM
        if kind is OpClass.COMPUTE:  # only the gradient matmuls, which read a tangent
            tangents = [n for n in part.backward.graph.nodes if n.name.startswith("tangents")]
            assert node in descendants(tangents)


def test_min_cut_recomputes_pointwise_ops(mlp_joint):
    part = min_cut_partition(mlp_joint)
    assert "aten.tanh.default" in part.backward.code  # recomputed from the saved matmul output
    assert "tanh" not in part.saved


class _TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 64), nn.Linear(64, 16)
        self.c, self.d = nn.Linear(16, 64), nn.Linear(64, 16)

    def forward(self, x):
        x = x + self.b(_new_gelu(self.a(x)))
        return x + self.d(_new_gelu(self.c(x)))


def _new_gelu(h):  # as GPT-2 writes it: forward ops, which the backward recomputes
    return 0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * (h + 0.044715 * h.pow(3.0))))


def test_backward_recomputes_each_layer_where_its_gradient_needs_it():
    """Min-cut recomputes each GELU's ``tanh`` in the backward graph. Each comes right
    before its own layer's gradient, not all at the top: the first layer's (the last the
    backward reaches) after the second layer's weight gradient, so it is not alive through
    the second layer's backward."""
    joint = joint_of(_TwoLayers(), torch.randn(8, 16, requires_grad=True))
    part = min_cut_partition(joint)
    check_partition(joint, part)
    nodes = list(part.backward.graph.nodes)
    tanhs = [k for k, n in enumerate(nodes) if n.target == torch.ops.aten.tanh.default]
    assert len(tanhs) == 2 and "tanh" not in part.saved
    mms = [k for k, n in enumerate(nodes) if n.target == torch.ops.aten.mm.default]
    tangents = descendants([n for n in nodes if n.name.startswith("tangents")])
    first_grad = min(k for k in mms if nodes[k] in tangents)
    assert tanhs[0] > first_grad and tanhs[1] > mms[2], part.backward.code


def test_extract_refuses_a_backward_that_reads_an_unsaved_value():
    joint = joint_of(lambda x: x.sin(), torch.randn(3, requires_grad=True))
    with pytest.raises(ValueError, match="backward graph reads primals_1, which is neither saved"):
        partition_from_saved(joint, [])


def test_checker_catches_random_op_in_backward():
    joint = joint_of(lambda x: x.exp(), torch.randn(3, requires_grad=True))
    part = default_partition(joint)
    graph = part.backward.graph
    out = graph.output_node()
    with graph.inserting_before(out):
        first = next(iter(graph.nodes))
        graph.call_function(torch.ops.aten.bernoulli.p, (first, 0.5))
    with pytest.raises(CheckError, match="backward graph: bernoulli_p draws random numbers"):
        check_partition(joint, part)


def test_checker_catches_wrong_output_count():
    joint = joint_of(lambda x: x.exp(), torch.randn(3, requires_grad=True))
    _, _, fw_outs, _ = joint_parts(joint)
    broken = JointGraph(joint.gm, joint.num_primals, joint.num_tangents, 2, (), joint.num_grads)
    with pytest.raises(CheckError, match="joint graph: 2 outputs, expected forward outputs"):
        check_joint(broken)
    assert len(fw_outs) == 1


def _tagged_joint(region: tuple[str, ...], dropout: bool = False) -> JointGraph:
    """``sin(gelu(x @ w1) @ w2).sum()`` (a dropout after gelu if asked) with the nodes
    ``region`` tagged as a torch.utils.checkpoint region, as ember's capture tags them."""
    from torch.utils.checkpoint import CheckpointPolicy

    def f(x, w1, w2):
        h = F.gelu(x @ w1)
        h = F.dropout(h, 0.5) if dropout else h
        return (h @ w2).sin().sum()

    gm = torch.fx.symbolic_trace(f)
    for node in gm.graph.nodes:
        if node.name in region:
            node.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE
            node.meta["ac_graph_id"] = 1
    ins = [torch.randn(4, 8), torch.randn(8, 16, requires_grad=True), torch.randn(16, 8)]
    ins[2].requires_grad_()
    lifted = Lifted.of(gm, ins)
    return trace_joint(lifted, ins, analyze(lifted, ins, grad=True), {})


def test_min_cut_recomputes_checkpoint_regions():
    """A checkpointed region's values are recomputed in backward from its inputs (matmuls
    included), as eager's checkpoint does; its result, read outside it, may be saved."""
    plain = min_cut_partition(_tagged_joint(()))
    joint = _tagged_joint(("matmul", "gelu", "matmul_1"))
    region = min_cut_partition(joint)
    assert "mm" in plain.saved and "mm" not in region.saved  # x @ w1 is recomputed
    assert set(region.saved) == {"primals_1", "primals_2", "primals_3", "cos"}
    assert region.activation_bytes < plain.activation_bytes
    check_partition(joint, region)


def test_random_ops_of_a_checkpoint_region_run_once():
    """A dropout inside the region draws once, in forward: its mask is saved, so backward
    uses the forward's numbers (eager's checkpoint replays the RNG to the same effect)."""
    joint = _tagged_joint(("matmul", "gelu", "dropout", "matmul_1"), dropout=True)
    part = min_cut_partition(joint)
    backward_random = [n for n in part.backward.graph.nodes if node_class(n) is OpClass.RANDOM]
    assert not backward_random and "mm" not in part.saved
    check_partition(joint, part)
