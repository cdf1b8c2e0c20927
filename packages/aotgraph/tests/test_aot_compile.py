"""aot_compile against eager on a corpus of small graphs (built with symbolic_trace only).

Each case runs eagerly and compiled from identical inputs; outputs (values,
requires_grad, aliasing), input and parameter gradients and mutated inputs
must match.
"""

from __future__ import annotations

import copy
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch import nn

from ember.aotgraph import aot_compile


def as_is(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    return gm


def randn(*shape: int, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape).requires_grad_(grad)


@dataclass(frozen=True)
class Case:
    fn: Callable[..., Any]
    inputs: Callable[[], list[Any]]


def _inplace_input(x, buf):
    buf.add_(1)
    return x * buf


def _inplace_intermediate(x):
    y = x * 2
    y.relu_()
    return y


def _inplace_view_of_input(x, buf):
    buf[0].mul_(3)
    return x + buf.sum()


def _mutate_after_use(x, buf):
    y = x * buf.sum()  # min-cut saves buf itself and recomputes the sum in backward
    buf.add_(1)
    return y


def _same_output_twice(x):
    y = x * 2
    return y, y, y.view(-1)


def needs_grad(*shapes: tuple[int, ...]) -> Callable[[], list[Any]]:
    return lambda: [randn(*shape, grad=True) for shape in shapes]


def bn_net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).train()


def conv_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU()).train()


CASES: dict[str, Case] = {
    "pointwise": Case(lambda x, y: (x.sin() * y).exp(), needs_grad((4, 5), (4, 5))),
    "matmul-gelu": Case(
        lambda x, w: F.gelu(x @ w).sum(1), lambda: [randn(4, 3), randn(3, 6, grad=True)]
    ),
    "single-tensor": Case(lambda x: x * 2, needs_grad((3,))),
    "list-output": Case(lambda x: [x * 2, x + 1], needs_grad((3,))),
    "view-outputs": Case(lambda x: (x.t(), x.view(-1)[1:], x * 2), needs_grad((2, 3))),
    "returns-input": Case(lambda x, y: (x, y * 2), needs_grad((3,), (3,))),
    "unused-input": Case(lambda x, y: x.cos(), needs_grad((3,), (3,))),
    "integer-outputs": Case(lambda x: (x * 2, x.argmax(), x > 0), needs_grad((5,))),
    "detached-output": Case(lambda x: (x * 2, x.detach() * 3), needs_grad((3,))),
    "constant-output": Case(lambda x: (x * 2, None), needs_grad((3,))),
    "inplace-on-input": Case(_inplace_input, lambda: [randn(3, grad=True), torch.zeros(3)]),
    "inplace-on-view-of-input": Case(
        _inplace_view_of_input, lambda: [randn(3, grad=True), torch.ones(2, 3)]
    ),
    "inplace-after-use": Case(_mutate_after_use, lambda: [randn(3, grad=True), torch.ones(3)]),
    "same-output-twice": Case(_same_output_twice, needs_grad((2, 3))),
    "inplace-on-intermediate": Case(_inplace_intermediate, needs_grad((4,))),
    "int-input": Case(lambda x, n: x * n, lambda: [randn(3, grad=True), 3]),
    "no-grad-inputs": Case(lambda x: x.sin(), lambda: [randn(3)]),
    "linear-get-attr": Case(nn.Linear(3, 4), lambda: [randn(2, 3)]),
    "batchnorm-submodule": Case(bn_net(), lambda: [randn(8, 4)]),
    "conv-bn-relu": Case(conv_net(), lambda: [randn(2, 2, 6, 6)]),
}


def run(fn: Callable[..., Any], args: list[Any], seed: int = 0) -> Any:
    torch.manual_seed(seed)
    return fn(*args)


def clone(args: list[Any]) -> list[Any]:
    return [
        a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
        for a in args
    ]


def backward(out: Any) -> None:
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    if leaves:
        sum(t.float().sum() * (i + 1) for i, t in enumerate(leaves)).backward()  # type: ignore[union-attr]


def aliases(t: torch.Tensor, args: list[Any]) -> list[bool]:
    ptr = t.untyped_storage().data_ptr()
    return [isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == ptr for a in args]


def assert_outputs_equal(got: Any, want: Any, args: list[Any], eager_args: list[Any]) -> None:
    got_leaves, got_spec = pytree.tree_flatten(got)
    want_leaves, want_spec = pytree.tree_flatten(want)
    assert got_spec == want_spec
    for g, w in zip(got_leaves, want_leaves, strict=True):
        if not isinstance(w, torch.Tensor):
            assert g == w
            continue
        torch.testing.assert_close(g, w)
        assert g.requires_grad == w.requires_grad
        # an output that aliases an input in eager aliases the same input here
        assert aliases(g, args) == aliases(w, eager_args)


def module_state(fn: Any) -> dict[str, torch.Tensor]:
    return dict(fn.state_dict()) if isinstance(fn, nn.Module) else {}


@pytest.mark.parametrize("partition", ["min_cut", "default"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager(name, partition):
    case = CASES[name]
    fn, eager_fn = case.fn, case.fn
    if isinstance(case.fn, nn.Module):
        fn, eager_fn = copy.deepcopy(case.fn), copy.deepcopy(case.fn)
    torch.manual_seed(0)
    args = case.inputs()
    eager_args = clone(args)
    gm = torch.fx.symbolic_trace(fn)
    compiled = aot_compile(gm, clone(args), fw_compiler=as_is, partition=partition)
    got, want = run(compiled, args), run(eager_fn, eager_args)
    assert_outputs_equal(got, want, args, eager_args)
    backward(got)
    backward(want)
    for a, b in zip(args, eager_args, strict=True):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b)  # mutated inputs were written back
            torch.testing.assert_close(a.grad, b.grad)
    if isinstance(fn, nn.Module):
        for (key, p), (_, q) in zip(
            fn.named_parameters(), eager_fn.named_parameters(), strict=True
        ):
            torch.testing.assert_close(p.grad, q.grad, msg=key)
        for key, value in module_state(eager_fn).items():
            torch.testing.assert_close(module_state(fn)[key], value, msg=key)


def test_number_inputs_take_each_calls_value():
    # ember's capture passes floats (e.g. from .item()) as graph inputs that change per call
    x = randn(3, grad=True)
    f = aot_compile(torch.fx.symbolic_trace(lambda x, k: x * k), [x, 2.0], fw_compiler=as_is)
    for k in (2.0, 3.0, -1.5, 2.0):
        y = f(x, k)
        torch.testing.assert_close(y, x * k)
        (g,) = torch.autograd.grad(y.sum(), x)
        torch.testing.assert_close(g, torch.full((3,), k))


def _needs_the_value(x, k):
    return x * math.exp(k)  # no symbolic rule for math.exp: tracing fixes k's value


def test_float_inputs_are_graph_inputs_unless_tracing_needs_their_value():
    x = randn(3, grad=True)
    f = aot_compile(torch.fx.symbolic_trace(lambda x, k: x * k), [x, 2.0], fw_compiler=as_is)
    assert f.partition is not None and f.fallback is None
    assert f.variants == {}  # one graph for every value of k
    g = aot_compile(torch.fx.symbolic_trace(_needs_the_value), [x, 0.5], fw_compiler=as_is)
    assert g.lifted.constant_positions == (1,)  # k compiled in: recompiled per value
    for k in (0.5, 1.5):
        torch.testing.assert_close(g(x, k), x * math.exp(k))


def _max_and_sqrt(x, a, b):
    return x * math.sqrt(max(a, b))


def test_max_and_sqrt_of_float_inputs_stay_symbolic():
    x = randn(3, grad=True)
    gm = torch.fx.symbolic_trace(lambda x, a, b: x * a + b)  # structure only
    graph = torch.fx.Graph()
    px, pa, pb = (graph.placeholder(n) for n in "xab")
    biggest = graph.call_function(max, (pa, pb))
    graph.output(
        graph.call_function(operator.mul, (px, graph.call_function(math.sqrt, (biggest,))))
    )
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    f = aot_compile(gm, [x, 4.0, 1.0], fw_compiler=as_is)
    assert f.lifted.constant_positions == () and f.fallback is None
    for a, b in ((4.0, 1.0), (1.0, 9.0)):
        y = f(x, a, b)
        torch.testing.assert_close(y, _max_and_sqrt(x, a, b))
        (g,) = torch.autograd.grad(y.sum(), x)
        torch.testing.assert_close(g, torch.full((3,), math.sqrt(max(a, b))))


def test_specialized_floats_compile_one_variant_per_value():
    x = randn(3)
    g = aot_compile(torch.fx.symbolic_trace(_needs_the_value), [x, 0.5], fw_compiler=as_is)
    for k in (0.5, 1.5, 1.5, 0.5):
        torch.testing.assert_close(g(x, k), x * math.exp(k))
    assert list(g.variants) == [(1.5,)]
    assert all(v.fallback is None for v in g.variants.values())  # no symbolic retry per value
