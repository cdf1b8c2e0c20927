"""A traced graph's Python code is generated once, after the trace's last passes
(ember.aotgraph.nodemeta.code_later / generate_code), and the graph module handed on is a
plain torch.fx.GraphModule that runs as eager does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx._lazy_graph_module import _LazyGraphModule

from ember.aotgraph.onepass import trace_inference
from ember.aotgraph.trace import Lifted, analyze, trace_forward, trace_joint


def f(x, y):
    return ((x @ y.t()).softmax(-1) * 2).sum(0), y.cos()


def _counting(monkeypatch) -> list[int]:
    """Count torch.fx's code generations from now on."""
    made = [0]
    plain = torch.fx.Graph.python_code

    def python_code(self, *args: Any, **kwargs: Any) -> Any:
        made[0] += 1
        return plain(self, *args, **kwargs)

    monkeypatch.setattr(torch.fx.Graph, "python_code", python_code)
    return made


def _inference(lifted: Lifted, inputs: list[torch.Tensor]) -> torch.fx.GraphModule:
    traced = trace_inference(lifted, inputs, {})
    assert traced is not None
    return traced[1].gm


def _forward(lifted: Lifted, inputs: list[torch.Tensor]) -> torch.fx.GraphModule:
    return trace_forward(lifted, inputs, analyze(lifted, inputs, grad=False), {}).gm


def _joint(lifted: Lifted, inputs: list[torch.Tensor]) -> torch.fx.GraphModule:
    inputs = [t.requires_grad_() for t in inputs]
    return trace_joint(lifted, inputs, analyze(lifted, inputs, grad=True), {}).gm


TRACES: dict[str, Callable[[Lifted, list[torch.Tensor]], torch.fx.GraphModule]] = {
    "inference": _inference,
    "forward": _forward,
    "joint": _joint,
}


@pytest.mark.parametrize("trace", list(TRACES))
def test_code_generated_once_and_module_plain(trace, monkeypatch):
    gm = torch.fx.symbolic_trace(f)
    x, y = torch.randn(3, 4), torch.randn(5, 4)
    lifted = Lifted.of(gm, [x, y])
    made = _counting(monkeypatch)
    traced = TRACES[trace](lifted, [x, y])
    assert made[0] == 1  # make_fx's own generation skipped: _finish's is the one
    assert not isinstance(traced, _LazyGraphModule)
    assert type(traced).__mro__[1] is torch.fx.GraphModule
    if trace == "inference":
        out = traced(x, y)
        for got, want in zip(out, f(x, y), strict=True):
            torch.testing.assert_close(got, want)
