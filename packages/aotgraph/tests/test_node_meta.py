"""Node metadata through the aten trace: every aten node gets ``original_aten`` (the
overload its captured op dispatched to) and keeps its captured node's ``nn_module_stack``,
``source_fn_stack``, ``stack_trace`` and torch's other copied keys (``custom``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ember.aotgraph import aot_compile

aten = torch.ops.aten


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return F.gelu(self.lin(x)).sum(dim=-1)


def annotated(fn: Any) -> torch.fx.GraphModule:
    """``fn`` traced, each node annotated as capture would annotate it (plus a custom key)."""
    gm = torch.fx.symbolic_trace(fn)
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method", "call_module"):
            node.meta["stack_trace"] = f'  File "model.py", line 3, in forward\n    {node.name}\n'
            node.meta["nn_module_stack"] = {"1": ("L['self'].block", nn.Linear)}
            node.meta["source_fn_stack"] = [(node.name, node.target)]
            node.meta["custom"] = {"tag": node.name}
    return gm


def compile_graphs(gm: torch.fx.GraphModule, inputs: list[Any]) -> list[torch.fx.GraphModule]:
    """The aten graphs aot_compile hands its compilers for one call (and its result)."""
    graphs: list[torch.fx.GraphModule] = []

    def keep(g: torch.fx.GraphModule, example: Any) -> Any:
        graphs.append(g)
        return g

    expected = gm(*[t.detach().clone() for t in inputs])  # eager, on copies (inputs written)
    compiled = aot_compile(gm, inputs, fw_compiler=keep, cache=False)
    out = compiled(*inputs)
    assert torch.allclose(out, expected)
    if out.requires_grad:
        out.sum().backward()
    return graphs


def aten_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def origin(node: torch.fx.Node) -> str:
    """The name of the captured node ``node`` was traced from (its custom tag)."""
    return node.meta["custom"]["tag"]


def test_forward_nodes_keep_their_captured_nodes_meta() -> None:
    gm = annotated(Net())
    with torch.no_grad():  # the inference graph
        (fw,) = compile_graphs(gm, [torch.randn(2, 4)])
    nodes = aten_nodes(fw)
    assert len(nodes) >= 3
    for node in nodes:
        name = origin(node)
        assert node.meta["stack_trace"] == f'  File "model.py", line 3, in forward\n    {name}\n'
        assert node.meta["nn_module_stack"] == {"1": ("L['self'].block", nn.Linear)}
        assert node.meta["source_fn_stack"][-1][0] == name
        assert isinstance(node.meta["original_aten"], torch._ops.OpOverload)
    by_op = {n.meta["original_aten"]: origin(n) for n in nodes}
    assert by_op[aten.gelu.default] == "gelu"
    assert by_op[aten.sum.dim_IntList] == "sum_1"
    # the printed graph shows each node's source line
    assert "File: model.py:3 in forward, code: gelu\n" in fw.print_readable(print_output=False)


def test_decomposed_nodes_name_the_op_before_decomposition() -> None:
    gm = annotated(lambda x: F.silu(x) * 2)
    table = {aten.silu.default: lambda x: x * torch.sigmoid(x)}
    graphs: list[torch.fx.GraphModule] = []
    compiled = aot_compile(
        gm, [torch.randn(3)], fw_compiler=lambda g, ex: graphs.append(g) or g,
        decompositions=table, cache=False,
    )  # fmt: skip
    assert torch.allclose(compiled(torch.ones(3))[0], F.silu(torch.ones(3)) * 2)
    (fw,) = graphs
    silu = [n for n in aten_nodes(fw) if origin(n) == "silu"]
    assert {n.target for n in silu} == {aten.sigmoid.default, aten.mul.Tensor}
    assert {n.meta["original_aten"] for n in silu} == {aten.silu.default}


def test_training_graphs_keep_the_meta_of_forward_nodes() -> None:
    gm = annotated(lambda x, w: (x @ w).tanh().sum())
    x, w = torch.randn(2, 3), torch.randn(3, 3, requires_grad=True)
    fw, bw = compile_graphs(gm, [x, w])
    captured = [n for n in aten_nodes(fw) if "custom" in n.meta]
    assert {origin(n) for n in captured} == {"matmul", "tanh", "sum_1"}
    for node in aten_nodes(bw):  # autograd's formulas: tagged as torch tags them
        assert isinstance(node.meta["original_aten"], torch._ops.OpOverload)
        assert node.meta["partitioner_tag"] == "is_backward"
    assert_backward_of_forward(bw)


def assert_backward_of_forward(bw: torch.fx.GraphModule) -> None:
    """Each backward node has the keys of the forward op whose gradient it computes."""
    of = {}
    for node in aten_nodes(bw):
        (forward_name, _), *_ = node.meta["fwd_source_fn_stack"]
        assert node.meta["fwd_nn_module_stack"] == {"1": ("L['self'].block", nn.Linear)}
        line = f'  File "model.py", line 3, in forward\n    {forward_name}\n'
        assert node.meta["stack_trace"] == line  # the forward's line, as torch shows it
        of[node.meta["original_aten"]] = forward_name
    assert of[aten.tanh_backward.default] == "tanh"
    assert of[aten.mm.default] == "matmul"  # w's gradient: x.t() @ grad


def test_backward_keys_survive_the_functionalizing_retrace() -> None:
    def f(x, w, buf):
        buf.add_(1)  # an input written: traced again over functionalize
        return (x @ w).tanh().sum() * buf.sum()

    gm = annotated(f)
    x, w, buf = torch.randn(2, 3), torch.randn(3, 3, requires_grad=True), torch.zeros(2)
    fw, bw = compile_graphs(gm, [x, w, buf])
    assert any(origin(n) == "add_" for n in aten_nodes(fw) if "custom" in n.meta)
    assert_backward_of_forward(bw)


def test_functionalized_retrace_keeps_the_meta() -> None:
    def f(x):
        y = x * 2
        y.relu_()  # a mutation left after out_of_place: make_fx over functionalize again
        return y + x

    gm = annotated(f)
    (fw,) = compile_graphs(gm, [torch.randn(4)])
    origins = {n.target: origin(n) for n in aten_nodes(fw)}
    assert origins[aten.relu.default] == "relu_"
    assert origins[aten.add.Tensor] == "add"


def test_graphs_without_meta_still_get_original_aten() -> None:
    gm = torch.fx.symbolic_trace(lambda x: x.exp() + 1)
    (fw,) = compile_graphs(gm, [torch.randn(2)])
    for node in aten_nodes(fw):
        assert isinstance(node.meta["original_aten"], torch._ops.OpOverload)
        assert "stack_trace" not in node.meta
