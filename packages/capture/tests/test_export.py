"""ember.capture.export: one standalone graph with a signature, .module(), checks, save/load.

Only ember.capture (and ember.guards) are imported: export tools depend on nothing else.
"""

from __future__ import annotations

import collections
import copy
import json
import os
import subprocess
import sys

import pytest
import torch

import ember.capture as ec
from ember.capture.export_program import CheckError, InputKind, OutputKind

try:
    from models import ZOO  # benchmarks/models, on the path the repository's conftest sets
except ImportError:  # the package's tests run without the repository around them
    ZOO = {}

SCALE = torch.tensor([1.0, 2.0, 3.0])  # a global constant tensor


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class ConvBN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class KwModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x, *, mask=None, scale=2.0):
        y = self.lin(x) * scale
        if mask is not None:
            y = y * mask
        return y.sum(), {"y": y, "pair": (x + 1, y - 1)}


def with_constant(x):
    return x * SCALE + 1


def _same(a, b) -> bool:
    fa, fb = torch.utils._pytree.tree_flatten(a), torch.utils._pytree.tree_flatten(b)
    if fa[1] != fb[1]:
        return False
    return all(
        torch.allclose(x, y) if isinstance(x, torch.Tensor) else x == y
        for x, y in zip(fa[0], fb[0], strict=True)
    )


def test_mlp_module_equals_eager_and_signature():
    torch.manual_seed(0)
    m = MLP()
    x = torch.randn(5, 4)
    ep = ec.export(m, (x,))
    kinds = [(s.kind, s.target) for s in ep.signature.inputs]
    assert kinds == [
        (InputKind.PARAMETER, "fc1.weight"),
        (InputKind.PARAMETER, "fc1.bias"),
        (InputKind.PARAMETER, "fc2.weight"),
        (InputKind.PARAMETER, "fc2.bias"),
        (InputKind.USER_INPUT, None),
    ]
    assert [s.kind for s in ep.signature.outputs] == [OutputKind.USER_OUTPUT]
    placeholders = [n.name for n in ep.graph.nodes if n.op == "placeholder"]
    assert placeholders == [s.name for s in ep.signature.inputs]
    other = torch.randn(5, 4)
    assert torch.allclose(ep.module()(other), m(other))
    assert set(ep.module().state_dict()) == set(m.state_dict())


def test_conv_bn_train_mutates_buffers_as_eager():
    torch.manual_seed(0)
    m = ConvBN().train()
    eager = copy.deepcopy(m)
    x = torch.randn(2, 3, 8, 8)
    ep = ec.export(m, (x,))
    # exporting ran nothing: the module's statistics are untouched
    assert int(m.bn.num_batches_tracked) == 0 and torch.equal(m.bn.running_mean, torch.zeros(4))
    mutated = {s.target for s in ep.signature.outputs if s.kind is OutputKind.BUFFER_MUTATION}
    assert mutated == {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}
    mod = ep.module()
    for _ in range(2):
        x = torch.randn(2, 3, 8, 8)
        assert torch.allclose(mod(x), eager(x), atol=1e-6)
    for name, buf in eager.named_buffers():
        assert torch.allclose(mod.get_buffer(name).float(), buf.float()), name


def test_kwargs_and_nested_outputs():
    torch.manual_seed(0)
    m = KwModel()
    x, mask = torch.randn(2, 3), torch.rand(2, 3)
    ep = ec.export(m, (x,), {"mask": mask, "scale": 3.0})
    x2, mask2 = torch.randn(2, 3), torch.rand(2, 3)
    assert _same(ep.module()(x2, mask=mask2, scale=3.0), m(x2, mask=mask2, scale=3.0))
    # the float is a graph input: another value computes another answer, as eager
    assert _same(ep.module()(x2, mask=mask2, scale=0.5), m(x2, mask=mask2, scale=0.5))
    with pytest.raises(CheckError, match="structured as"):
        ep.module()(x2)  # no mask: the program was exported for one


def test_function_with_constant_tensor():
    x = torch.randn(3)
    ep = ec.export(with_constant, (x,))
    constants = [s for s in ep.signature.inputs if s.kind is InputKind.CONSTANT_TENSOR]
    assert len(constants) == 1 and torch.equal(ep.constants[constants[0].target], SCALE)
    y = torch.randn(3)
    assert torch.allclose(ep.module()(y), with_constant(y))


def test_user_input_mutation_written_back():
    def bump(x, y):
        x.add_(1)
        return x * y

    x, y = torch.zeros(3), torch.ones(3)
    ep = ec.export(bump, (x.clone(), y))
    assert [s.kind for s in ep.signature.outputs] == [
        OutputKind.USER_INPUT_MUTATION,
        OutputKind.USER_OUTPUT,
    ]
    a, b = torch.zeros(3), torch.zeros(3)
    out = ep.module()(a, y)
    assert torch.equal(out, bump(b, y)) and torch.equal(a, b)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (torch.randn(5, 4, dtype=torch.float64), "args\\[0\\]: expected dtype torch.float32"),
        (torch.randn(5, 4, 1), "args\\[0\\]: expected 2 dimensions, got 3"),
        (torch.randn(6, 4), "args\\[0\\].size\\(0\\): expected 5, got 6"),
        ([1.0], "structured as"),
    ],
)
def test_checks_reject_wrong_inputs(bad, message):
    ep = ec.export(MLP(), (torch.randn(5, 4),))
    with pytest.raises(CheckError, match=message):
        ep.module()(bad)


def test_dynamic_dim_accepts_other_sizes_within_bounds():
    m = MLP()
    batch = ec.Dim("batch", min=2, max=64)
    ep = ec.export(m, (torch.randn(5, 4),), dynamic_shapes={"x": {0: batch}})
    assert ep.signature.checks[0].sizes == ("batch", 4)
    for n in (2, 9, 64):
        x = torch.randn(n, 4)
        assert torch.allclose(ep.module()(x), m(x))
    with pytest.raises(CheckError, match="above its max 64"):
        ep.module()(torch.randn(65, 4))
    with pytest.raises(CheckError, match="size\\(1\\): expected 4"):
        ep.module()(torch.randn(8, 5))


def test_same_dim_must_agree_and_relations_are_checked():
    def f(a, b):
        return a + b[: a.shape[0]]

    d = ec.Dim("n")
    ep = ec.export(f, (torch.ones(4), torch.ones(4)), dynamic_shapes=({0: d}, {0: d}))
    assert torch.equal(ep.module()(torch.ones(7), torch.ones(7)), torch.full((7,), 2.0))
    with pytest.raises(CheckError, match="both are Dim 'n'"):
        ep.module()(torch.ones(7), torch.ones(8))
    with pytest.raises(CheckError, match="s0"):
        ep.module()(torch.ones(1), torch.ones(1))  # the graph was made for sizes >= 2


def test_save_load_round_trip(tmp_path):
    torch.manual_seed(0)
    m = ConvBN().train()
    eager = copy.deepcopy(m)
    ep = ec.export(m, (torch.randn(2, 3, 8, 8),))
    ep.save(str(tmp_path))
    loaded = ec.load(str(tmp_path))
    assert loaded.signature == ep.signature
    mod = loaded.module()
    x = torch.randn(2, 3, 8, 8)
    assert torch.allclose(mod(x), eager(x), atol=1e-6)
    assert torch.allclose(mod.bn.running_var, eager.bn.running_var)
    # the tensors file is plain data: torch loads it with weights_only=True
    tensors = torch.load(os.path.join(tmp_path, "tensors.pt"), weights_only=True)
    assert set(tensors["state_dict"]) == {s.target for s in ep.signature.inputs if s.target}
    # node metadata survives, the module stack as strings
    doc = json.loads((tmp_path / "program.json").read_text())
    conv = next(n for n in doc["nodes"] if n["target"] == "torch.conv2d")
    assert next(iter(conv["meta"]["nn_module_stack"].values()))[1] == "torch.nn.modules.conv.Conv2d"
    assert "line" in conv["meta"]["stack_trace"]
    node = next(n for n in loaded.graph.nodes if n.name == conv["name"])
    assert node.meta["nn_module_stack"] == {
        k: tuple(v) for k, v in conv["meta"]["nn_module_stack"].items()
    }


def test_round_trip_with_kwargs_and_dynamic(tmp_path):
    torch.manual_seed(0)
    m = KwModel()
    x, mask = torch.randn(4, 3), torch.rand(4, 3)
    b = ec.Dim("b", max=32)
    ep = ec.export(m, (x,), {"mask": mask}, dynamic_shapes={"x": (b, None), "mask": (b, None)})
    ep.save(str(tmp_path))
    loaded = ec.load(str(tmp_path)).module()
    x2, mask2 = torch.randn(7, 3), torch.rand(7, 3)
    assert _same(loaded(x2, mask=mask2), m(x2, mask=mask2))
    with pytest.raises(CheckError, match="above its max 32"):
        loaded(torch.randn(33, 3), mask=torch.rand(33, 3))


def _tamper(tmp_path, edit) -> None:
    path = tmp_path / "program.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("os.system", "unknown target 'os.system'"),
        ("torch.load", "unknown target 'torch.load'"),
        ("builtins.eval", "unknown target 'builtins.eval'"),
    ],
)
def test_unknown_target_refused_on_load(tmp_path, target, message):
    ep = ec.export(MLP(), (torch.randn(2, 4),))
    ep.save(str(tmp_path))

    def edit(doc):
        next(n for n in doc["nodes"] if n["op"] == "call_function")["target"] = target

    _tamper(tmp_path, edit)
    with pytest.raises(ec.ExportFormatError, match=message):
        ec.load(str(tmp_path))


def test_getattr_of_private_attribute_refused(tmp_path):
    ep = ec.export(MLP(), (torch.randn(2, 4),))
    ep.save(str(tmp_path))

    def edit(doc):
        node = next(n for n in doc["nodes"] if n["op"] == "call_function")
        node["target"], node["args"] = "builtins.getattr", [{"node": "x"}, "__class__"]

    _tamper(tmp_path, edit)
    with pytest.raises(ec.ExportFormatError, match="only public attributes"):
        ec.load(str(tmp_path))


def test_tampered_file_refused(tmp_path):
    ep = ec.export(MLP(), (torch.randn(2, 4),))
    ep.save(str(tmp_path))
    _tamper(tmp_path, lambda doc: doc["nodes"][-1]["args"].append({"node": "nowhere"}))
    with pytest.raises(ec.ExportFormatError, match="not an earlier node"):
        ec.load(str(tmp_path))
    _tamper(tmp_path, lambda doc: doc.update(version=99))
    with pytest.raises(ec.ExportFormatError, match="not an ember export"):
        ec.load(str(tmp_path))


def breaks_twice(x):
    y = x * 2
    print("one")  # a graph break
    y = y + 1
    print("two")  # another
    return y


LINE_ONE = breaks_twice.__code__.co_firstlineno + 2


def test_graph_breaks_listed_with_file_and_line(capsys):
    with pytest.raises(ec.ExportError) as info:
        ec.export(breaks_twice, (torch.ones(2),))
    text = str(info.value)
    assert "2 graph break(s)" in text
    assert f"{__file__}:{LINE_ONE}:" in text and f"{__file__}:{LINE_ONE + 2}:" in text
    assert "hint:" in text


def test_failed_export_leaves_module_state():
    class Breaks(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(3)

        def forward(self, x):
            y = self.bn(x)
            print("break")
            return y

    m = Breaks().train()
    with pytest.raises(ec.ExportError, match="1 graph break"):
        ec.export(m, (torch.randn(4, 3),))
    assert int(m.bn.num_batches_tracked) == 0 and torch.equal(m.bn.running_mean, torch.zeros(3))

    def bump(x):
        x.add_(1)
        print("break")
        return x

    x = torch.zeros(2)
    with pytest.raises(ec.ExportError, match="1 graph break"):
        ec.export(bump, (x,))
    assert torch.equal(x, torch.zeros(2))


class RunningCount(torch.nn.Module):
    """Buffers kept by assignment, as eager modules often do."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(1))
        self.register_buffer("ema", torch.zeros(3))

    def forward(self, x):
        self.count = self.count + 1
        self.ema = 0.5 * self.ema + 0.5 * x.mean(0)
        self.ema = self.ema * 2  # rebound twice: the last value is the new buffer
        return x * self.count + self.ema


def test_rebound_buffers_are_buffer_mutations():
    m, eager = RunningCount(), RunningCount()
    ep = ec.export(m, (torch.ones(2, 3),))
    mutated = [s.target for s in ep.signature.outputs if s.kind is OutputKind.BUFFER_MUTATION]
    assert sorted(mutated) == ["count", "ema"]
    mod = ep.module()
    for _ in range(3):
        x = torch.randn(2, 3)
        torch.testing.assert_close(mod(x), eager(x))
    for name, buf in eager.named_buffers():
        torch.testing.assert_close(mod.get_buffer(name), buf)


def test_rebinding_a_buffer_to_another_shape_is_an_error():
    class Grows(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("seen", torch.zeros(1))

        def forward(self, x):
            self.seen = torch.cat([self.seen, x])
            return x + 1

    with pytest.raises(ec.ExportError, match="rebinds buffer 'seen'"):
        ec.export(Grows(), (torch.ones(2),))


def test_side_effect_refused_unless_not_strict():
    class Counter(torch.nn.Module):
        def forward(self, x):
            self.calls = 1
            return x + 1

    with pytest.raises(ec.ExportError, match="side effects"):
        ec.export(Counter(), (torch.ones(2),))
    with pytest.warns(UserWarning, match="dropped side effects"):
        ep = ec.export(Counter(), (torch.ones(2),), strict=False)
    assert torch.equal(ep.module()(torch.ones(2)), torch.full((2,), 2.0))


def test_bad_dynamic_shapes_are_errors():
    with pytest.raises(ec.ExportError, match="names no argument"):
        ec.export(MLP(), (torch.randn(5, 4),), dynamic_shapes={"y": {0: ec.Dim("b")}})
    with pytest.raises(ec.ExportError, match="not a dim spec"):
        ec.export(MLP(), (torch.randn(5, 4),), dynamic_shapes={"x": {3: ec.Dim("b")}})
    with pytest.raises(ValueError, match="above max"):
        ec.Dim("b", min=5, max=2)


def test_export_needs_only_capture_and_guards():
    script = (
        "import sys, torch, ember.capture as ec\n"
        "ep = ec.export(torch.nn.Linear(2, 2), (torch.ones(1, 2),))\n"
        "ep.module()(torch.ones(1, 2))\n"
        "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('ember.')}))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['capture', 'guards']"


class Scaler:
    def __init__(self) -> None:
        self.w = torch.tensor([2.0, 3.0])

    def apply(self, x, *rest, shift=0.0):
        return x * self.w + sum(rest) + shift


def test_bound_method_varargs_and_tied_weights():
    s = Scaler()
    ep = ec.export(s.apply, (torch.ones(2), torch.ones(2)), {"shift": 1.0})
    y = torch.randn(2)
    assert torch.allclose(ep.module()(y, y, shift=1.0), s.apply(y, y, shift=1.0))

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(2, 2, bias=False)
            self.b = self.a

        def forward(self, x):
            return self.b(self.a(x))

    t = Tied()
    ep = ec.export(t.forward, (torch.ones(1, 2),))
    assert [s.target for s in ep.signature.inputs if s.kind is InputKind.PARAMETER] == ["a.weight"]
    x = torch.randn(3, 2)
    with pytest.raises(CheckError, match="size\\(0\\): expected 1, got 3"):
        ep.module()(x)
    assert torch.allclose(ep.module()(x[:1]), t(x[:1]))


def test_one_tensor_passed_twice_must_stay_one():
    def f(a, b):
        return a * 2 + b

    x = torch.ones(2)
    ep = ec.export(f, (x, x))
    assert torch.equal(ep.module()(x, x), f(x, x))
    with pytest.raises(CheckError, match="must be the same tensor"):
        ep.module()(torch.ones(2), torch.zeros(2))


def test_inputs_returned_as_they_are():
    def f(x, rest, flag):
        return x + 1, rest[1], flag, None

    x, a, b = torch.ones(2), torch.zeros(1), torch.full((3,), 5.0)
    ep = ec.export(f, (x, [a, b], "on"))
    a2, b2 = torch.ones(1), torch.ones(3)
    got = ep.module()(x, [a2, b2], "on")
    assert got[1] is b2 and got[2:] == ("on", None) and torch.equal(got[0], x + 1)
    with pytest.raises(CheckError, match="args\\[2\\]: the program was exported for 'on'"):
        ep.module()(x, [a2, b2], "off")


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_exports_equal_to_eager_and_round_trips(name, tmp_path):
    model, args = ZOO[name].make()
    eager = copy.deepcopy(model)
    ep = ec.export(model, args)
    mod = ep.module()
    for seed in (1, 2):
        torch.manual_seed(seed)
        got = mod(*args)
        torch.manual_seed(seed)
        assert _same(got, eager(*args))
    state = mod.state_dict()
    for key, value in eager.state_dict().items():  # BatchNorm statistics included
        if key in state:
            torch.testing.assert_close(state[key], value, msg=key)
    ep.save(str(tmp_path))
    torch.manual_seed(3)
    got = ec.load(str(tmp_path)).module()(*args)
    torch.manual_seed(3)
    assert _same(got, eager(*args))


def test_specialised_dynamic_dim_is_an_error():
    def f(x):
        return x.reshape(2, 8)

    with pytest.raises(ec.ExportError, match="specialised it to 16"):
        ec.export(f, (torch.ones(16),), dynamic_shapes=({0: ec.Dim("n")},))


def test_float_the_code_branches_on_is_pinned():
    def g(x, scale):
        if scale > 1.0:
            return x * scale
        return x - scale

    ep = ec.export(g, (torch.ones(2), 2.0))
    assert torch.equal(ep.module()(torch.ones(2), 2.0), g(torch.ones(2), 2.0))
    with pytest.raises(CheckError, match=r"args\[1\]: the program was exported for 2\.0"):
        ep.module()(torch.ones(2), 0.5)


def test_unrebuildable_output_is_an_error():
    Pair = collections.namedtuple("Pair", "a b")

    def f(x):
        return Pair(x + 1, x - 1)

    with pytest.raises(ec.ExportError, match="returns a value export cannot rebuild"):
        ec.export(f, (torch.ones(2),))
