"""Float graph inputs (``loss.item()``, ``x.tolist()``): kernels take them as arguments."""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from ember.aotgraph import aot_compile, default_decompositions
from ember.inductor import CompiledGraph, compile_graph, decompositions
from ember.inductor.cache import CompileOptions
from ember.inductor.graph_cache import graph_key
from ember.inductor.interpret import interpret
from ember.inductor.lowering import lower_graph

T = torch.Tensor


def _compile(fn: Callable[..., Any], inputs: list[Any]) -> tuple[Any, list[CompiledGraph]]:
    """``fn`` through ember.aotgraph (floats traced symbolically) and compile_graph."""
    seen: list[CompiledGraph] = []

    def kernels(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
        compiled = compile_graph(gm, example, {"graph_cache": False})
        assert isinstance(compiled, CompiledGraph), "the graph ran eagerly"
        seen.append(compiled)
        return compiled

    table = {**default_decompositions(), **decompositions()}
    gm = fn if isinstance(fn, torch.fx.GraphModule) else torch.fx.symbolic_trace(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "running the graph eagerly"
        return aot_compile(
            gm, inputs, fw_compiler=kernels, bw_compiler=kernels, decompositions=table
        ), seen


CASES: dict[str, Callable[[T, Any], T]] = {
    "mul": lambda x, a: x.tanh() * a,
    "div": lambda x, a: a / (x.abs() + 1),
    "sub": lambda x, a: (a - x) * (x - a),
    "where": lambda x, a: torch.where(x > 0, x, a),
    "clamp": lambda x, a: torch.clamp(x, min=a),
    "full": lambda x, a: torch.full_like(x, a) + x,
    "masked_fill": lambda x, a: x.masked_fill(x > 0.5, a),
    "compare": lambda x, a: (x < a).float() * x,
}


@pytest.mark.parametrize("name", list(CASES))
def test_float_operand_matches_eager_for_every_value(name: str) -> None:
    fn = CASES[name]
    x = torch.randn(4, 8, requires_grad=True)
    compiled, graphs = _compile(fn, [x, 0.5])
    for a in (0.5, -1.25, 2.0):  # one compiled graph serves every value
        got, want = compiled(x, a), fn(x, a)
        torch.testing.assert_close(got, want)
        (g,) = torch.autograd.grad(got.sum(), x)
        (gw,) = torch.autograd.grad(want.sum(), x)
        torch.testing.assert_close(g, gw)
    forward = graphs[0].kernel_args
    assert any(a == "primals_2:float64" for args in forward.values() for a in args)
    assert len(graphs) == 2  # forward and backward, compiled once


def _breaking_tail() -> torch.fx.GraphModule:
    """The third graph of a program that calls ``tolist()``: numbers in, arithmetic on them
    (max/min as ember's capture records them), a tensor scaled by the result."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    numbers = [graph.placeholder(f"s{k}") for k in range(6)]
    hi, lo = numbers[0], numbers[0]
    for n in numbers[1:]:
        hi = graph.call_function(max, (hi, n))
        lo = graph.call_function(min, (lo, n))
    spread = graph.call_function(operator.sub, (graph.call_function(operator.add, (1.0, hi)), lo))
    scale = graph.call_function(operator.truediv, (1.0, spread))
    graph.output(graph.call_function(operator.mul, (graph.call_function(torch.tanh, (x,)), scale)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_arithmetic_on_numbers_runs_in_the_wrapper() -> None:
    gm = _breaking_tail()
    x = torch.randn(8, 16, requires_grad=True)
    values = [0.5, -1.0, 3.0, 0.25, 2.0, -0.5]
    compiled, graphs = _compile(gm, [x, *values])
    for scale in (1.0, -2.0, 0.1):
        numbers = [v * scale for v in values]
        got, want = compiled(x, *numbers), gm(x, *numbers)
        torch.testing.assert_close(got, want)
        (g,) = torch.autograd.grad(got.sum(), x)
        (gw,) = torch.autograd.grad(want.sum(), x)
        torch.testing.assert_close(g, gw)
    forward, backward = graphs
    assert "max(primals_2, primals_3, primals_4" in forward.wrapper  # one call, not five
    assert any(":float64" in a for args in backward.kernel_args.values() for a in args)


def test_reference_interpreter_takes_numbers() -> None:
    gm = _breaking_tail()
    x, values = torch.randn(8, 16), [0.5, -1.0, 3.0, 0.25, 2.0, -0.5]
    _, graphs = _compile(gm, [x, *values])
    forward = graphs[0].gm  # inputs x, s0, ..., s5; outputs the result and what backward saves
    prog = lower_graph(forward, [x, *values])
    assert [s.name for s in prog.scalars.values()][:6] == prog.inputs[1:]
    for got, want in zip(interpret(prog, [x, *values]), forward(x, *values), strict=True):
        torch.testing.assert_close(got, want)


def test_graph_key_has_the_kind_of_each_input_not_its_value() -> None:
    gm = torch.fx.symbolic_trace(lambda x, a: x * a)
    x, options = torch.randn(3), CompileOptions()
    assert graph_key(gm, [x, 0.5], options) == graph_key(gm, [x, -2.0], options)
    assert graph_key(gm, [x, 0.5], options) != graph_key(gm, [x, torch.tensor(0.5)], options)
    assert graph_key(gm, [x, 2], options) != graph_key(gm, [x, 2.0], options)


def test_graph_cache_serves_other_values() -> None:
    fn = CASES["where"]
    gm = torch.fx.symbolic_trace(fn)
    x = torch.randn(4, 8)
    seen: list[CompiledGraph] = []

    def kernels(graph: torch.fx.GraphModule, example: list[Any]) -> Any:
        seen.append(compile_graph(graph, example))  # type: ignore[arg-type]
        return seen[-1]

    table = {**default_decompositions(), **decompositions()}
    for a in (0.5, -3.0):  # a fresh trace each time: the second graph comes from the cache
        compiled = aot_compile(gm, [x, a], fw_compiler=kernels, decompositions=table)
        torch.testing.assert_close(compiled(x, 1.5), fn(x, 1.5))
    assert seen[0].schedule is not None and seen[-1].schedule is None  # a graph-cache hit
