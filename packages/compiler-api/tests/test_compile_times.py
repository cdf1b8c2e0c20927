"""compile_times(): every layer's phases, recorded by real compiles and read back here."""

from __future__ import annotations

import pytest
import torch

import ember.compiler
import ember.inductor.cache
from ember.compiler.phases import PHASES

BACKENDS = ["eager", "aot_eager", "inductor"]
NESTED = [name for name, _, nested in PHASES if nested]


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    # a cache of its own: a disk-cache hit would skip tracing, lowering and the C++ build
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    ember.compiler.reset()
    yield
    ember.compiler.reset()


def _model(x, w):
    return (torch.relu(x @ w) * 2).softmax(-1)


def _inputs():
    return torch.randn(8, 16, requires_grad=True), torch.randn(16, 4)


def test_an_inductor_compile_runs_every_phase():
    compiled = ember.compiler.compile(_model, backend="inductor")
    x, w = _inputs()
    out = compiled(x, w)
    torch.testing.assert_close(out, _model(x, w))
    out.sum().backward()
    times = ember.compiler.compile_times()
    for name, _, _ in PHASES:
        calls, total, most = times[name]
        assert calls >= 1 and total > 0.0 and 0.0 < most <= total, (name, times[name])
    assert times["backend"][0] == compiled.stats.graphs == 1
    assert times["partition"][0] == 1  # one joint graph, split once
    # forward and backward graphs are each lowered and compiled once
    assert times["lowering"][0] == times["codegen"][0] == times["C++ build"][0] == 2
    inner = sum(times[name][1] for name in NESTED)
    assert inner <= times["backend"][1]  # they run inside the backend call


@pytest.mark.parametrize("backend", BACKENDS)
def test_phases_follow_the_backend(backend):
    compiled = ember.compiler.compile(_model, backend=backend)
    x, w = _inputs()
    torch.testing.assert_close(compiled(x, w), _model(x, w))
    times = ember.compiler.compile_times()
    assert times["capture"][0] == times["guards"][0] == times["backend"][0] == 1
    traced = times["aot trace"][0]
    lowered = times["lowering"][0]
    assert (traced > 0, lowered > 0) == {
        "eager": (False, False),
        "aot_eager": (True, False),
        "inductor": (True, True),
    }[backend]
    ember.inductor.cache.wait_for_builds()  # the backward graph's build runs on the pool
    before = ember.compiler.compile_times().phases
    torch.testing.assert_close(compiled(x, w), _model(x, w))  # a cache hit compiles nothing
    assert ember.compiler.compile_times().phases == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_graph_break_is_counted_per_graph(backend):
    def f(x):
        x = x.sin()
        ember.compiler.graph_break()
        return x.cos()

    compiled = ember.compiler.compile(f, backend=backend)
    x = torch.randn(5)
    torch.testing.assert_close(compiled(x), f(x))
    times = ember.compiler.compile_times()
    assert compiled.stats.graphs == times["backend"][0] == times["guards"][0] == 2
    # the breaking frame is translated twice (to find the break, then up to it), the
    # resume function once
    assert times["capture"][0] == 3


def test_reset_forgets_the_times_and_the_table_reads():
    compiled = ember.compiler.compile(_model, backend="aot_eager")
    compiled(*_inputs())
    text = str(ember.compiler.compile_times())
    assert text.splitlines()[0].split() == ["phase", "calls", "total", "(s)", "max", "(s)"]
    assert "\ncapture " in text and "\n  aot trace " in text and "\nlowering" not in text
    full = ember.compiler.compile_times(all_phases=True)
    assert list(full.phases) == [name for name, _, _ in PHASES]
    ember.compiler.reset()
    assert ember.compiler.compile_times().phases == {}
    with pytest.raises(KeyError, match="no phase 'lowerin'"):
        ember.compiler.compile_times()["lowerin"]


def test_builds_queued_at_reset_are_not_counted_after_it():
    sources = [f'extern "C" int ember_queued_{i}() {{ return {i}; }}\n' for i in range(6)]
    for source in sources:  # more than the pool's threads: some wait in its queue
        ember.inductor.cache.build_async(source)
    ember.compiler.reset()  # waits for all of them: their times belong before the reset
    ember.inductor.cache.wait_for_builds()  # (were any still queued, it would land now)
    assert ember.compiler.compile_times()["C++ build"][0] == 0
