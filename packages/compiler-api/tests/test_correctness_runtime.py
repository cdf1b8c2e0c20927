"""Run-time correctness (issue 16): threads, reset, torch's own compiler, training steps,
bad options and backends, leaks, internal errors; each against eager, on every backend."""

from __future__ import annotations

import gc
import logging
import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._subclasses import FakeTensorMode

import ember.compiler
from ember.capture import codegen, frame_compiler, hook
from ember.compiler.testing import assert_same, outcome

BACKENDS = ["eager", "aot_eager", "inductor"]


def in_threads(n: int, body: Callable[[int], None]) -> list[str]:
    """Run ``body(i)`` on ``n`` threads started together; the tracebacks of what raised."""
    errors: list[str] = []
    start = threading.Barrier(n)

    def run(i: int) -> None:
        start.wait()
        try:
            body(i)
        except BaseException:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


# -- threads and reset -----------------------------------------------------------------------------


def looped(x: torch.Tensor) -> torch.Tensor:
    for i in range(3):
        x = x.sin() + i
        print("", end="")  # a graph break on every turn: prefixes and resume functions
        x = x * 2
    return x


@pytest.mark.parametrize("backend", BACKENDS)
def test_reset_from_another_thread_while_calls_run(backend: str) -> None:
    compiled = ember.compiler.compile(looped, backend=backend)
    done = threading.Event()
    inputs = [torch.randn(4) for _ in range(25)]

    def body(i: int) -> None:
        if i == 1:
            while not done.is_set():
                ember.compiler.reset()
            return
        try:
            for x in inputs:
                torch.testing.assert_close(compiled(x), looped(x))
        finally:
            done.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: the races are narrow
    try:
        assert in_threads(2, body) == []
    finally:
        sys.setswitchinterval(interval)
    assert all(f.category != "internal" for f in compiled.stats.failures)


def mlp_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (torch.sin(x) * 2 + y).relu().sum(0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_missing_together_compile_once(backend: str) -> None:
    compiled = ember.compiler.compile(mlp_step, backend=backend)
    xs = [(torch.randn(4, 3), torch.randn(3)) for _ in range(4)]

    def body(i: int) -> None:
        for _ in range(5):
            torch.testing.assert_close(compiled(*xs[i]), mlp_step(*xs[i]))

    assert in_threads(4, body) == []
    assert compiled.stats.graphs == 1 and compiled.stats.failures == []


# -- torch's own compiler, called inside and around ember ------------------------------------------


@torch.compile(backend="eager")
def peer_inner(x: torch.Tensor) -> torch.Tensor:
    return x.sin() + 1


def calls_the_peer(x: torch.Tensor) -> torch.Tensor:
    return peer_inner(x * 2) * 3


def ours_only(compiled: Any) -> None:
    """ember compiled only this file's frames, never the peer's or code it generated."""
    for c in compiled.stats.compiled:
        assert __file__ in c.code, c.code


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_torch_compiled_function_inside_an_ember_compiled_one(backend: str) -> None:
    compiled = ember.compiler.compile(calls_the_peer, backend=backend)
    for _ in range(2):
        x = torch.randn(5)
        torch.testing.assert_close(compiled(x), calls_the_peer(x))
    assert compiled.stats.failures == []
    ours_only(compiled)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_ember_compiled_function_inside_a_torch_compiled_one(backend: str) -> None:
    def inner(x: torch.Tensor) -> torch.Tensor:
        return x.cos() * 2

    ours = ember.compiler.compile(inner, backend=backend)
    outer = torch.compile(lambda x: ours(x + 1) - 1, backend="eager")
    x = torch.randn(4)
    torch.testing.assert_close(outer(x), inner(x + 1) - 1)
    ours_only(ours)
    torch.testing.assert_close(ours(x), inner(x))  # and ember still compiles it alone


# -- a training step -------------------------------------------------------------------------------


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> Any:
    loss = model(x).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def model_and_optimizer(kind: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt: torch.optim.Optimizer = (
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if kind == "sgd"
        else torch.optim.Adam(model.parameters(), lr=0.01)
    )
    return model, opt


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_compiled_training_step_matches_eager_after_three_steps(backend: str, kind: str) -> None:
    model, opt = model_and_optimizer(kind)
    theirs, their_opt = model_and_optimizer(kind)
    step = ember.compiler.compile(train_step, backend=backend)
    for _ in range(3):
        x = torch.randn(3, 4)
        torch.testing.assert_close(step(model, opt, x), train_step(theirs, their_opt, x))
    for p, q in zip(model.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(p, q)
        assert p.grad is None and q.grad is None  # zero_grad sets them to None
    for state, their_state in zip(opt.state.values(), their_opt.state.values(), strict=True):
        assert_same(state, their_state)
    assert all(f.category != "internal" for f in step.stats.failures), step.stats.failures
    assert step.stats.graphs >= 1
    assert step.stats.breaks, "the optimizer step runs natively, with a recorded reason"


# -- options and backends checked at compile() -----------------------------------------------------


def plus_one(x: torch.Tensor) -> torch.Tensor:
    return x.sin() + 1


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"options": {"cxx": "/nonexistent/c++"}}, ValueError, "'cxx'"),
        ({"options": ["cxx"]}, TypeError, "options must be a dict"),
        ({"options": {"device": "triton"}}, ValueError, "'device'"),
        ({"options": {"graph_cache": "yes"}}, ValueError, "'graph_cache'"),
        ({"options": {"cflags": "-O2"}}, ValueError, "'cflags'"),
        ({"options": {1: True}}, TypeError, "option names"),
        ({"backend": "no-such-backend"}, ValueError, "'no-such-backend'"),
        ({"backend": 42}, TypeError, "backend must be"),
        ({"backend": "eager", "options": {"cxx": "g++"}}, TypeError, "'eager' takes no options"),
        ({"mode": "fastest"}, ValueError, "'fastest'"),
        ({"fullgraph": "yes"}, TypeError, "fullgraph"),
    ],
)
def test_bad_options_are_clear_errors_at_compile(kwargs: Any, error: type, names: str) -> None:
    with pytest.raises(error, match=names):
        ember.compiler.compile(plus_one, **kwargs)


def returns_a_number(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    return 3


def returns_too_many(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    return lambda *args: (args[0], args[0])


def test_a_backend_returning_a_non_callable_is_a_fallback_naming_it() -> None:
    compiled = ember.compiler.compile(plus_one, backend=returns_a_number)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), plus_one(x))
    [failure] = compiled.stats.failures
    assert failure.category == "backend" and "returns_a_number" in failure.reason
    assert "not callable" in failure.reason and __file__ in failure.location
    ember.compiler.reset()  # the failure left the code to run eagerly for good
    strict = ember.compiler.compile(plus_one, backend=returns_a_number, fullgraph=True)
    with pytest.raises(ember.compiler.FullGraphError, match="returns_a_number"):
        strict(x)


def test_a_backend_returning_the_wrong_number_of_outputs_is_an_error_naming_it() -> None:
    compiled = ember.compiler.compile(plus_one, backend=returns_too_many)
    with pytest.raises(RuntimeError, match=r"returns_too_many.*1 outputs.*returned 2"):
        compiled(torch.randn(3))


# -- leaks and lost work ---------------------------------------------------------------------------


def closure_over(t: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * t + 1

    return scaled


@pytest.mark.parametrize("backend", BACKENDS)
def test_dead_closures_free_their_entries_and_tensors(backend: str) -> None:
    code = closure_over(None).__code__
    held = []
    for _ in range(3):
        t = torch.randn(3)
        held.append(weakref.ref(t))
        fn = closure_over(t)
        compiled = ember.compiler.compile(fn, backend=backend)
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x), fn(x))
        del t, fn, compiled
    gc.collect()
    assert [ref() for ref in held] == [None, None, None]
    assert hook.entries(code) == []


def test_new_closures_compile_after_eight_dead_ones_and_live_ones_stay_right() -> None:
    x = torch.randn(3)
    for i in range(12):  # each dies before the next is made
        fn = closure_over(torch.full((3,), float(i)))
        compiled = ember.compiler.compile(fn, backend="eager")
        torch.testing.assert_close(compiled(x), fn(x))
        assert compiled.stats.graphs == 1, i
        del fn, compiled
        gc.collect()
    live = [closure_over(torch.full((3,), float(i))) for i in range(12)]
    for fn in live:  # more live closures than the cache holds: right, compiled or not
        torch.testing.assert_close(ember.compiler.compile(fn, backend="eager")(x), fn(x))


def no_tensors_at_first(a: Any, *rest: Any, k: int = 1, **kw: Any) -> Any:
    return a * k + sum(rest) + kw.get("z", 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_frame_first_called_without_tensors_compiles_when_tensors_come(backend: str) -> None:
    compiled = ember.compiler.compile(no_tensors_at_first, backend=backend)
    assert compiled(1, 2, k=3, z=4) == no_tensors_at_first(1, 2, k=3, z=4) == 9
    assert compiled.stats.graphs == 0
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x, 2, k=3, z=4), no_tensors_at_first(x, 2, k=3, z=4))
    assert compiled.stats.graphs == 1
    assert compiled(5, k=3) == 15  # numbers again: the frame's own code, natively


# -- internal errors and user errors ---------------------------------------------------------------


def broken(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a bug planted in ember")


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_internal_error_is_a_recorded_fallback(backend: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(codegen, "generate", broken)
    compiled = ember.compiler.compile(plus_one, backend=backend)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), plus_one(x))
    [failure] = compiled.stats.failures
    assert failure.category == "internal" and "a bug planted" in failure.reason
    ember.compiler.reset()  # the failure left the code to run eagerly for good
    strict = ember.compiler.compile(plus_one, backend=backend, fullgraph=True)
    with pytest.raises(ember.compiler.FullGraphError, match="a bug planted") as caught:
        strict(x)
    assert __file__ in str(caught.value)


def test_an_internal_error_in_the_cache_policy_is_a_recorded_fallback(monkeypatch: Any) -> None:
    monkeypatch.setattr(frame_compiler.CodeCache, "on_miss", broken)
    compiled = ember.compiler.compile(plus_one, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), plus_one(x))
    assert [f.category for f in compiled.stats.failures] == ["internal"]


def raises_after_tensor_work(x: torch.Tensor, n: int) -> torch.Tensor:
    y = x.sin() * 2
    if n > 1:
        raise ValueError(f"n is {n}")
    return y @ torch.ones(5, 2)  # a size error from torch when x has 4 columns


def same_outcome(compiled: Any, fn: Any, *args: Any) -> None:
    got, want = outcome(compiled, *args), outcome(fn, *args)
    assert got[0] == want[0], (got, want)
    assert_same(got[1], want[1])  # (type, message) of an exception, or the value


@pytest.mark.parametrize("backend", BACKENDS)
def test_user_errors_propagate_unchanged_also_from_threads(backend: str) -> None:
    compiled = ember.compiler.compile(raises_after_tensor_work, backend=backend)
    cases = [(torch.randn(3, 5), 1), (torch.randn(3, 5), 2), (torch.randn(3, 4), 1)]
    for args in cases:
        same_outcome(compiled, raises_after_tensor_work, *args)
    errors = in_threads(3, lambda i: same_outcome(compiled, raises_after_tensor_work, *cases[i]))
    assert errors == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_op_eager_refuses_raises_eagers_error_and_logs_nothing(backend: str) -> None:
    """Fake tensors log a traceback to stderr when an op's shape check fails; ember runs the
    frame eagerly, which raises eager's error, so that log was a second, alarming copy."""

    class Records(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.seen.append(record.getMessage())

    def f(a, b):
        return (a @ b).sin()

    records, logger = Records(), logging.getLogger("torch._subclasses.fake_tensor")
    logger.addHandler(records)
    try:
        compiled = ember.compiler.compile(f, backend=backend)
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            compiled(torch.ones(5, 3), torch.ones(6, 3))
        assert records.seen == []
        with FakeTensorMode(), pytest.raises(RuntimeError):  # outside ember: torch's log
            torch.ones(5, 3) @ torch.ones(6, 3)
        assert len(records.seen) == 1, records.seen  # the handler does see such records
    finally:
        logger.removeHandler(records)
    assert compiled(torch.ones(5, 3), torch.ones(3, 6)).shape == (5, 6)  # then it compiles
