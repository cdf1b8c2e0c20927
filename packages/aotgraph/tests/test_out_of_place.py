"""``out_of_place``: in-place ops on fresh intermediates become their out-of-place twins, so
the functionalizing second trace is skipped; anything observable is left alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

import ember.aotgraph.trace as trace
from ember.aotgraph import aot_compile
from ember.aotgraph.trace import out_of_place


def _mutations(gm: torch.fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if trace._mutates(n)]


def _fresh_accumulated(x: torch.Tensor, y: torch.Tensor) -> Any:
    a = x @ y
    b = a.clone()
    a.add_(x)  # a is the matmul's own result: nothing else sees it
    return a.relu() + b  # b was taken before the add


def _input_mutated(x: torch.Tensor, y: torch.Tensor) -> Any:
    x.add_(y)  # the caller sees this write
    return x * 2


def _viewed_first(x: torch.Tensor, y: torch.Tensor) -> Any:
    a = x @ y
    v = a[0]  # a view: it sees the add below
    a.add_(1)
    return v * 2


def _wider_operand(x: torch.Tensor, y: torch.Tensor) -> Any:
    a = x * 2
    a.add_(y.double())  # float32 += float64 stays float32; the twin would give float64
    return a


@pytest.mark.parametrize(
    ("fn", "left"),
    [
        (_fresh_accumulated, []),
        (_input_mutated, ["aten.add_.Tensor"]),
        (_viewed_first, ["aten.add_.Tensor"]),
        (_wider_operand, ["aten.add_.Tensor"]),
    ],
    ids=["fresh", "input", "viewed", "wider"],
)
def test_rewrites_only_what_nobody_can_observe(fn: Callable[..., Any], left: list[str]) -> None:
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    gm = make_fx(fn, tracing_mode="fake")(x, y)
    out_of_place(gm)
    assert _mutations(gm) == left
    want_x, got_x = x.clone(), x.clone()
    torch.testing.assert_close(gm(got_x, y), fn(want_x, y))
    torch.testing.assert_close(got_x, want_x)


class _Cell(nn.Module):
    """An RNN cell run three times: the cell adds its two matmuls in place."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.RNNCell(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(4, 8)
        for t in range(3):
            h = self.cell(x[t], h)
        return h


def test_a_training_graph_is_traced_once_and_matches_eager(monkeypatch) -> None:
    traced = []
    monkeypatch.setattr(
        torch.func, "functionalize", lambda *a, **k: traced.append(1) or _functionalize(*a, **k)
    )
    model, x = _Cell(), torch.randn(3, 4, 8)
    gm = torch.fx.symbolic_trace(model)
    f = aot_compile(gm, [x], fw_compiler=lambda g, e: g, cache=False)
    f(x).sum().backward()
    grads = [p.grad for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()
    for got, want in zip(grads, [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(got, want)
    assert traced == [] and not _mutations(f.joint.gm)
    # without the pass the cell's in-place add needs functionalizing
    monkeypatch.setattr(trace, "out_of_place", lambda gm: None)
    aot_compile(gm, [x], fw_compiler=lambda g, e: g, cache=False)(x).sum().backward()
    assert traced == [1]


_functionalize = torch.func.functionalize
