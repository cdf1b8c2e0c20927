"""CompilationProfiler: breaks and recompilations of real runs, grouped and counted."""

from __future__ import annotations

import pytest
import torch

import ember.compiler
from ember.compiler import CompilationProfiler

BACKENDS = ["eager", "aot_eager", "inductor"]


def _line_of(marker: str) -> int:
    with open(__file__) as fh:
        return next(i for i, line in enumerate(fh, 1) if line.rstrip().endswith(marker))


def scaled(x, k):
    y = x.sin()
    return y * k  # MARK-scale


def _run(fn, calls):
    for args in calls:
        torch.testing.assert_close(fn(*args), fn.__wrapped__(*args))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_recompiling_function_shows_the_failing_guard_and_its_line(backend):
    prof = CompilationProfiler(backend)
    fn = ember.compiler.compile(scaled, backend=prof)
    # one graph; then two misses on x's size and three on k's value (k is checked first)
    calls = [(torch.ones(4), 2), (torch.ones(5), 2), (torch.ones(6), 2)]
    calls += [(torch.ones(4), 3), (torch.ones(5), 4), (torch.ones(4), 5)]
    _run(fn, calls)
    report = prof.report()
    assert report.graphs == 1 and report.recompile_count == 5  # cache limit 1: no 2nd graph
    by_guard = {g.guard: g for g in report.recompiles}
    assert set(by_guard) == {"TENSOR_MATCH x", "EQUALS k"}
    assert [g.count for g in report.recompiles] == [3, 2]  # most frequent first
    size, value = by_guard["TENSOR_MATCH x"], by_guard["EQUALS k"]
    assert size.last_failure == "x: size[0] expected 4, got 6"
    assert value.last_failure == "k: expected 2, got 5"
    line = _line_of("# MARK-scale")
    assert value.where == f"{__file__}:{line}" and value.source.startswith("return y * k")
    assert size.where == f"{__file__}:{line - 1}" and size.source == "y = x.sin()"
    text = str(report)
    assert "recompilations: 5" in text and "3x  scaled (" in text
    assert f"guard set at {__file__}:{line}: return y * k" in text


def _helper(x):
    x = x + 1
    ember.compiler.graph_break()  # MARK-break
    return x * 2


def twice(x):
    return _helper(_helper(x.sin()))


def in_try(x):
    try:
        print("in a try block")  # MARK-try
    finally:
        x = x + 1
    return x


@pytest.mark.parametrize("backend", BACKENDS)
def test_breaks_are_grouped_with_counts(backend, capsys):
    prof = CompilationProfiler(backend)
    fn, other = (
        ember.compiler.compile(twice, backend=prof),
        ember.compiler.compile(in_try, backend=prof),
    )
    x = torch.randn(3)
    for _ in range(3):
        _run(fn, [(x,)])
        _run(other, [(x,)])
    report = prof.report()
    breaks = [g for g in report.breaks if not g.eager]
    (eager,) = [g for g in report.breaks if g.eager]
    # twice's frame breaks at each _helper call, and _helper's own frame once: one line,
    # three breaks (later calls hit the cache and add none)
    assert [(g.reason.lineno, g.reason.category, g.count) for g in breaks] == [
        (_line_of("# MARK-break"), "graph-break", 3)
    ]
    assert report.graph_break_count == 3
    assert (eager.reason.lineno, eager.count) == (_line_of("# MARK-try"), 1)
    assert "try block" in eager.reason.reason
    text = str(report)
    assert "graph breaks: 3; frames run eagerly: 1; recompilations: 0" in text
    assert f"3x  graph_break() called [graph-break]\n      {__file__}:" in text
    assert "Frames run eagerly, most frequent first:\n  1x  " in text
    assert "No recompilations" in text


def test_entries_of_other_backends_are_not_the_profilers():
    plain = ember.compiler.compile(scaled, backend="eager")
    _run(plain, [(torch.ones(4), 2)])
    prof = CompilationProfiler()
    fn = ember.compiler.compile(scaled, backend=prof)
    _run(fn, [(torch.ones(4), 2), (torch.ones(4), 2)])
    report = prof.report()
    assert (report.graphs, report.recompile_count) == (1, 0)
    _run(plain, [(torch.ones(7), 2)])  # the eager compile still recompiles as usual
    assert plain.stats.graphs == 2 and prof.report().recompile_count == 0


def _make(k):
    def times_k(x):
        return x * k

    return times_k


def test_a_new_closure_of_the_same_code_is_a_recompilation():
    prof = CompilationProfiler()
    first, second = (
        ember.compiler.compile(_make(2), backend=prof),
        ember.compiler.compile(_make(3), backend=prof),
    )
    x = torch.ones(3)
    _run(first, [(x,)])
    _run(second, [(x,), (x,)])  # each call runs eagerly: the code has its one graph
    (group,) = prof.report().recompiles
    assert (group.guard, group.count, group.where) == ("CLOSURE", 2, None)
    assert "another closure" in str(group) and "guard set at" not in str(group)


def test_an_empty_report_reads():
    text = str(CompilationProfiler().report())
    assert text.splitlines() == [
        "Graphs: 0 (0 ops); graph breaks: 0; frames run eagerly: 0; recompilations: 0",
        "No graph breaks.",
        "No recompilations (as if cache_size_limit were 1).",
    ]
