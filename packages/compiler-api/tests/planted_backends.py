"""Backends with planted bugs, for the minifier and replay tests (test_repro.py, test_replay.py).

They live in a module of their own so that a repro script can import them by name.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from ember.aotgraph import aot_compile

RELU = {torch.relu, torch.nn.functional.relu, torch.ops.aten.relu.default}
GELU = {torch._C._nn.gelu, torch.nn.functional.gelu, torch.ops.aten.gelu.default}


class PlantedReluError(RuntimeError):
    """What relu_bug raises."""


def relu_bug(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Raises on any graph with a relu in it; otherwise runs the graph as it is."""
    if any(n.target in RELU for n in gm.graph.nodes):
        raise PlantedReluError("planted bug: this backend cannot compile relu")
    return gm.forward


def wrong_gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate=approximate) * 1.001


def gelu_bug(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Runs the graph with every gelu slightly wrong (0.1% too large)."""
    graph = copy.deepcopy(gm.graph)
    for n in graph.nodes:
        if n.target in GELU:
            n.target = wrong_gelu
    return torch.fx.GraphModule(gm, graph).forward


def aot_relu_bug(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """aotgraph with relu_bug as its inner compiler (the bug shows after AOT)."""
    return aot_compile(gm, example_inputs, fw_compiler=relu_bug, decompositions={})


def aot_gelu_bug(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """aotgraph with gelu_bug as its inner compiler (the bug shows after AOT)."""
    return aot_compile(gm, example_inputs, fw_compiler=gelu_bug, decompositions={})


class MLP(torch.nn.Module):
    """A small real program: relu and gelu among linear layers, sums, tanh and a softmax, so
    the minifier has work to do."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 16)
        self.c = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x)) * 0.5 + x.sum(-1, keepdim=True)
        h = torch.nn.functional.gelu(self.b(h))
        return (torch.tanh(self.c(h)) + 1).softmax(-1)


SCALE = 3.0  # a global the replayed function reads


def scaled_relu_block(x: torch.Tensor) -> torch.Tensor:
    """A function that reads a global and calls a helper: its replay record must carry both."""
    return _helper(torch.relu(x * SCALE)).sum()


def _helper(t: torch.Tensor) -> torch.Tensor:
    return t.cos() + 1


def late_relu_bug(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Compiles anything; a graph with a relu raises when it runs (a bug at run time)."""
    if not any(n.target in RELU for n in gm.graph.nodes):
        return gm.forward

    def run(*args: Any) -> Any:
        raise PlantedReluError("planted bug: relu fails at run time")

    return run


def big_value_bug(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A graph with a relu fails when run on values above 100 (a bug that depends on the
    values, so random inputs do not show it)."""
    if not any(n.target in RELU for n in gm.graph.nodes):
        return gm.forward

    def run(*args: Any) -> Any:
        if any(isinstance(a, torch.Tensor) and a.abs().max() > 100 for a in args):
            raise OverflowError("planted bug: relu of a value above 100")
        return gm.forward(*args)

    return run


def scaled_up(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x * 1000.0).sin() + x


def no_threshold_backward(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """An inner compiler that raises on relu's backward op."""
    if any(n.target is torch.ops.aten.threshold_backward.default for n in gm.graph.nodes):
        raise KeyError("planted bug: threshold_backward")
    return gm


def aot_backward_bug(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """aotgraph whose backward compiler has the bug (the forward one is fine)."""
    return aot_compile(
        gm, example_inputs, fw_compiler=lambda g, _: g, bw_compiler=no_threshold_backward,
        decompositions={},
    )  # fmt: skip
