"""Logging (issue 17 §2): EMBER_LOGS / set_logs levels and artifacts, EMBER_DEBUG_FUNCTION,
progress lines of slow compiles. Each artifact is read from real compiles, on every backend."""

from __future__ import annotations

import logging
import time

import pytest
import torch

import ember.compiler
from ember.aotgraph import aot_compile
from ember.capture import log as capture_log
from ember.compiler import logs
from ember.compiler.testing import assert_same

BACKENDS = ["eager", "aot_eager", "inductor"]
# the artifacts each backend writes for a frame with a graph break, compiled twice
_CAPTURE = {"graph_code", "bytecode", "graph_breaks", "guards", "recompiles", "perf"}
WRITTEN = {
    "eager": _CAPTURE,
    "aot_eager": _CAPTURE | {"aot_graphs"},
    "inductor": set(logs.ARTIFACTS),
}


class Records(logging.Handler):
    """Every record that reaches the ``ember`` logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def channels(self) -> set[str]:
        return {r.name for r in self.records}

    def text(self, channel: str) -> str:
        return "\n".join(r.getMessage() for r in self.records if r.name == channel)


@pytest.fixture
def records(tmp_path, monkeypatch):
    # a disk cache of its own: a hit would skip the aot trace and inductor's codegen
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    ember.compiler.reset()
    handler = Records()
    top = logging.getLogger("ember")
    top.addHandler(handler)
    yield handler
    top.removeHandler(handler)
    ember.compiler.set_logs()
    logs.set_progress(None)
    logs.set_debug_function(None)
    ember.compiler.reset()


def _model(x, n):
    y = torch.sin(x) * n
    print("a graph break")
    return y.cos() + 1


def _run(backend: str) -> None:
    """Compile ``_model`` and call it with two constants (a recompile), as eager does."""
    compiled = ember.compiler.compile(_model, backend=backend)
    for n in (2, 3):
        x = torch.randn(8, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        got, want = compiled(x, n), _model(x2, n)
        assert_same(got, want)
        got.sum().backward()
        want.sum().backward()
        assert_same(x.grad, x2.grad)


def _artifact_channels(names: set[str]) -> set[str]:
    return {logger for name in names for logger in logs.ARTIFACTS[name].loggers}


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_artifact_appears_when_on(records, backend):
    ember.compiler.set_logs(**{name: True for name in logs.ARTIFACTS})
    _run(backend)
    wanted = _artifact_channels(WRITTEN[backend])
    if backend != "inductor":
        wanted.discard("ember.inductor.perf")
    assert wanted <= records.channels()
    assert "print" in records.text("ember.capture.graph_breaks")
    assert "test_logs.py" in records.text("ember.capture.graph_breaks")
    assert "torch.sin(x)" in records.text("ember.capture.graph_code")
    if backend != "eager":
        aot = records.text("ember.aotgraph.aot_graphs")
        assert "forward graph:" in aot and "backward graph:" in aot and "aten.sin" in aot
    if backend == "inductor":
        assert 'extern "C" void kernel0(' in records.text("ember.inductor.output_code")
        assert "SIN(" in records.text("ember.inductor.schedule")


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_artifact_when_off(records, backend):
    ember.compiler.set_logs()
    _run(backend)
    assert not records.channels() & _artifact_channels(set(logs.ARTIFACTS))


@pytest.mark.parametrize("name", sorted(logs.ARTIFACTS))
def test_one_artifact_alone(records, name):
    ember.compiler.set_logs(**{name: True})
    _run(next(b for b in BACKENDS if name in WRITTEN[b]))  # the cheapest that writes it
    seen = records.channels() & _artifact_channels(set(logs.ARTIFACTS))
    assert seen and seen <= set(logs.ARTIFACTS[name].loggers)


def test_recompiles_name_the_failed_guard_and_its_line(records):
    ember.compiler.set_logs(recompiles=True)
    _run("eager")
    text = records.text("ember.guards.recompiles")
    line = _model.__code__.co_firstlineno + 1  # y = torch.sin(x) * n
    assert "recompiling _model" in text
    assert "n: expected 2, got 3" in text
    assert f"test_logs.py:{line}" in text


def test_guards_show_sources_and_lines(records):
    ember.compiler.set_logs(guards=True)
    _run("eager")
    text = records.text("ember.guards.guards")
    assert "TENSOR_MATCH  x:" in text and "EQUALS        n == 2" in text
    assert f"test_logs.py:{_model.__code__.co_firstlineno + 1}" in text


def test_bytecode_before_and_after(records):
    ember.compiler.set_logs(bytecode=True)
    _run("eager")
    text = records.text("ember.capture.bytecode")
    original, _, transformed = text.partition("transformed")
    assert "LOAD_GLOBAL" in original and "print)" in original
    assert "__ember_" in transformed  # the generated code's own locals


def test_facts_carry_from_a_debug_package_code_does_not(records):
    logs.apply_settings(logs.parse("+capture"))
    _run("eager")
    seen = records.channels()
    assert "ember.capture.graph_breaks" in seen and "ember.capture.perf" in seen
    assert "ember.capture.graph_code" not in seen and "ember.capture.bytecode" not in seen
    assert "ember.guards.recompiles" not in seen  # another package's fact


def test_levels_plus_plain_minus(records):
    logs.apply_settings(logs.parse("capture"))  # INFO: what was compiled, no DEBUG facts
    _run("eager")
    assert any(r.levelno == logging.INFO and r.name == "ember.capture" for r in records.records)
    assert "ember.capture.graph_breaks" not in records.channels()
    records.records.clear()
    ember.compiler.reset()
    logs.apply_settings(logs.parse("-capture,graph_breaks"))  # ERROR only, artifact named
    _run("eager")
    assert records.channels() == {"ember.capture.graph_breaks"}


def test_set_logs_resets_what_it_is_not_given(records):
    ember.compiler.set_logs(graph_code=True, capture=logging.DEBUG)
    ember.compiler.set_logs(recompiles=True)
    assert logging.getLogger("ember.capture").level == logging.NOTSET
    _run("eager")
    assert records.channels() == {"ember.guards.recompiles"}
    ember.compiler.set_logs()
    assert logging.getLogger("ember").propagate  # no handler of ours left
    assert not [h for h in logging.getLogger("ember").handlers if h is not records]


def test_ember_logs_from_the_environment(records, monkeypatch):
    monkeypatch.setenv("EMBER_LOGS", "+guards, graph_code")
    logs.apply_environment()
    assert logging.getLogger("ember.guards").level == logging.DEBUG
    assert logging.getLogger("ember.capture.graph_code").level == logging.DEBUG
    monkeypatch.setenv("EMBER_LOGS", "graph_code,grpah_breaks")
    with pytest.warns(UserWarning, match="unknown name 'grpah_breaks'; valid: all, capture"):
        logs.apply_environment()  # a typo never stops the program
    assert logging.getLogger("ember.capture.graph_code").level > logging.CRITICAL


def test_an_artifact_off_costs_nothing():
    def boom() -> str:
        raise AssertionError("formatted while off")

    ember.compiler.set_logs()
    capture_log.artifact("graph_code", boom)


def _inner(x):
    return torch.relu(x) + 1


def _outer(x):
    return _inner(x * 2) - 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_debug_function_captures_only_that_function(records, backend):
    logs.set_debug_function("_inner")
    compiled = ember.compiler.compile(_outer, backend=backend)
    x = torch.randn(6)
    assert_same(compiled(x), _outer(x))
    names = [c.code.split(" ")[0] for c in compiled.stats.compiled]
    assert names == ["_inner"]
    assert compiled.stats.failures == []  # the user's choice, not a failure
    ember.compiler.reset()
    logs.set_debug_function(None)
    compiled = ember.compiler.compile(_outer, backend=backend)
    assert_same(compiled(x), _outer(x))
    assert [c.code.split(" ")[0] for c in compiled.stats.compiled] == ["_outer"]


def test_debug_function_from_the_environment(records, monkeypatch):
    monkeypatch.setenv("EMBER_DEBUG_FUNCTION", "_inner")
    logs.apply_environment()
    compiled = ember.compiler.compile(_outer, backend="eager")
    compiled(torch.randn(3))
    assert [c.code.split(" ")[0] for c in compiled.stats.compiled] == ["_inner"]


def _sleeping(seconds: float):
    def backend(gm, example_inputs):
        time.sleep(seconds)
        return gm.forward

    return backend


def test_a_slow_compile_shows_progress(records, capsys):
    logs.set_progress(True)
    compiled = ember.compiler.compile(_inner, backend=_sleeping(2.1))
    x = torch.randn(4)
    assert_same(compiled(x), _inner(x))
    err = capsys.readouterr().err
    assert "ember: compiling _inner (" in err
    assert "graph 1 of 1, phase backend" in err
    assert "ember: compiled _inner (" in err


def test_progress_names_the_aot_graph(records, capsys, monkeypatch):
    monkeypatch.setattr(logs, "PROGRESS_AFTER_S", 0.05)
    logs.set_progress(True)

    def backend(gm, example_inputs):
        return aot_compile(gm, example_inputs, fw_compiler=_sleeping(0.5))

    compiled = ember.compiler.compile(_inner, backend=backend)
    x = torch.randn(4, requires_grad=True)
    compiled(x).sum().backward()
    err = capsys.readouterr().err
    assert "graph 1 of 2 (forward), phase backend" in err
    assert "graph 2 of 2 (backward), phase backend" in err


@pytest.mark.parametrize("off", ["setting", "environment"])
def test_progress_switched_off(records, capsys, monkeypatch, off):
    monkeypatch.setattr(logs, "PROGRESS_AFTER_S", 0.05)
    if off == "setting":
        logs.set_progress(False)
    else:
        monkeypatch.setenv("EMBER_PROGRESS", "0")
        logs.set_progress(None)
    compiled = ember.compiler.compile(_inner, backend=_sleeping(0.4))
    x = torch.randn(4)
    assert_same(compiled(x), _inner(x))
    assert "ember:" not in capsys.readouterr().err


def test_a_fast_compile_is_silent(records, capsys):
    ember.compiler.compile(_outer, backend="eager")(torch.randn(4))  # warm: torch's first use
    capsys.readouterr()
    logs.set_progress(True)
    compiled = ember.compiler.compile(_inner, backend="eager")
    compiled(torch.randn(4))
    assert "ember:" not in capsys.readouterr().err
