"""Triton kernels built in the background (ember.inductor.background): the first calls run as
aten calls while a worker builds the kernels, then the kernels take over; graphs that write
into tensors or draw random numbers build on their first call instead. On a CPU the
mechanism runs with ``background_compile="always"`` under Triton's interpreter; the GPU
tests (test_triton_cuda.py) run it on CUDA graphs, its default."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import background, cache, compile_graph

pytestmark = pytest.mark.interpreted_triton  # skipped where no interpreter (conftest)

ALWAYS = {"cpu_backend": "triton", "graph_cache": False, "background_compile": "always"}


def fn(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).exp().sum(-1)


def test_first_call_runs_aten_while_the_kernels_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's call is held until the first call has returned: that call ran as aten
    calls (eager's numbers), and the kernels serve once the build is done."""
    x = torch.randn(8, 100)
    compiled = compile_graph(make_fx(fn)(x), [x], ALWAYS)
    assert compiled.in_background
    gate, workers = threading.Event(), []
    build = background._build

    def held(*args: Any) -> None:
        workers.append(threading.current_thread().name)
        assert gate.wait(30)
        build(*args)

    monkeypatch.setattr(background, "_build", held)
    torch.testing.assert_close(compiled(x), fn(x))  # aten calls: the build waits at the gate
    assert compiled._pending is not None and not compiled._pending.done()
    torch.testing.assert_close(compiled(x + 1), fn(x + 1))  # still building: aten again
    gate.set()
    cache.wait_for_builds()
    assert compiled._pending.done() and workers[0].startswith("ember-triton")
    launched = []
    wrapper = compiled._built
    compiled._built = lambda *a: launched.append(1) or wrapper(*a)
    torch.testing.assert_close(compiled(x * 3), fn(x * 3))
    assert launched == [1] and compiled._call is compiled._built and compiled._pending is None


def test_wait_compiled_hands_over_to_the_kernels() -> None:
    x = torch.randn(4, 50)
    compiled = compile_graph(make_fx(fn)(x), [x], ALWAYS)
    compiled(x)
    compiled.wait_compiled()
    assert compiled._call is compiled._built
    torch.testing.assert_close(compiled(x), fn(x))


@pytest.mark.parametrize(
    ("graph", "why"),
    [
        (lambda x: x.add_(1) * 2, "writes into a tensor"),
        (lambda x: torch.rand_like(x) + x, "draws random numbers"),
    ],
)
def test_graphs_that_write_or_draw_build_on_the_first_call(graph: Any, why: str) -> None:
    """A second run on the worker would write into the input again, or move the random
    generator past eager's numbers."""
    x = torch.randn(4, 8)
    gm = make_fx(graph)(x.clone())
    assert why in (background.refusal(gm, "cuda:0", "cuda") or "")
    compiled = compile_graph(gm, [x], ALWAYS)
    assert not compiled.in_background


def test_a_failed_build_is_raised_at_the_next_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A build that raises something other than Triton's errors is a bug of ours: the next
    call raises it (a Triton error would run the graph as aten calls, with a warning)."""
    x = torch.randn(4, 50)
    compiled = compile_graph(make_fx(fn)(x), [x], ALWAYS)

    def broken(*args: Any) -> None:
        raise KeyError("a bug of ours")

    monkeypatch.setattr(background, "_build", broken)
    torch.testing.assert_close(compiled(x), fn(x))
    cache.wait_for_builds()
    with pytest.raises(KeyError, match="a bug of ours"):
        compiled(x)


def test_a_triton_error_runs_the_graph_as_aten_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.inductor import check

    class CompilationError(Exception):
        pass

    CompilationError.__module__ = "triton.compiler.errors"

    def broken(*args: Any) -> None:
        raise CompilationError("ptxas failed")

    x = torch.randn(4, 50)
    compiled = compile_graph(make_fx(fn)(x), [x], ALWAYS)
    monkeypatch.setattr(background, "_build", broken)
    monkeypatch.setattr(check, "enabled", lambda: False)  # as outside the tests
    compiled(x)
    cache.wait_for_builds()
    with pytest.warns(UserWarning, match="failed to build, running eagerly"):
        torch.testing.assert_close(compiled(x), fn(x))
    assert compiled._call == compiled._eager
    torch.testing.assert_close(compiled(x * 2), fn(x * 2))


def test_the_setting_and_its_values() -> None:
    x = torch.randn(4, 50)
    gm = make_fx(fn)(x)
    off = compile_graph(gm, [x], {**ALWAYS, "background_compile": "off"})
    assert not off.in_background
    cuda_only = compile_graph(gm, [x], {**ALWAYS, "background_compile": "cuda"})
    assert not cuda_only.in_background  # CPU tensors under the interpreter
    with pytest.raises(ValueError, match="background_compile='soon'"):
        compile_graph(gm, [x], {**ALWAYS, "background_compile": "soon"})
