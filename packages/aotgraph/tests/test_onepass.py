"""trace_inference (ember.aotgraph.onepass): one make_fx run gives the signature and the
graph that analyze then trace_forward give, with static and with symbolic sizes; where it
cannot, it says so (None) and aot_compile takes the two-run path."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._subclasses import FakeTensorMode
from torch._subclasses.meta_utils import MetaConverter
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from ember.aotgraph import aot_compile, inputfakes
from ember.aotgraph.onepass import trace_inference
from ember.aotgraph.trace import Lifted, analyze, trace_forward, trace_joint

CASES = {
    "alias-and-constant": lambda x, y: (x.t(), x * y, 3, None),
    "view-of-output": lambda x, y: ((x + y).view(-1), x + y),
    "same-twice": lambda x, y: (x.sin(),) * 2,
    "size-output": lambda x, y: (x.sum(0), x.shape[0] * 2),
    "input-returned": lambda x, y: (x, y.cos()),
    "reshape-softmax": lambda x, y: ((x @ y.t()).reshape(-1).softmax(0), y.unsqueeze(0)),
    "nested-dict": lambda x, y: {"a": [x.exp()], "b": (y - 1, x.mean())},
}


def _inputs(symbolic: bool) -> list[Any]:
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    if not symbolic:
        return [x, y]
    mode = FakeTensorMode(shape_env=ShapeEnv())
    dims = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    fakes = [mode.from_tensor(t, symbolic_context=dims) for t in (x, y)]
    with mode:  # what capture learnt running the graph: the two sizes are one
        fakes[0] + fakes[1]
    return fakes


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("name", list(CASES))
def test_one_run_gives_what_two_runs_give(name, symbolic):
    gm = torch.fx.symbolic_trace(CASES[name])
    inputs = _inputs(symbolic)  # each path its own ShapeEnv: the first run adds guards
    lifted = Lifted.of(gm, inputs)
    sig = analyze(lifted, inputs, grad=False)
    two = trace_forward(lifted, inputs, sig, {})
    inputs = _inputs(symbolic)
    once = trace_inference(Lifted.of(gm, inputs), inputs, {})
    assert once is not None
    assert once[0] == sig
    assert once[1].gm.code == two.gm.code
    assert (once[1].mutated, once[1].num_outputs) == (two.mutated, two.num_outputs)


@pytest.mark.parametrize(
    "fn",
    [lambda x, y: (x.add_(1), y * 2)[1], lambda x, y: (x.t_(), x + y)[1]],
    ids=["written", "restrided"],
)
def test_inputs_changed_in_place_take_the_two_run_path(fn):
    gm = torch.fx.symbolic_trace(fn)
    inputs = [torch.randn(3, 3), torch.randn(3, 3)]
    assert trace_inference(Lifted.of(gm, inputs), inputs, {}) is None
    f = aot_compile(gm, inputs, fw_compiler=lambda g, _: g)
    for _ in range(2):
        a, b = torch.randn(3, 3), torch.randn(3, 3)
        a2, b2 = a.clone(), b.clone()
        torch.testing.assert_close(f(a, b), fn(a2, b2))
        torch.testing.assert_close(a, a2)


def test_an_error_is_raised_by_the_two_run_path():
    def fn(x, y):
        return x.requires_grad_(False) * y

    gm = torch.fx.symbolic_trace(fn)
    inputs = [torch.randn(2, requires_grad=True), torch.randn(2)]
    assert trace_inference(Lifted.of(gm, inputs), inputs, {}) is None
    with pytest.raises(Exception, match="requires_grad_"):
        analyze(Lifted.of(gm, inputs), inputs, grad=False)


def test_aot_compile_of_an_inference_graph_traces_once(traces):
    gm = torch.fx.symbolic_trace(CASES["alias-and-constant"])
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    with torch.no_grad():
        f = aot_compile(gm, [x, y], fw_compiler=lambda g, _: g)
        got = f(x, y)
    assert traces == ["trace_inference"]
    want = CASES["alias-and-constant"](x, y)
    torch.testing.assert_close(got[:2], want[:2])
    assert got[2:] == want[2:] and got[0]._base is x  # eager's alias, a view of x


@pytest.fixture
def fakes_made(monkeypatch) -> list[Any]:
    """The tensors each fake mode makes a new fake of: its converter's memo misses, and the
    plain inputs made directly (``inputfakes``)."""
    made: list[Any] = []
    plain, plain_input = MetaConverter.__call__, inputfakes.is_plain_input

    def counting(self: Any, t: Any, *args: Any, **kwargs: Any) -> Any:
        made.append(t)
        return plain(self, t, *args, **kwargs)

    def direct(t: Any) -> bool:
        if plain_input(t):
            made.append(t)
            return True
        return False

    monkeypatch.setattr(MetaConverter, "__call__", counting)
    monkeypatch.setattr(inputfakes, "is_plain_input", direct)
    return made


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "joint"])
def test_each_tensor_input_is_made_a_fake_once(grad, fakes_made):
    linear = torch.nn.Linear(3, 4)
    gm = torch.fx.symbolic_trace(lambda x, w, b: torch.nn.functional.linear(x, w, b).relu())
    inputs = [torch.randn(2, 3), linear.weight, linear.bias]
    lifted = Lifted.of(gm, inputs)
    if grad:  # analyze's run on fakes of its own, then the trace's
        sig = analyze(lifted, inputs, grad=True)
        del fakes_made[:]
        joint = trace_joint(lifted, inputs, sig, {})
        got = joint.gm(*inputs, torch.ones(2, 4))
    else:
        once = trace_inference(lifted, inputs, {})
        assert once is not None
        got = once[1].gm(*inputs)
    assert [t is i for t, i in zip(fakes_made, inputs, strict=True)] == [True] * 3
    want = gm(*inputs).detach()
    torch.testing.assert_close(got[0], want)
