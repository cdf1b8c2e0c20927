"""The JSON form of traced graphs: real graphs round-trip to the same code, values and results;
what it cannot hold is refused; files that are not its own never decode (nor run)."""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
from models import ZOO

from ember.aotgraph import aot_compile, serialize
from ember.aotgraph.serialize import Unencodable

Capture = Callable[[torch.nn.Module, list[Any]], tuple[torch.fx.GraphModule, list[Any]]]


def traced_graphs(gm: torch.fx.GraphModule, inputs: list[Any]) -> list[torch.fx.GraphModule]:
    """The graphs aot_compile hands its compilers: forward and backward, then inference."""
    graphs: list[torch.fx.GraphModule] = []

    def keep(graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append(graph)
        return graph

    f = aot_compile(gm, inputs, fw_compiler=keep, cache=False)
    with torch.no_grad():
        f(*inputs)
    return graphs


def zoo_graphs(name: str, capture: Capture) -> list[torch.fx.GraphModule]:
    model, args = ZOO[name].make()
    return traced_graphs(*capture(model, list(args)))


def float_graph(capture: Capture | None = None) -> list[torch.fx.GraphModule]:
    """x * sqrt(max(a, b)) + a with float inputs a, b: symbolic floats in the traced graphs."""
    graph = torch.fx.Graph()
    x, a, b = (graph.placeholder(n) for n in "xab")
    root = graph.call_function(math.sqrt, (graph.call_function(max, (a, b)),))
    scaled = graph.call_function(operator.mul, (x, root))
    graph.output(graph.call_function(operator.add, (scaled, a)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    return traced_graphs(gm, [torch.randn(3, requires_grad=True), 4.0, 1.0])


def constant_graph(capture: Capture) -> list[torch.fx.GraphModule]:
    """A tensor made inside the graph: make_fx lifts it to a get_attr constant."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    c = graph.call_function(torch.tensor, ([[1.0, -2.0], [float("inf"), 0.5]],))
    graph.output(graph.call_function(torch.mul, (x, c)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    return traced_graphs(gm, [torch.randn(2, 2, requires_grad=True)])


CASES: dict[str, Callable[[Capture], list[torch.fx.GraphModule]]] = {
    "mlp": lambda capture: zoo_graphs("mlp", capture),
    "conv-batchnorm": lambda capture: zoo_graphs("cnn-train", capture),
    "transformer-block": lambda capture: zoo_graphs("transformer-block", capture),
    "rnn-loop": lambda capture: zoo_graphs("rnn", capture),
    "float-inputs": float_graph,
    "constant": constant_graph,
}


def meta_of(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.stride(), value.storage_offset(), value.dtype)
    if isinstance(value, list | tuple):
        return type(value), [meta_of(v) for v in value]
    if isinstance(value, torch.SymFloat):
        return "symfloat", value.node.hint
    return value


def node_text(node: torch.fx.Node) -> tuple[str, ...]:
    return node.name, node.op, str(node.target), repr(node.args), repr(node.kwargs)


def example(node: torch.fx.Node) -> Any:
    """A real input like the placeholder's fake value (a float for a symbolic float)."""
    val = node.meta["val"]
    if isinstance(val, torch.SymFloat):
        return float(val.node.hint)
    if val.dtype == torch.bool:
        return torch.randn(val.shape) > 0
    if not val.dtype.is_floating_point:
        return torch.randint(0, 3, val.shape, dtype=val.dtype)
    return torch.randn(val.shape, dtype=val.dtype)


@pytest.mark.parametrize("name", sorted(CASES))
def test_round_trip_keeps_code_values_and_results(name, capture):
    graphs = CASES[name](capture)
    assert len(graphs) == 3  # forward, backward, inference
    for gm in graphs:
        text = json.dumps(serialize.dump(gm))  # plain JSON
        loaded = serialize.load(json.loads(text))
        assert loaded.code == gm.code
        assert torch.fx.GraphModule(loaded, loaded.graph).code == gm.code
        for a, b in zip(gm.graph.nodes, loaded.graph.nodes, strict=True):
            assert node_text(a) == node_text(b)
            assert a.target is b.target or a.op != "call_function"
            assert meta_of(a.meta.get("val")) == meta_of(b.meta.get("val")), a.name
        for name_, t in gm.named_buffers():
            torch.testing.assert_close(getattr(loaded, name_), t, equal_nan=True)
        torch.manual_seed(0)
        inputs = [example(n) for n in gm.graph.find_nodes(op="placeholder")]
        torch.manual_seed(1)  # the same dropout masks
        want = gm(*inputs)
        torch.manual_seed(1)
        got = loaded(*inputs)
        for w, g in zip(want, got, strict=True):
            if isinstance(w, torch.Tensor):
                torch.testing.assert_close(g, w, equal_nan=True)
            else:
                assert g == w


def test_symbolic_floats_come_back_symbolic():
    forward = float_graph()[0]
    loaded = serialize.load(serialize.dump(forward))
    vals = [n.meta["val"] for n in loaded.graph.find_nodes(op="placeholder")]
    assert [type(v).__name__ for v in vals] == ["FakeTensor", "SymFloat", "SymFloat"]
    assert [v.node.hint for v in vals[1:]] == [4.0, 1.0]
    fakes = [v for n in loaded.graph.nodes if isinstance(v := n.meta.get("val"), torch.Tensor)]
    assert len({id(t.fake_mode) for t in fakes}) == 1  # one mode for the whole graph


@pytest.mark.parametrize(
    "value",
    [
        0,
        -(2**70),
        True,
        None,
        "s",
        1.5,
        -0.0,
        float("inf"),
        float("-inf"),
        [1, (2, [3.0])],
        (),
        slice(1, None, 2),
        torch.float16,
        torch.bfloat16,
        torch.strided,
        torch.channels_last,
        torch.device("cpu"),
    ],
)
def test_values_round_trip(value):
    got = serialize.decode_value(json.loads(json.dumps(serialize.encode_value(value))))
    assert got == value and type(got) is type(value)
    if isinstance(value, float):
        assert math.copysign(1, got) == math.copysign(1, value)


def test_nan_round_trips():
    assert math.isnan(serialize.decode_value(serialize.encode_value(float("nan"))))


def _graph_calling(fn: Any) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output([graph.call_function(fn, (x,))])
    return torch.fx.GraphModule(torch.nn.Module(), graph)


@pytest.mark.parametrize(
    "gm",
    [
        _graph_calling(lambda x: x),  # a function outside the allowlist
        _graph_calling(torch.sin),  # torch-level functions are not aten ops
        torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU())),  # call_module
        torch.fx.symbolic_trace(lambda x: x.relu()),  # call_method
    ],
)
def test_what_the_form_cannot_hold_is_refused(gm):
    with pytest.raises(Unencodable):
        serialize.dump(gm)


def test_a_constant_that_is_not_plain_data_is_refused():
    gm = _graph_calling(torch.ops.aten.relu.default)
    gm.w = torch.nn.Parameter(torch.ones(2))  # requires grad
    with gm.graph.inserting_before(gm.graph.output_node()):
        gm.graph.get_attr("w")
    with pytest.raises(Unencodable):
        serialize.dump(gm)


def test_a_value_of_an_unknown_type_is_refused():
    gm = _graph_calling(torch.ops.aten.relu.default)
    next(iter(gm.graph.nodes)).meta["val"] = object()
    with pytest.raises(Unencodable):
        serialize.dump(gm)


def good_data() -> Any:
    return serialize.dump(_graph_calling(torch.ops.aten.relu.default))


FOREIGN = {
    "code in a placeholder's name": ("nodes", 0, "target", "x=__import__('os').getpid()"),
    "code in a node's name": ("nodes", 1, "name", "relu; import os"),
    "a keyword as a name": ("nodes", 0, "name", "lambda"),
    "an unknown operator": ("nodes", 1, "target", "aten.no_such_op.default"),
    "a higher-order op": ("nodes", 1, "target", "higher_order.cond.default"),
    "a module path as target": ("nodes", 1, "target", "os.system"),
    "an unknown node kind": ("nodes", 1, "op", "call_module"),
    "an unknown value tag": ("nodes", 1, "args", [{"pickle": "gASV"}]),
    "a reference to a later node": ("nodes", 1, "args", [{"node": "output"}]),
    "an unknown dtype": ("nodes", 1, "val", {"tensor": [[2], [1], 0, "Tensor", "cpu", False]}),
    "code in a class name": ("class", None, None, "X(): pass"),
}


@pytest.mark.parametrize("name", sorted(FOREIGN))
def test_foreign_data_does_not_decode(name):
    data = good_data()
    part, index, field, value = FOREIGN[name]
    if index is None:
        data[part] = value
    else:
        data[part][index][field] = value
    with pytest.raises((ValueError, KeyError, TypeError, AttributeError, RuntimeError)):
        serialize.load(data)


def test_constants_round_trip_bit_exact():
    for t in (
        torch.arange(6, dtype=torch.int64).view(2, 3).t(),
        torch.tensor([1.5, float("nan"), -0.0], dtype=torch.bfloat16),
        torch.tensor([True, False]),
        torch.zeros(0, 3),
        torch.tensor(2.5),
    ):
        got = serialize.decode_tensor(json.loads(json.dumps(serialize.encode_tensor(t))))
        assert (got.dtype, got.shape, got.stride()) == (t.dtype, t.shape, t.stride())
        assert raw_bytes(got) == raw_bytes(t)


def raw_bytes(t: torch.Tensor) -> list[int]:
    return t.contiguous().reshape(-1).view(torch.uint8).tolist()
