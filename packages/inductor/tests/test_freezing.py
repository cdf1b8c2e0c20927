"""Inference freezing: module state folded into constants, never stale, never in training."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from models import ConvBN  # benchmarks/models: on the path for every package's tests
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph, freezing, settings

aten = torch.ops.aten


def eager(gm: torch.fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
    """An inner compiler that runs the frozen graph as it is (no C++ build: fast tests)."""
    return gm


def frozen_param(*shape: int) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.randn(*shape), requires_grad=False)


def ops(gm: torch.fx.GraphModule) -> list[Any]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def linear_graph(weight: torch.Tensor) -> tuple[torch.fx.GraphModule, list[Any]]:
    x, b = torch.randn(4, 16), torch.randn(8)
    return make_fx(lambda x, w, b: torch.addmm(b, x, w.t()))(x, weight, b), [x, weight, b]


def test_a_weight_transpose_is_folded_and_its_output_checked() -> None:
    gm, inputs = linear_graph(frozen_param(8, 16))
    f = freezing.freeze(gm, inputs, eager)
    assert isinstance(f, freezing.FrozenGraph)
    assert f.plan.frozen == (1, 2) and f.plan.live == (0,)
    assert aten.t.default not in ops(f.plan.graph)
    torch.testing.assert_close(f(*inputs), gm(*inputs))


def test_another_tensor_refreezes_and_a_new_layout_falls_back() -> None:
    w, x = frozen_param(8, 16), torch.randn(8, 16)
    gm = make_fx(lambda x, w: x + w * 2)(x, w)
    f = freezing.freeze(gm, [x, w], eager)
    other = frozen_param(8, 16)
    torch.testing.assert_close(f(x, other), gm(x, other))
    assert f.refreezes == 1 and f.reasons == ["input 1: another tensor than the one frozen"]
    strided = torch.nn.Parameter(torch.randn(16, 8).t(), requires_grad=False)  # w * 2 too
    torch.testing.assert_close(f(x, strided), gm(x, strided))
    assert f.fallback is not None and "layouts differ" in f.fallback
    torch.testing.assert_close(f(x, w), gm(x, w))  # from now on the graph as aten ops


def test_data_assigned_refreezes() -> None:
    w = frozen_param(8, 16)
    gm, (x, _, b) = linear_graph(w)
    f = freezing.freeze(gm, [x, w, b], eager)
    w.data = torch.randn(8, 16)  # moves no version counter; the address changes
    torch.testing.assert_close(f(x, w, b), gm(x, w, b))
    assert f.reasons == ["input 1: its data was replaced (.data assigned)"]


def test_a_data_input_frozen_by_mistake_is_still_right() -> None:
    """A 1-d input reads as a buffer; a new one each call re-freezes, never a stale answer."""
    gm = make_fx(lambda v, w: (v * 2).exp() + w.t().sum(1))(torch.randn(8), frozen_param(4, 8))
    w = frozen_param(4, 8)
    f = freezing.freeze(gm, [torch.randn(8), w], eager)
    for _ in range(3):
        v = torch.randn(8)
        torch.testing.assert_close(f(v, w), gm(v, w))
    assert f.refreezes == 3 and len(f.reasons) == 3


def test_a_broadcast_constant_is_not_materialised() -> None:
    """``p.expand(batch, n)`` stays in the per-call graph: only the small constant is kept."""
    p = frozen_param(32)
    gm = make_fx(lambda x, p: x + (p * 2).expand(64, 32))(torch.randn(64, 32), p)
    f = freezing.freeze(gm, [torch.randn(64, 32), p], eager)
    assert isinstance(f, freezing.FrozenGraph)
    consts = f.plan.fold(p)
    assert max(c.numel() for c in consts) == 32
    x = torch.randn(64, 32)
    torch.testing.assert_close(f(x, p), gm(x, p))


def test_a_constant_output_is_a_copy() -> None:
    p = frozen_param(4)
    gm = make_fx(lambda x, p: (x + 1, p * 2))(torch.randn(3, 4), p)
    x = torch.randn(3, 4)
    f = freezing.freeze(gm, [x, p], eager)
    assert isinstance(f, freezing.FrozenGraph) and f.plan.live == (0,)
    out = f(x, p)[1]
    out.fill_(0)  # the caller owns its outputs
    torch.testing.assert_close(f(x, p)[1], p * 2)
    assert f.refreezes == 0


def test_nothing_to_fold_compiles_the_graph_as_it_is() -> None:
    w = frozen_param(8, 16)
    gm = make_fx(lambda x, w: x @ w)(torch.randn(4, 8), w)
    assert freezing.freeze(gm, [torch.randn(4, 8), w], eager) is gm


@pytest.mark.parametrize("bias", [True, False])
def test_conv_affine_fold_matches_eager(bias: bool) -> None:
    torch.manual_seed(0)
    m = ConvBN(bias=bias).eval()
    params = [p.detach().requires_grad_(False) for p in (m.conv.weight, m.bn.weight, m.bn.bias)]
    cbias = m.conv.bias.detach() if bias else None
    stats = [m.bn.running_mean, m.bn.running_var]
    x = torch.randn(2, 3, 8, 8)

    def f(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, b: torch.Tensor, mu: torch.Tensor,
          var: torch.Tensor) -> torch.Tensor:  # fmt: skip
        y = torch.nn.functional.conv2d(x, w, cbias)
        return torch.nn.functional.batch_norm(y, mu, var, g, b, False, 0.1, 1e-5).relu()

    inputs = [x, torch.nn.Parameter(params[0], requires_grad=False), *params[1:], *stats]
    gm = make_fx(f, decomposition_table=_decompositions())(*inputs)
    frozen = freezing.freeze(gm, inputs, eager)
    assert isinstance(frozen, freezing.FrozenGraph) and frozen.plan.conv_affine == 1
    torch.testing.assert_close(frozen(*inputs), f(*inputs), rtol=1e-5, atol=1e-5)


def _decompositions() -> Any:
    from ember.inductor import decompositions

    return decompositions()


def test_compile_graph_reads_the_option() -> None:
    gm, inputs = linear_graph(frozen_param(8, 16))
    compiled = compile_graph(gm, inputs, {"freezing": True})
    assert isinstance(compiled, freezing.FrozenGraph)
    torch.testing.assert_close(compiled(*inputs), gm(*inputs))
    assert settings.section.get().freezing is False  # off unless asked for


def test_inference_tensors_are_not_frozen() -> None:
    """Tensors made under inference_mode have no version counter: they stay inputs."""
    with torch.inference_mode():
        w = torch.randn(8, 16)
        b = torch.randn(8)
    gm, (x, _, _) = linear_graph(frozen_param(8, 16))
    assert freezing.frozen_inputs(gm, [x, w, b]) == ()
    assert freezing.freeze(gm, [x, w, b], eager) is gm
