"""ember.compiler.set_stance: the five stances, as a call and a context manager, across
threads (issue 17 section 1)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

import ember.compiler
from ember.compiler.testing import assert_same

BACKENDS = ["eager", "aot_eager", "inductor"]


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    ember.compiler.reset()
    ember.compiler.set_stance("default")
    yield
    ember.compiler.set_stance("default")
    ember.compiler.reset()


def double(x: torch.Tensor) -> torch.Tensor:
    return torch.cos(x) * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_force_eager_runs_the_original_code_and_compiles_nothing(backend: str) -> None:
    compiled = ember.compiler.compile(double, backend=backend)
    x = torch.randn(4)
    with ember.compiler.set_stance("force_eager"):
        assert ember.compiler.get_stance() == "force_eager"
        assert_same(compiled(x), double(x))
        assert compiled.stats.graphs == 0
        assert not ember.compiler.is_compiling()
    assert ember.compiler.get_stance() == "default"
    assert_same(compiled(x), double(x))
    assert compiled.stats.graphs == 1


def test_force_eager_bypasses_cached_graphs_too() -> None:
    calls: list[int] = []

    def counting(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> object:
        def run(*args: torch.Tensor) -> object:
            calls.append(1)
            return gm.forward(*args)

        return run

    compiled = ember.compiler.compile(double, backend=counting)
    x = torch.randn(4)
    compiled(x)
    assert len(calls) == 1
    ember.compiler.set_stance("force_eager")  # as a call: holds until changed
    assert_same(compiled(x), double(x))
    assert len(calls) == 1
    ember.compiler.set_stance("default")
    compiled(x)
    assert len(calls) == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_eager_on_recompile_serves_cached_graphs_and_compiles_nothing_new(backend: str) -> None:
    compiled = ember.compiler.compile(double, backend=backend)
    small, big = torch.randn(3), torch.randn(5)
    compiled(small)
    with ember.compiler.set_stance("eager_on_recompile"):
        for x in (small, big, big, small):
            assert_same(compiled(x), double(x))
        assert compiled.stats.graphs == 1
        fresh = ember.compiler.compile(lambda x: x.sin() + 1, backend=backend)
        assert_same(fresh(big), big.sin() + 1)
        assert fresh.stats.graphs == 0
    compiled(big)
    assert compiled.stats.graphs == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_fail_on_recompile_raises_naming_the_guard_that_failed(backend: str) -> None:
    compiled = ember.compiler.compile(double, backend=backend)
    small = torch.randn(3)
    compiled(small)
    with ember.compiler.set_stance("fail_on_recompile"):
        assert_same(compiled(small), double(small))  # a hit is fine
        with pytest.raises(ember.compiler.RecompileError, match=r"double .*size\[0\]"):
            compiled(torch.randn(5))
    assert compiled.stats.graphs == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_eager_then_compile_runs_eagerly_first_then_compiles(backend: str) -> None:
    compiled = ember.compiler.compile(double, backend=backend)
    x = torch.randn(4)
    with ember.compiler.set_stance("eager_then_compile"):
        assert_same(compiled(x), double(x))
        assert compiled.stats.graphs == 0
        assert_same(compiled(x), double(x))
        assert compiled.stats.graphs == 1


def test_an_unknown_stance_is_an_error_listing_the_stances() -> None:
    with pytest.raises(ValueError, match=r"unknown stance 'lazy'.*eager_then_compile"):
        ember.compiler.set_stance("lazy")
    assert ember.compiler.get_stance() == "default"


def test_a_stance_set_in_one_thread_holds_for_all_and_switching_is_safe() -> None:
    compiled = ember.compiler.compile(double, backend="eager")
    x = torch.randn(8)
    want = double(x)
    compiled(x)
    errors: list[BaseException] = []
    stop = threading.Event()

    def caller() -> None:
        try:
            while not stop.is_set():
                assert_same(compiled(x), want)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=caller) for _ in range(3)]
    for t in threads:
        t.start()
    for stance in ["force_eager", "eager_on_recompile", "default"] * 20:
        ember.compiler.set_stance(stance)
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    assert compiled.stats.graphs == 1  # every switch kept the one cached graph

    seen: list[str] = []
    with ember.compiler.set_stance("force_eager"):
        other = threading.Thread(target=lambda: seen.append(ember.compiler.get_stance()))
        other.start()
        other.join()
        runs = ember.compiler.compile(double, backend="eager")
        thread = threading.Thread(target=runs, args=(x,))
        thread.start()
        thread.join()
    assert seen == ["force_eager"] and runs.stats.graphs == 0
