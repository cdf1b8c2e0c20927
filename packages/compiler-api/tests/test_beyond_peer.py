"""Programs where ``torch.compile`` itself differs from eager, and ember must not.

Each case is one that the peer gets wrong in some form (a ``yield from`` return value, a
generator's ``finally`` order, the inference-ness of outputs made under
``torch.inference_mode``, how often a ``__torch_function__`` handler runs). ember is held to
eager's answer on every backend, on the first call (the one that compiles) and on later ones.
"""

from __future__ import annotations

import pytest
import torch

import ember.compiler

BACKENDS = ["eager", "aot_eager", "inductor"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_yield_from_returns_the_subgenerators_value(backend):
    def f(x):
        def inner():
            yield x + 1
            return x * 3

        def outer():
            got = yield from inner()
            yield got - 1

        return list(outer())

    compiled = ember.compiler.compile(f, backend=backend)
    for _ in range(2):
        got, want = compiled(torch.ones(2)), f(torch.ones(2))
        assert [t.tolist() for t in got] == [t.tolist() for t in want] == [[2.0, 2.0], [2.0, 2.0]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_generator_finally_runs_when_the_loop_breaks_in_eagers_order(backend):
    def f(x):
        log = []

        def gen():
            try:
                yield x + 1
                yield x + 2
            finally:
                log.append("finally")

        for value in gen():
            log.append("body")
            x = value
            break
        log.append("after")
        return x, log

    compiled = ember.compiler.compile(f, backend=backend)
    for _ in range(2):
        got, want = compiled(torch.ones(2)), f(torch.ones(2))
        assert got[1] == want[1] == ["body", "finally", "after"]
        assert torch.equal(got[0], want[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_made_under_inference_mode_are_inference_tensors(backend):
    def f(x):
        with torch.inference_mode():
            y = x * 2
        z = x + 1
        return y, z

    compiled = ember.compiler.compile(f, backend=backend)
    for _ in range(2):
        got, want = compiled(torch.ones(2)), f(torch.ones(2))
        assert [t.is_inference() for t in got] == [t.is_inference() for t in want] == [True, False]
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


class Counted(torch.Tensor):
    """A subclass whose ``__torch_function__`` logs every torch function it sees."""

    log: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.log.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_function_handler_runs_as_often_as_in_eager(backend):
    def f(x):
        return (x + 1) * 2

    x = torch.ones(2).as_subclass(Counted)
    Counted.log.clear()
    want = f(x)
    eager_log = list(Counted.log)
    compiled = ember.compiler.compile(f, backend=backend)
    for _ in range(3):
        Counted.log.clear()
        got = compiled(x)
        assert Counted.log == eager_log
        assert type(got) is type(want) is Counted
        assert torch.equal(got, want)
