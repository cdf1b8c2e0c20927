"""Skip decisions belong to the compiled callable that made them (issue 16).

When one callable fails on a frame (its backend refused the graph, or the frame cannot be
captured) it runs that code eagerly from then on, but only for itself: another callable of
the same function, with another backend, options or ``fullgraph=True``, still compiles it,
records its own reason or raises. Trace-rule skips (modules CPython runs) stay global,
except for a callable's own entry code. Each case is checked against eager.
"""

from __future__ import annotations

import sys
import threading
import traceback
import types
from typing import Any

import pytest
import torch

import ember.compiler
import ember.guards
from ember.capture import hook, trace_rules
from ember.compiler.testing import assert_same

BACKENDS = ["eager", "aot_eager", "inductor"]


def refusing(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
    """A backend that refuses every graph (as one may refuse an op it lacks)."""
    raise RuntimeError("this backend takes no graph")


def also_refusing(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
    raise RuntimeError("nor does this one")


def body(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2 + 1


class Ctx:
    def __enter__(self) -> Ctx:
        return self

    def __exit__(self, *exc: object) -> bool:
        return False


def uncapturable(x: torch.Tensor) -> torch.Tensor:
    with Ctx():
        y = x.cos()
        print("", end="")  # a break inside a user's with block: no graph break there
        return y + 1


def line_of(fn: Any, text: str) -> int:
    code = fn.__code__
    lines = open(code.co_filename).read().splitlines()
    return next(i + 1 for i in range(code.co_firstlineno - 1, len(lines)) if text in lines[i])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_backend_failure_does_not_stop_another_backend(backend: str) -> None:
    x = torch.randn(5)
    failing = ember.compiler.compile(body, backend=refusing)
    assert_same(failing(x), body(x))
    assert len(failing.stats.failures) == 1 and failing.stats.graphs == 0
    other = ember.compiler.compile(body, backend=backend)
    assert_same(other(x), body(x))
    assert other.stats.graphs == 1 and other.stats.failures == []
    assert_same(other(x), body(x))  # served from its entry, not compiled again
    assert other.stats.graphs == 1
    assert_same(failing(x), body(x))  # still eager for the one that failed, not retried
    assert len(failing.stats.failures) == 1 and failing.stats.graphs == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_fullgraph_raises_after_another_callable_ran_the_frame_eagerly(backend: str) -> None:
    x = torch.randn(4)
    lenient = ember.compiler.compile(uncapturable, backend=backend)
    assert_same(lenient(x), uncapturable(x))
    assert len(lenient.stats.failures) == 1 and lenient.stats.graphs == 0
    strict = ember.compiler.compile(uncapturable, backend=backend, fullgraph=True)
    with pytest.raises(ember.compiler.FullGraphError) as info:
        strict(x)
    where = f'File "{__file__}", line {line_of(uncapturable, "print(")}'
    assert where in str(info.value), str(info.value)
    assert len(strict.stats.failures) == 1
    assert_same(lenient(x), uncapturable(x))  # the lenient one still runs it eagerly
    assert len(lenient.stats.failures) == 1


def test_fullgraph_raises_for_its_own_backend_failure_after_another_callable_failed() -> None:
    x = torch.randn(4)
    lenient = ember.compiler.compile(body, backend=refusing)
    assert_same(lenient(x), body(x))
    strict = ember.compiler.compile(body, backend=refusing, fullgraph=True)
    with pytest.raises(ember.compiler.FullGraphError, match="this backend takes no graph") as e:
        strict(x)
    assert f'File "{__file__}"' in str(e.value)


def test_each_callable_records_its_own_reason() -> None:
    x = torch.randn(3)
    first = ember.compiler.compile(body, backend=refusing)
    second = ember.compiler.compile(body, backend=also_refusing)
    assert_same(first(x), body(x))
    assert_same(second(x), body(x))
    assert [("takes no graph" in f.reason) for f in first.stats.failures] == [True]
    assert [("nor does this one" in f.reason) for f in second.stats.failures] == [True]
    # and explain(), a callable of its own, tells the user too
    report = ember.compiler.explain(body)(x)
    assert report.graph_count == 1 and report.eager_frames == 0


def test_the_same_backend_twice_each_callable_learns_why() -> None:
    x = torch.randn(3)
    first = ember.compiler.compile(uncapturable)
    second = ember.compiler.compile(uncapturable)
    for compiled in (first, second, first, second):
        assert_same(compiled(x), uncapturable(x))
    assert len(first.stats.failures) == 1 and len(second.stats.failures) == 1
    report = ember.compiler.explain(uncapturable)(x)  # explain() learns it too
    assert report.eager_frames == 1 and report.graph_count == 0


def test_explain_leaves_no_skip_behind() -> None:
    x = torch.randn(3)
    report = ember.compiler.explain(uncapturable)(x)
    assert report.eager_frames == 1
    strict = ember.compiler.compile(uncapturable, fullgraph=True)
    with pytest.raises(ember.compiler.FullGraphError, match="call to builtin print"):
        strict(x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reset_forgets_a_callable_skip(backend: str) -> None:
    x = torch.randn(6)
    failing = ember.compiler.compile(body, backend=refusing)
    failing(x)
    failing(x)
    assert len(failing.stats.failures) == 1  # skipped for it: not tried on every call
    ember.compiler.reset()
    assert_same(failing(x), body(x))
    assert len(failing.stats.failures) == 2  # tried again after reset
    other = ember.compiler.compile(body, backend=backend)
    assert_same(other(x), body(x))
    assert other.stats.graphs == 1


def test_a_failed_callable_keeps_nothing_alive() -> None:
    x = torch.randn(3)
    failing = ember.compiler.compile(body, backend=refusing)
    failing(x)
    assert hook.is_skipped(body.__code__, failing._compiler)
    assert not hook.is_skipped(body.__code__)  # not for every callable
    del failing
    other = ember.compiler.compile(body, backend="eager")
    assert_same(other(x), body(x))
    assert other.stats.graphs == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_one_callable_failing_one_compiling(backend: str) -> None:
    x = torch.randn(8)
    want = body(x)
    failing = ember.compiler.compile(body, backend=refusing)
    working = ember.compiler.compile(body, backend=backend)
    start = threading.Barrier(4)
    errors: list[str] = []

    def run(compiled: Any) -> None:
        start.wait()
        try:
            for _ in range(20):
                assert_same(compiled(x), want)
        except BaseException:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=run, args=(c,)) for c in (failing, working) * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [], errors[0]
    assert working.stats.graphs == 1 and working.stats.failures == []
    assert failing.stats.graphs == 0 and len(failing.stats.failures) == 1


def test_reset_from_another_thread_while_callables_skip_and_compile() -> None:
    x = torch.randn(8)
    want = body(x)
    failing = ember.compiler.compile(body, backend=refusing)
    working = ember.compiler.compile(body, backend="eager")
    stop = threading.Event()
    errors: list[str] = []

    def run(compiled: Any) -> None:
        try:
            while not stop.is_set():
                assert_same(compiled(x), want)
        except BaseException:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=run, args=(c,)) for c in (failing, working)]
    for t in threads:
        t.start()
    for _ in range(5):
        ember.compiler.reset()
        threading.Event().wait(0.02)
    stop.set()
    for t in threads:
        t.join()
    assert errors == [], errors[0]
    # after the last reset each tries the frame once more: a failure, or a graph
    assert_same(failing(x), want)
    assert_same(working(x), want)
    assert len(failing.stats.failures) >= 1 and failing.stats.graphs == 0
    assert working.stats.graphs >= 1 and working.stats.failures == []


def maybe_scaled(x: torch.Tensor, scale: bool) -> torch.Tensor:
    if scale:
        return x * 3
    return x


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_frame_with_no_tensor_op_for_one_callable_is_compiled_by_another(backend: str) -> None:
    x = torch.randn(4)
    plain = ember.compiler.compile(maybe_scaled, backend=refusing)
    assert_same(plain(x, False), maybe_scaled(x, False))
    assert plain.stats.skipped and plain.stats.graphs == 0 and plain.stats.failures == []
    other = ember.compiler.compile(maybe_scaled, backend=backend)
    assert_same(other(x, True), maybe_scaled(x, True))
    assert other.stats.graphs == 1
    assert_same(other(x, False), maybe_scaled(x, False))
    assert other.stats.graphs == 1 and other.stats.failures == []
    assert other.stats.skipped  # its own record of the frame with nothing to compile
    strict = ember.compiler.compile(maybe_scaled, backend=backend, fullgraph=True)
    assert_same(strict(x, True), maybe_scaled(x, True))
    assert strict.stats.graphs == 1  # its own graph, not another callable's entry


def broken(x: torch.Tensor) -> torch.Tensor:
    y = x.sin()
    print("", end="")  # a graph break
    return y + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_fullgraph_never_runs_another_callable_graph_break(backend: str) -> None:
    x = torch.randn(4)
    lenient = ember.compiler.compile(broken, backend=backend)
    assert_same(lenient(x), broken(x))
    assert lenient.stats.graphs == 2 and len(lenient.stats.breaks) == 1
    strict = ember.compiler.compile(broken, backend=backend, fullgraph=True)
    with pytest.raises(ember.compiler.FullGraphError) as info:
        strict(x)
    assert f'File "{__file__}", line {line_of(broken, "print(")}' in str(info.value)
    assert_same(lenient(x), broken(x))
    assert lenient.stats.graphs == 2  # served from its entries


def rule_skipped_module() -> types.ModuleType:
    """A module the trace rules leave to CPython, with a function that does tensor work."""
    module = types.ModuleType("ember_skip_test_lib")
    exec("def inner(x):\n    return x.sin() * 2\n", module.__dict__)
    return module


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_callable_compiles_its_own_entry_code_after_another_rule_skipped_it(
    backend: str,
) -> None:
    lib = rule_skipped_module()
    sys.modules[lib.__name__] = lib  # a module's own globals: the trace rules apply
    trace_rules.set_rule(lib.__name__, "skip", "test: a library ember never traces")
    try:

        def outer(x: torch.Tensor) -> torch.Tensor:
            return lib.inner(x) + 1

        x = torch.randn(5)
        first = ember.compiler.compile(outer, backend=backend)
        assert_same(first(x), outer(x))
        assert len(first.stats.breaks) == 1  # at the call: inner runs natively, not compiled
        assert not any("inner" in c.code for c in first.stats.compiled)
        direct = ember.compiler.compile(lib.inner, backend=backend, fullgraph=True)
        assert_same(direct(x), lib.inner(x))
        assert direct.stats.graphs == 1
        later = ember.compiler.compile(outer, backend=backend)  # the rule still holds
        assert_same(later(x), outer(x))
        assert not any("inner" in c.code for c in later.stats.compiled)
    finally:
        trace_rules.remove_rule(lib.__name__)
        del sys.modules[lib.__name__]


def sized(x: torch.Tensor) -> torch.Tensor:
    return x.cos() + 1


def test_a_full_cache_is_a_recorded_reason_for_the_callable_that_meets_it() -> None:
    compiled = ember.compiler.compile(sized, backend="eager", dynamic=False)
    with pytest.warns(ember.guards.CacheLimitWarning):
        for n in range(1, 11):  # the default cache_size_limit is 8: the last two run eagerly
            x = torch.randn(n)
            assert_same(compiled(x), sized(x))
    assert compiled.stats.graphs == 8
    assert [f.category for f in compiled.stats.failures] == ["cache_limit"]  # said once
    assert "cache_size_limit (8) reached" in compiled.stats.failures[0].reason


def test_a_full_cache_is_a_fullgraph_error_naming_the_function() -> None:
    lenient = ember.compiler.compile(sized, backend="eager", dynamic=False)
    with pytest.warns(ember.guards.CacheLimitWarning):
        for n in range(1, 10):  # fills the code's cache (every callable's entries count)
            lenient(torch.randn(n))
    strict = ember.compiler.compile(sized, backend="eager", fullgraph=True, dynamic=False)
    x = torch.randn(3)
    with pytest.raises(ember.compiler.FullGraphError, match="cache_size_limit") as info:
        strict(x)
    assert f'File "{__file__}", line {sized.__code__.co_firstlineno}' in str(info.value)
    assert_same(lenient(x), sized(x))  # served from its entry
