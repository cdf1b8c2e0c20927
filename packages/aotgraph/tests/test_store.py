"""aotgraph's disk cache: a graph compiled again (in this process or another) skips tracing,
and what it runs matches eager; keys tell apart what tracing depends on; bad records are
ignored and written again; the cache can be turned off."""

from __future__ import annotations

import copy
import json
import math
import operator
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from models import ZOO

from ember.aotgraph import aot_compile, api, store
from ember.aotgraph.trace import Lifted

Capture = Callable[[torch.nn.Module, list[Any]], tuple[torch.fx.GraphModule, list[Any]]]


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test starts with an empty cache folder of its own."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("EMBER_AOT_CACHE", raising=False)
    return tmp_path / "aotgraph"


def as_is(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    return gm


def records(folder: Path) -> list[Path]:
    return sorted(folder.glob("*/*.json"))


def train_step(fn: Callable[..., Any], inputs: list[Any], seed: int = 0) -> tuple[Any, list[Any]]:
    torch.manual_seed(seed)
    out = fn(*inputs)
    out.float().square().mean().backward()
    return out, [t.grad for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]


def zoo(name: str, capture: Capture) -> tuple[torch.nn.Module, torch.fx.GraphModule, list[Any]]:
    """A zoo model, its graph with parameters and buffers as inputs, and those inputs."""
    model, args = ZOO[name].make()
    gm, inputs = capture(model, list(args))
    return model, gm, inputs


def test_second_compile_hits_and_matches_eager(capture, traces, own_cache):
    model, gm, inputs = zoo("mlp", capture)
    eager = copy.deepcopy(model)
    first = aot_compile(gm, inputs, fw_compiler=as_is)
    assert first.cache_hit is False and traces == ["analyze", "trace_joint"]
    assert len(records(own_cache)) == 1
    traces.clear()
    second = aot_compile(gm, inputs, fw_compiler=as_is)
    assert second.cache_hit is True and traces == []  # no tracing at all
    assert second.joint is None and second.partition is not None
    assert second.partition.saved == first.partition.saved
    assert second.partition.summary() == first.partition.summary()
    out, _ = train_step(second, inputs)
    (x,) = ZOO["mlp"].make()[1]  # the same input again
    want, _ = train_step(eager, [x])
    torch.testing.assert_close(out, want)
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


def test_the_compilers_get_the_same_graphs_and_example_inputs(capture):
    _, gm, inputs = zoo("rnn", capture)
    seen: list[list[Any]] = []

    def keep(graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        metas = [(type(e).__name__, tuple(e.shape), e.stride(), e.dtype) for e in example_inputs]
        seen.append([graph.code, metas])
        return graph

    aot_compile(gm, inputs, fw_compiler=keep)
    aot_compile(gm, inputs, fw_compiler=keep)
    assert len(seen) == 4
    assert seen[2:] == seen[:2]  # forward: real inputs; backward: fake tensors
    assert seen[1][1][0][0] == "FakeTensor"


@pytest.mark.slow
def test_a_second_process_hits(tmp_path):
    script = textwrap.dedent(
        """
        import torch
        from ember.aotgraph import aot_compile
        from torch.fx.experimental.proxy_tensor import make_fx
        torch.manual_seed(0)
        w = torch.randn(8, 8, requires_grad=True)
        x = torch.randn(4, 8)
        gm = make_fx(lambda x, w: (x @ w).tanh().sum(), tracing_mode="fake")(x, w)
        f = aot_compile(gm, [x, w], fw_compiler=lambda gm, ex: gm)
        f(x, w).backward()
        print(f.cache_hit, float(w.grad.sum()))
        """
    )
    env = {**os.environ, "EMBER_CACHE_DIR": str(tmp_path)}
    runs = [
        subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        for _ in range(2)
    ]
    assert [r[0] for r in runs] == ["False", "True"]
    assert runs[0][1] == runs[1][1]  # the same gradients


def test_batchnorm_writes_back_running_stats_after_a_hit(capture, traces):
    model, gm, inputs = zoo("cnn-train", capture)
    eager = copy.deepcopy(model)
    aot_compile(gm, inputs, fw_compiler=as_is)  # fills the cache
    traces.clear()
    f = aot_compile(gm, inputs, fw_compiler=as_is)
    assert f.cache_hit is True and traces == []
    for step in range(2):
        x = torch.randn(2, 3, 16, 16)
        out, _ = train_step(f, [x, *inputs[1:]], seed=step)
        want, _ = train_step(eager, [x], seed=step)
        torch.testing.assert_close(out, want)
    for (name, b), (_, c) in zip(model.named_buffers(), eager.named_buffers(), strict=True):
        torch.testing.assert_close(b, c, msg=name)  # running_mean/var written back
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


def test_the_inference_path_hits(traces):
    gm = torch.fx.symbolic_trace(lambda x, buf: x.sin() + buf.add_(1))
    x, buf = torch.randn(3), torch.zeros(3)
    aot_compile(gm, [x, buf], fw_compiler=as_is)
    traces.clear()
    f = aot_compile(gm, [x, buf], fw_compiler=as_is)
    assert f.cache_hit is True and traces == [] and f.inference_graph is not None
    torch.testing.assert_close(f(x, buf), x.sin() + 1)
    torch.testing.assert_close(buf, torch.ones(3))  # written back


def _float_graph() -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x, a, b = (graph.placeholder(n) for n in "xab")
    root = graph.call_function(math.sqrt, (graph.call_function(max, (a, b)),))
    graph.output(graph.call_function(operator.mul, (x, root)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_float_inputs_stay_symbolic_after_a_hit(traces):
    x = torch.randn(3, requires_grad=True)
    aot_compile(_float_graph(), [x, 4.0, 1.0], fw_compiler=as_is)
    traces.clear()
    f = aot_compile(_float_graph(), [x, 2.0, 3.0], fw_compiler=as_is)  # other values: a hit
    assert f.cache_hit is True and traces == [] and f.variants == {}
    for a, b in ((4.0, 1.0), (1.0, 9.0)):
        y = f(x, a, b)
        torch.testing.assert_close(y, x * math.sqrt(max(a, b)))
        (g,) = torch.autograd.grad(y.sum(), x)
        torch.testing.assert_close(g, torch.full((3,), math.sqrt(max(a, b))))


def _needs_the_value(x, k):
    return x * math.exp(k)  # tracing fixes k's value


def test_a_trace_that_needed_a_float_value_is_remembered(traces):
    x = torch.randn(3)
    gm = torch.fx.symbolic_trace(_needs_the_value)
    aot_compile(gm, [x, 0.5], fw_compiler=as_is)
    assert traces == ["trace_inference", "trace_inference"]  # symbolic try, then constant
    traces.clear()
    g = aot_compile(gm, [x, 0.5], fw_compiler=as_is)
    assert traces == []  # neither the failing symbolic trace nor the constant one again
    assert g.lifted.constant_positions == (1,)
    torch.testing.assert_close(g(x, 0.5), x * math.exp(0.5))


def key(fn: Any, inputs: list[Any], *, grad: bool = True, partition: str = "min_cut") -> str:
    lifted = Lifted.of(torch.fx.symbolic_trace(fn), inputs)
    flat = lifted.flat_inputs(inputs)
    found = store.record_key(lifted, flat, grad, store.settings_key(partition, {}))
    assert found is not None
    return found


def mul(x: Any, y: Any) -> Any:
    return x * y


def test_keys_tell_apart_what_tracing_depends_on():
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    base = key(mul, [x, y])
    assert key(mul, [torch.randn(4, 3), torch.randn(4, 3)]) == base  # values do not matter
    others = {
        "shape": key(mul, [torch.randn(5, 3), y[:1].expand(5, 3)]),
        "dtype": key(mul, [x.double(), y]),
        "stride": key(mul, [torch.randn(3, 4).t(), y]),
        "offset": key(mul, [torch.randn(5, 3)[1:], y]),
        "requires_grad": key(mul, [x.requires_grad_(), y]),
        "grad mode": key(mul, [x, y], grad=False),
        "aliasing": key(mul, [x, x]),
        "partitioner": key(mul, [x, y], partition="default"),
        "code": key(lambda x, y: x + y, [x, y]),
        "int constant": key(mul, [x, 2]),
        "another int": key(mul, [x, 3]),
        "bool constant": key(mul, [x, True]),
        "float input": key(mul, [x, 2.0]),
    }
    assert key(mul, [x, 2.5]) == others["float input"]  # symbolic: the value is not traced
    assert len({base, *others.values()}) == len(others) + 1


def test_keys_tell_apart_decomposition_tables():
    lifted = Lifted.of(torch.fx.symbolic_trace(mul), [torch.ones(2), torch.ones(2)])
    inputs = lifted.flat_inputs([torch.ones(2), torch.ones(2)])
    aten = torch.ops.aten
    tables: list[Any] = [{}, {aten.mul.Tensor: mul}, {aten.mul.Tensor: operator.mul}]
    keys = {
        store.record_key(lifted, inputs, True, store.settings_key("min_cut", t)) for t in tables
    }
    assert len(keys) == 3


BUILT: list[int] = []


def table() -> dict[Any, Any]:
    BUILT.append(1)
    return {}


def test_a_function_table_is_built_only_when_tracing(traces):
    built = BUILT
    built.clear()
    gm = torch.fx.symbolic_trace(lambda x: x.cos() * 2)
    x = torch.randn(3, requires_grad=True)
    aot_compile(gm, [x], fw_compiler=as_is, decompositions=table)
    assert len(built) == 1
    f = aot_compile(gm, [x], fw_compiler=as_is, decompositions=table)
    assert len(built) == 1 and f.cache_hit is True  # a hit never builds the table
    torch.testing.assert_close(f(x), x.cos() * 2)


DAMAGE = ["garbage", "truncated", "another key", "foreign graph", "graphs unlike the signature"]


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_bad_record_is_ignored_and_written_again(damage, traces, own_cache, monkeypatch):
    gm = torch.fx.symbolic_trace(lambda x: (x * 3).sin())
    x = torch.randn(4, requires_grad=True)
    aot_compile(gm, [x], fw_compiler=as_is)
    (path,) = records(own_cache)
    good = path.read_text()
    record = json.loads(good)
    if damage == "garbage":
        path.write_bytes(b"\x80\x04\x95 not json")
    elif damage == "truncated":
        path.write_text(good[: len(good) // 2])
    elif damage == "another key":
        path.write_text(json.dumps({**record, "key": "0" * 64}))
    elif damage == "foreign graph":  # code where a name should be: refused, never run
        record["forward"]["nodes"][0]["target"] = "x=os.environ.setdefault('EMBER_PWNED', '1')"
        path.write_text(json.dumps(record))
    else:  # one gradient input fewer than the backward graph returns
        record["signature"]["ints"][2] = []
        path.write_text(json.dumps(record))
    monkeypatch.delenv("EMBER_PWNED", raising=False)
    traces.clear()
    f = aot_compile(gm, [x], fw_compiler=as_is)
    assert f.cache_hit is False and traces == ["analyze", "trace_joint"]  # traced again
    assert "EMBER_PWNED" not in os.environ
    (g,) = torch.autograd.grad(f(x).sum(), x)
    torch.testing.assert_close(g, 3 * (x * 3).cos())
    assert json.loads(path.read_text()) == json.loads(good)  # written again, whole


def _helper(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_what_cannot_be_cached_still_compiles(traces, own_cache):
    graph = torch.fx.Graph()  # a graph calling a function of the user's: not cached
    x = graph.placeholder("x")
    graph.output(graph.call_function(_helper, (x,)))
    user_fn = torch.fx.GraphModule(torch.nn.Module(), graph)
    complex_out = torch.fx.symbolic_trace(lambda x: (x * 2, 1j))  # an output JSON cannot hold
    cases: list[tuple[torch.fx.GraphModule, list[Any]]] = [
        (user_fn, [torch.randn(2, requires_grad=True)]),
    ]
    cases.append((complex_out, [torch.randn(2, requires_grad=True)]))
    for gm, inputs in cases:
        for _ in range(2):
            traces.clear()
            f = aot_compile(gm, inputs, fw_compiler=as_is)
            assert traces == ["analyze", "trace_joint"]  # traced both times
            out = f(*inputs)
            first = out[0] if isinstance(out, tuple) else out
            torch.testing.assert_close(first, inputs[0] * 2)
    assert records(own_cache) == []
    assert aot_compile(user_fn, cases[0][1], fw_compiler=as_is).cache_hit is None


def test_a_partitioner_of_the_callers_own_is_not_cached(traces, own_cache):
    gm = torch.fx.symbolic_trace(lambda x: x.exp())
    x = torch.randn(3, requires_grad=True)
    f = aot_compile(gm, [x], fw_compiler=as_is, partition=lambda j: api.default_partition(j))
    assert f.cache_hit is None and records(own_cache) == []


def test_the_cache_can_be_turned_off(traces, own_cache, monkeypatch):
    gm = torch.fx.symbolic_trace(lambda x: x.exp())
    x = torch.randn(3, requires_grad=True)
    aot_compile(gm, [x], fw_compiler=as_is, cache=False)
    assert records(own_cache) == []
    monkeypatch.setenv("EMBER_AOT_CACHE", "0")
    aot_compile(gm, [x], fw_compiler=as_is)
    assert records(own_cache) == []
    monkeypatch.delenv("EMBER_AOT_CACHE")
    aot_compile(gm, [x], fw_compiler=as_is)  # on again: written
    traces.clear()
    f = aot_compile(gm, [x], fw_compiler=as_is, cache=False)  # off: not read either
    assert f.cache_hit is None and traces == ["analyze", "trace_joint"]
