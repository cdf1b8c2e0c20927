"""lower_exported: an exported program, given as a graph module and plain data, lowered to aten.

ember.capture is not imported here (aotgraph is tested alone): the programs are written by
hand in the form capture's export makes, and ``fixtures/conv_bn_signature.json`` is the
signature capture wrote for ``ConvBN`` below (``ExportSignature.to_json()``, with a
dynamic batch ``Dim`` and a float keyword argument), which pins the format between them.
The end-to-end test (export, save, load, lower) is in compiler-api's test_export_lowering.py.
"""

from __future__ import annotations

import copy
import json
import operator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

from ember.aotgraph import (
    IOSpec,
    LoweringError,
    ProgramSignature,
    default_decompositions,
    lower_exported,
)

FIXTURE = Path(__file__).parent / "fixtures" / "conv_bn_signature.json"


class ConvBN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x, *, scale=2.0):
        return {"out": torch.relu(self.bn(self.conv(x))) * scale}


def exported_conv_bn(
    p_conv_weight, p_conv_bias, p_bn_weight, p_bn_bias,
    b_bn_num_batches_tracked, b_bn_running_mean, b_bn_running_var, x, scale,
):  # fmt: skip
    """The graph ember.capture.export makes of ConvBN in train mode (torch-level ops)."""
    conv2d = torch.conv2d(x, p_conv_weight, p_conv_bias, (1, 1), (0, 0), (1, 1), 1)
    b_bn_num_batches_tracked.add_(1)
    batch_norm = F.batch_norm(
        conv2d, b_bn_running_mean, b_bn_running_var, p_bn_weight, p_bn_bias, True, 0.1, 1e-05
    )
    mul = torch.relu(batch_norm) * scale
    return (b_bn_num_batches_tracked, b_bn_running_mean, b_bn_running_var, mul)


def _conv_bn_program():
    model = ConvBN().train()
    signature = json.loads(FIXTURE.read_text())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state = {k: torch.nn.Parameter(v) if "bn.running" not in k and "num_" not in k else v
             for k, v in state.items()}  # fmt: skip
    return model, torch.fx.symbolic_trace(exported_conv_bn), signature, state


def _ops(gm: torch.fx.GraphModule) -> set[str]:
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}


def test_fixture_signature_round_trips_through_the_schema():
    data = json.loads(FIXTURE.read_text())
    sig = ProgramSignature.from_json(data)
    assert sig.to_json() == data
    assert [s.kind for s in sig.outputs] == ["buffer_mutation"] * 3 + ["user_output"]
    assert sig.inputs_of("user_input") == (
        IOSpec("user_input", "x", None, 0),
        IOSpec("user_input", "scale", None, 1),
    )


def test_inference_ir_is_aten_and_matches_eager_with_buffer_updates():
    model, gm, signature, state = _conv_bn_program()
    x = torch.randn(4, 3, 8, 8)
    program = lower_exported(gm, signature, state, args=(x,), kwargs={"scale": 0.5})
    ops = _ops(program.graph_module) - {str(operator.getitem)}
    assert ops and all(op.startswith("aten.") for op in ops)
    placeholders = [n.name for n in program.graph_module.graph.find_nodes(op="placeholder")]
    assert placeholders == [s["name"] for s in signature["inputs"]]  # names and order kept
    outputs = program.signature.outputs
    assert [(s.kind, s.target) for s in outputs[:3]] == [
        ("buffer_mutation", t)
        for t in ("bn.num_batches_tracked", "bn.running_mean", "bn.running_var")
    ]
    assert outputs[3].kind == "user_output"
    mod = program.module()
    for scale in (0.5, 3.0):  # a float input stays an input, not a constant
        got, want = mod(x, scale=scale), model(x, scale=scale)
        torch.testing.assert_close(got["out"], want["out"])
    for key, value in model.state_dict().items():
        torch.testing.assert_close(mod.state_dict()[key], value, msg=key)


def test_dynamic_batch_stays_dynamic_with_the_traces_guard_as_a_relation():
    model, gm, signature, state = _conv_bn_program()
    with pytest.raises(LoweringError, match=r"args\[0\] has a dynamic size \(Dim 'batch'\)"):
        lower_exported(gm, signature, state)  # no example for a dynamic size
    with pytest.raises(LoweringError, match=r"outside \[2, 16\]"):
        lower_exported(
            gm, signature, state, args=(torch.randn(17, 3, 8, 8),), kwargs={"scale": 1.0}
        )
    program = lower_exported(gm, signature, state, args=(torch.randn(4, 3, 8, 8),),
                             kwargs={"scale": 1.0})  # fmt: skip
    extra = program.signature.extra
    assert extra["checks"][0]["sizes"] == ["batch", 3, 8, 8]
    # tracing aten.convolution guards on the batch size: a relation of the lowered program
    assert len(extra["relations"]) == len(signature["relations"]) + 1
    assert extra["relations"][-1]["expr"].endswith("< 16")
    mod = program.module()
    for n in (2, 5, 15):
        x = torch.randn(n, 3, 8, 8)
        torch.testing.assert_close(mod(x, scale=1.5)["out"], model(x, scale=1.5)["out"])
    torch.testing.assert_close(mod.state_dict()["bn.running_var"], model.bn.running_var)
    with pytest.raises(LoweringError, match="the program needs s"):
        mod(torch.randn(16, 3, 8, 8), scale=1.0)
    with pytest.raises(LoweringError, match=r"expected dtype torch.float32, got torch.float64"):
        mod(torch.randn(4, 3, 8, 8, dtype=torch.float64), scale=1.0)
    with pytest.raises(LoweringError, match=r"kwargs\['scale'\]: expected a float, got 1"):
        mod(torch.randn(4, 3, 8, 8), scale=1)
    with pytest.raises(LoweringError, match="structured as"):
        mod(torch.randn(4, 3, 8, 8))


def test_dynamic_dim_lowered_at_the_example_size_when_a_guard_cannot_be_checked(monkeypatch):
    def unreadable(expr, values):
        raise LoweringError(f"cannot check shape relation {expr!r}")

    monkeypatch.setattr("ember.aotgraph.exported_shapes.relation_holds", unreadable)
    _, gm, signature, state = _conv_bn_program()
    program = lower_exported(gm, signature, state, args=(torch.randn(4, 3, 8, 8),),
                             kwargs={"scale": 1.0})  # fmt: skip
    assert program.signature.extra["checks"][0]["sizes"] == [4, 3, 8, 8]
    with pytest.raises(LoweringError, match=r"args\[0\]\.size\(0\): expected 4, got 5"):
        program.module()(torch.randn(5, 3, 8, 8), scale=1.0)


def test_joint_ir_gives_eager_gradients_and_keeps_the_signature():
    model, gm, signature, state = _conv_bn_program()
    eager = copy.deepcopy(model)
    x = torch.randn(4, 3, 8, 8)
    program = lower_exported(gm, signature, state, args=(x,), kwargs={"scale": 0.5}, joint=True)
    sig = program.signature
    assert sig.inputs[: len(signature["inputs"])] == ProgramSignature.from_json(signature).inputs
    (tangent,) = sig.inputs_of("tangent")
    user = sig.outputs_of("user_output")
    assert tangent.target == user[0].name  # the output it is the cotangent of
    kinds = [s.kind for s in sig.outputs]
    assert kinds == ["buffer_mutation"] * 3 + ["user_output"] + ["gradient_to_parameter"] * 4
    cot = torch.randn(4, 4, 6, 6)
    outs = program.graph_module(*program.inputs((x,), {"scale": 0.5}), cot)
    want = eager(x, scale=0.5)["out"]
    grads = torch.autograd.grad(want, list(eager.parameters()), cot)
    by_target = {s.target: v for s, v in zip(sig.outputs, outs, strict=True)}
    for (name, _), grad in zip(eager.named_parameters(), grads, strict=True):
        torch.testing.assert_close(by_target[name], grad, msg=name)
    torch.testing.assert_close(outs[3], want)
    torch.testing.assert_close(by_target["bn.running_mean"], eager.bn.running_mean)
    with pytest.raises(LoweringError, match="takes tangents"):
        program.module()


def test_user_input_mutation_becomes_an_output_written_back():
    def f(x, y):
        x.mul_(2)
        return (x, x + y)

    sig = {
        "inputs": [{"kind": "user_input", "name": "x", "leaf": 0},
                   {"kind": "user_input", "name": "y", "leaf": 1}],
        "outputs": [{"kind": "user_input_mutation", "name": "mul_", "target": "x"},
                    {"kind": "user_output", "name": "add"}],
    }  # fmt: skip
    program = lower_exported(
        torch.fx.symbolic_trace(f), sig, {}, args=(torch.ones(2), torch.ones(2))
    )
    assert "aten.mul_.Tensor" not in _ops(program.graph_module)  # functional
    assert [(s.kind, s.target) for s in program.signature.outputs] == [
        ("user_input_mutation", "x"), ("user_output", None),
    ]  # fmt: skip
    x = torch.tensor([1.0, 3.0])
    (out,) = program.module()(x, torch.ones(2))
    assert torch.equal(x, torch.tensor([2.0, 6.0])) and torch.equal(out, torch.tensor([3.0, 7.0]))


def test_inputs_returned_as_they_are_and_constants_stay_outputs():
    def f(x, rest):
        return (x + 1, rest, None)

    sig = {
        "inputs": [{"kind": "user_input", "name": "x", "leaf": 0},
                   {"kind": "user_input", "name": "rest", "leaf": 1}],
        "outputs": [{"kind": "user_output", "name": "add"}, {"kind": "user_output", "name": "rest"},
                    {"kind": "user_output", "name": None}],
    }  # fmt: skip
    program = lower_exported(
        torch.fx.symbolic_trace(f), sig, {}, args=(torch.ones(2), torch.ones(3))
    )
    assert [s.name for s in program.signature.outputs] == ["add", "rest", None]
    rest = torch.zeros(3)
    got = program.module()(torch.ones(2), rest)
    assert got[1] is rest and got[2] is None and torch.equal(got[0], torch.full((2,), 2.0))


def test_an_input_named_like_an_aten_node_keeps_its_name():
    def f(mm, w):
        return (mm @ w,)

    sig = {
        "inputs": [{"kind": "user_input", "name": "mm", "leaf": 0},
                   {"kind": "constant_tensor", "name": "w", "target": "W"}],
        "outputs": [{"kind": "user_output", "name": "matmul"}],
    }  # fmt: skip
    w = torch.randn(3, 2)
    program = lower_exported(
        torch.fx.symbolic_trace(f), sig, {}, {"W": w}, args=(torch.ones(4, 3),)
    )
    names = [n.name for n in program.graph_module.graph.nodes]
    assert names[:2] == ["mm", "w"] and len(set(names)) == len(names)
    x = torch.randn(4, 3)
    torch.testing.assert_close(program.module()(x)[0], x @ w)


def test_decomposition_table_is_the_callers():
    def f(x):
        return (F.gelu(x),)

    sig = {"inputs": [{"kind": "user_input", "name": "x", "leaf": 0}],
           "outputs": [{"kind": "user_output", "name": "gelu"}]}  # fmt: skip
    gm, args = torch.fx.symbolic_trace(f), (torch.randn(5),)
    assert "aten.gelu.default" in _ops(lower_exported(gm, sig, {}, args=args).graph_module)
    table = default_decompositions()
    table.update(torch._decomp.get_decompositions([torch.ops.aten.gelu.default]))
    program = lower_exported(gm, sig, {}, args=args, decompositions=table)
    assert "aten.gelu.default" not in _ops(program.graph_module)
    torch.testing.assert_close(program.module()(args[0])[0], F.gelu(args[0]))


def test_node_metadata_survives_lowering():
    gm = torch.fx.symbolic_trace(lambda x: (torch.sigmoid(x) * 2,))
    for node in gm.graph.nodes:
        node.meta["stack_trace"] = f'  File "model.py", line 7, in forward\n    {node.name}\n'
    sig = {"inputs": [{"kind": "user_input", "name": "x", "leaf": 0}],
           "outputs": [{"kind": "user_output", "name": "mul"}]}  # fmt: skip
    program = lower_exported(gm, sig, {}, args=(torch.ones(2),))
    metas = [(str(n.meta["original_aten"]), n.meta["stack_trace"].split()[-1])
             for n in program.graph_module.graph.nodes if n.op == "call_function"]  # fmt: skip
    assert metas == [("aten.sigmoid.default", "sigmoid"), ("aten.mul.Tensor", "mul")]


def _bad(edit):
    data = json.loads(FIXTURE.read_text())
    edit(data)
    return data


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["inputs"].pop(), "the signature names inputs"),
        (lambda d: d["inputs"][0].update(kind="weight"), "input 0 has unknown kind 'weight'"),
        (lambda d: d["inputs"][7].update(leaf=None), "user input 'x' has no leaf"),
        (lambda d: d["inputs"][0].update(target="conv.nothing"), "no tensor 'conv.nothing'"),
        (lambda d: d["outputs"].pop(0), "the graph returns 4 values, its signature lists 3"),
        (lambda d: d.pop("outputs"), "not a program signature: KeyError"),
    ],
)
def test_bad_programs_are_lowering_errors(edit, message):
    _, gm, _, state = _conv_bn_program()
    args, kwargs = (torch.randn(2, 3, 8, 8),), {"scale": 1.0}
    with pytest.raises(LoweringError, match=message):
        lower_exported(gm, _bad(edit), state, args=args, kwargs=kwargs)


def test_parameter_written_in_place_is_refused():
    def f(p_w, x):
        p_w.add_(1)
        return (x * p_w,)

    sig = {"inputs": [{"kind": "parameter", "name": "p_w", "target": "w"},
                      {"kind": "user_input", "name": "x", "leaf": 0}],
           "outputs": [{"kind": "user_output", "name": "mul"}]}  # fmt: skip
    with pytest.raises(LoweringError, match="writes parameter w in place"):
        lower_exported(torch.fx.symbolic_trace(f), sig, {"w": torch.ones(2)}, args=(torch.ones(2),))


def test_example_inputs_made_from_the_checks():
    def f(x, n):
        return (x.sum() * n,)

    spec = pytree.tree_flatten(((torch.ones(1), 2.0), {}))[1]
    sig = {"inputs": [{"kind": "user_input", "name": "x", "leaf": 0},
                      {"kind": "user_input", "name": "n", "leaf": 1}],
           "outputs": [{"kind": "user_output", "name": "mul"}],
           "in_spec": pytree.treespec_dumps(spec),
           "checks": [
               {"leaf": 0, "path": "args[0]", "kind": "tensor", "dtype": "torch.int64",
                "sizes": [3]},
               {"leaf": 1, "path": "args[1]", "kind": "number", "pytype": "float"}]}  # fmt: skip
    program = lower_exported(torch.fx.symbolic_trace(f), sig, {})
    assert program.module()(torch.tensor([1, 2, 3]), 0.5) == (torch.tensor(3.0),)


def test_joint_ir_without_gradients_is_a_lowering_error():
    sig = {"inputs": [{"kind": "user_input", "name": "x", "leaf": 0}],
           "outputs": [{"kind": "user_output", "name": "sin"}]}  # fmt: skip
    gm = torch.fx.symbolic_trace(lambda x: (x.sin(),))
    with pytest.raises(LoweringError, match="needs an input that requires grad"):
        lower_exported(gm, sig, {}, args=(torch.ones(2),), joint=True)
    program = lower_exported(gm, sig, {}, args=(torch.ones(2, requires_grad=True),), joint=True)
    assert [s.kind for s in program.signature.outputs] == ["user_output", "gradient_to_user_input"]
    assert program.signature.outputs[1].target == "x"
    x = torch.tensor([0.0, 1.0])
    out, grad = program.graph_module(*program.inputs((x,)), torch.ones(2))
    torch.testing.assert_close((out, grad), (torch.sin(x), torch.cos(x)))


def exported_mlp(p_fc_weight, p_fc_bias, x):
    return (torch.relu(F.linear(x, p_fc_weight, p_fc_bias)),)


def _mlp_signature(relations=()):
    spec = pytree.tree_flatten(((torch.ones(1),), {}))[1]
    leaf = pytree.tree_flatten(torch.ones(1))[1]
    return {
        "inputs": [{"kind": "parameter", "name": "p_fc_weight", "target": "fc.weight"},
                   {"kind": "parameter", "name": "p_fc_bias", "target": "fc.bias"},
                   {"kind": "user_input", "name": "x", "leaf": 0}],
        "outputs": [{"kind": "user_output", "name": "relu"}],
        "in_spec": pytree.treespec_dumps(spec), "out_spec": pytree.treespec_dumps(leaf),
        "checks": [{"leaf": 0, "path": "args[0]", "kind": "tensor", "dtype": "torch.float32",
                    "sizes": ["batch", 4]}],
        "dims": [{"name": "batch", "min": None, "max": 32}],
        "relations": list(relations),
    }  # fmt: skip


def test_dynamic_dim_stays_dynamic_when_the_trace_needs_only_its_bounds():
    fc = torch.nn.Linear(4, 3)
    state = {"fc.weight": fc.weight, "fc.bias": fc.bias}
    even = {"expr": "Eq(Mod(s0, 2), 0)", "symbols": [["s0", 0, 0]]}
    gm = torch.fx.symbolic_trace(exported_mlp)
    program = lower_exported(gm, _mlp_signature([even]), state, args=(torch.randn(6, 4),))
    x_node = program.graph_module.graph.find_nodes(op="placeholder")[2]
    assert isinstance(x_node.meta["val"].shape[0], torch.SymInt)
    assert program.signature.extra["checks"][0]["sizes"] == ["batch", 4]
    assert program.signature.extra["dims"] == [{"name": "batch", "min": 2, "max": 32}]
    mod = program.module()
    for n in (2, 8, 32):
        x = torch.randn(n, 4)
        torch.testing.assert_close(mod(x), torch.relu(fc(x)))
    with pytest.raises(LoweringError, match=r"args\[0\]\.size\(0\) \(Dim 'batch'\) is 1, outside"):
        mod(torch.randn(1, 4))  # sizes 0 and 1 were specialised away
    with pytest.raises(LoweringError, match=r"is 34, outside \[2, 32\]"):
        mod(torch.randn(34, 4))
    with pytest.raises(LoweringError, match=r"the program needs Eq\(Mod\(s0, 2\), 0\) \(s0 = 7\)"):
        mod(torch.randn(7, 4))


def test_joint_ir_with_a_dynamic_dim_gives_gradients_at_other_sizes():
    fc = torch.nn.Linear(4, 3)
    state = {"fc.weight": fc.weight, "fc.bias": fc.bias}
    gm = torch.fx.symbolic_trace(exported_mlp)
    program = lower_exported(gm, _mlp_signature(), state, args=(torch.randn(6, 4),), joint=True)
    x, cot = torch.randn(11, 4), torch.randn(11, 3)
    out, grad_w, grad_b = program.graph_module(*program.inputs((x,)), cot)
    want = torch.relu(fc(x))
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(
        (grad_w, grad_b), torch.autograd.grad(want, [fc.weight, fc.bias], cot)
    )


@pytest.mark.parametrize(
    "expr", ["s0.__class__", "__import__('os')", "s0 ** 99", "[s0][0] > 1", "s0 >= 'a'"]
)
def test_relations_are_checked_without_running_their_text(expr):
    fc = torch.nn.Linear(4, 3)
    state = {"fc.weight": fc.weight, "fc.bias": fc.bias}
    sig = _mlp_signature([{"expr": expr, "symbols": [["s0", 0, 0]]}])
    with pytest.raises(LoweringError, match="cannot check shape relation"):
        lower_exported(torch.fx.symbolic_trace(exported_mlp), sig, state, args=(torch.ones(6, 4),))
