"""Symbolic sizes (issue 18): one C++ build serves every size.

Graphs are traced with ``make_fx(tracing_mode="symbolic")`` at one size, compiled once,
and called at many sizes (odd ones, primes, sizes that are not a multiple of any vector
width), each result compared with eager; builds are counted at ``cache.build_async``.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import cache, compile_graph, decompositions
from ember.inductor.scheduler import Kernel
from ember.inductor.symbolic import size_vars

SIZES = [2, 3, 5, 7, 8, 13, 16, 17, 31, 37, 40]


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The sources of the C++ builds started while the test runs."""
    started: list[str] = []
    real = cache.build_async

    def counted(source: str, options: Any) -> Any:
        started.append(source)
        return real(source, options)

    monkeypatch.setattr(cache, "build_async", counted)
    yield started


def trace(fn: Callable[..., Any], *args: Any) -> torch.fx.GraphModule:
    return make_fx(fn, tracing_mode="symbolic", decomposition_table=decompositions())(*args)


def _shape_env(gm: torch.fx.GraphModule) -> Any:
    for node in gm.graph.find_nodes(op="placeholder"):
        for n in getattr(node.meta.get("val"), "shape", ()):
            if isinstance(n, torch.SymInt):
                return n.node.shape_env
    raise AssertionError("no symbolic size")


def compiled(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn`` traced symbolically at ``args`` and compiled; no fallback warning allowed, and
    no guard added to the ShapeEnv (a guard would mean a size was specialised)."""
    gm = trace(fn, *args)
    env = _shape_env(gm)
    guards = len(env.guards)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = compile_graph(gm, list(args), {"graph_cache": 0})
    assert len(env.guards) == guards, env.guards[guards:]
    return out


def mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return F.gelu(x @ w1 + b1) @ w2


def block(x: torch.Tensor, w: torch.Tensor) -> Any:
    h = F.layer_norm(x, x.shape[-1:])
    att = torch.softmax(h @ h.transpose(-1, -2) / x.size(-1) ** 0.5, -1)
    return (att @ h) @ w + x, h.mean(-1), (x * x.size(0)).amax(0)


def slices(x: torch.Tensor) -> Any:
    q, k, v = x.chunk(3, -1)  # slices of a symbolic dimension (x: [n, 3m])
    both = torch.cat([q, k * 2], -1)  # along a symbolic dimension
    rows = torch.cat([x, x[1:]], 0)  # along the batch
    return F.pad(both, (1, 2)).exp(), rows.sum(0), (q @ v.t()).softmax(-1)


def views(x: torch.Tensor) -> Any:
    t = x.t().contiguous()  # a transpose through a kernel
    flat = x.reshape(-1)
    return t.exp(), flat.view(x.size(0), -1).sum(1), x.unsqueeze(1).expand(-1, 3, -1).relu()


def pointwise(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x * 2 + y.sigmoid()).tanh()


def reductions(x: torch.Tensor) -> Any:
    return x.sum(0), x.amax(-1), x.mean(), x.var(-1)


def mlp_inputs(n: int) -> tuple[torch.Tensor, ...]:
    return torch.randn(n, 6), torch.randn(6, 9), torch.randn(9), torch.randn(9, 4)


def rnn_cell(x: torch.Tensor, h: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
    """``nn.RNNCell``: two ``addmm``s whose biases fuse into the sum's kernel."""
    w, b, u, c = weights
    return torch.tanh(F.linear(x, w, b) + F.linear(h, u, c))


def rnn_inputs(n: int) -> tuple[torch.Tensor, ...]:
    x, h = torch.randn(n, 5), torch.randn(n, 8)
    return x, h, torch.randn(8, 5), torch.randn(8), torch.randn(8, 8), torch.randn(8)


CASES: list[tuple[str, Callable[..., Any], Callable[[int], tuple[Any, ...]]]] = [
    ("pointwise", pointwise, lambda n: (torch.randn(n, 7), torch.randn(7))),
    ("reductions", reductions, lambda n: (torch.randn(n, n + 1),)),
    ("mlp", mlp, mlp_inputs),
    ("block", block, lambda n: (torch.randn(n, n + 3), torch.randn(n + 3, n + 3))),
    ("views", views, lambda n: (torch.randn(n, n + 2),)),
    ("slices", slices, lambda n: (torch.randn(n, 3 * n + 3),)),
    ("softmax_rows", lambda x: torch.softmax(x, -1), lambda n: (torch.randn(3, n),)),
    ("column_sums", lambda x: (x * 2).sum(0), lambda n: (torch.randn(n + 5, n),)),
    ("rnn_cell", rnn_cell, rnn_inputs),
]  # fmt: skip


@pytest.mark.parametrize(("name", "fn", "make"), CASES, ids=[c[0] for c in CASES])
def test_one_build_serves_every_size(
    name: str, fn: Callable[..., Any], make: Callable[[int], Any], builds: list[str]
) -> None:
    c = compiled(fn, *make(10))  # no size equal to another (the trace would tie them)
    for n in SIZES:
        args = make(n)
        torch.testing.assert_close(c(*args), fn(*args), msg=f"{name} n={n}")
    assert len(builds) == 1, f"{len(builds)} builds"
    assert c.source is not None and "const int64_t ks" in c.source  # sizes are arguments


def test_vector_tails_of_every_length(builds: list[str]) -> None:
    """The innermost loop's length runs through every remainder of the vector widths."""

    def fn(x: torch.Tensor, y: torch.Tensor) -> Any:
        return (x * y + 1).relu(), (x * y).sum(-1), F.layer_norm(x, x.shape[-1:])

    c = compiled(fn, torch.randn(3, 20), torch.randn(3, 20))
    for n in range(2, 41):
        x, y = torch.randn(3, n), torch.randn(3, n)
        torch.testing.assert_close(c(x, y), fn(x, y), msg=f"n={n}")
    assert len(builds) == 1


def test_threads_are_chosen_per_call(builds: list[str]) -> None:
    """Traced small, called large: each kernel chooses per call by its work whether to run
    on threads (a ranged kernel shares its outer points out, a whole reduction has a
    parallel version), so the large calls run on threads, with the same values."""

    def fn(x: torch.Tensor) -> Any:
        return (x * 2).sum(0), torch.softmax(x, -1), F.layer_norm(x, x.shape[-1:]), x.sum()

    c = compiled(fn, torch.randn(5, 3))
    assert c.source is not None and re.search(r"if \(.* >= \d+\) kernel\d+_p\(", c.source)
    assert re.search(r"if \(.* < \d+ \|\| n < 2\) \{ kernel\d+_r\(", c.source)
    for rows, cols in [(517, 300), (3, 70001), (1031, 129)]:
        x = torch.randn(rows, cols)
        # sums of 1e5 floats in another order (threads): float32 rounding, not 1e-5
        torch.testing.assert_close(c(x), fn(x), rtol=1e-4, atol=5e-3, msg=f"{rows}x{cols}")
    assert len(builds) == 1


def test_int_input_as_a_size(builds: list[str]) -> None:
    def fn(x: torch.Tensor, w: torch.Tensor, n: int) -> Any:
        return (x.view(-1, n) @ w).relu() * x.size(0)

    x, w = torch.randn(12), torch.randn(3, 5)
    gm = trace(fn, x, w, 3)
    examples = [x, w, *[n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")][2:]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = compile_graph(gm, examples, {"graph_cache": 0})
    for rows in (2, 5, 7):
        x = torch.randn(rows * 3)
        torch.testing.assert_close(c(x, w, 3), fn(x, w, 3))


def test_backward_graph(builds: list[str]) -> None:
    """A training step's gradients, traced through autograd at one size."""

    def grads(x: torch.Tensor, w: torch.Tensor) -> Any:
        x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
        loss = (F.gelu(x @ w).softmax(-1) * x.size(0)).sum()
        return torch.autograd.grad(loss, [x, w])

    c = compiled(grads, torch.randn(6, 5), torch.randn(5, 4))
    for n in SIZES:
        x, w = torch.randn(n, 5), torch.randn(5, 4)
        torch.testing.assert_close(c(x, w), grads(x, w), atol=1e-4, rtol=1e-4, msg=f"n={n}")
    assert len(builds) == 1


def test_unlowered_ops_run_as_aten_calls() -> None:
    """Ops not yet checked on symbolic sizes (gather, cumsum, index_select) run as aten
    calls: right values at every size, never a specialised kernel."""

    def fn(x: torch.Tensor, i: torch.Tensor) -> Any:
        y = torch.cumsum(x.exp(), 0)
        return torch.gather(y, 1, i).relu(), torch.index_select(x, 1, i[0]) * 2

    c = compiled(fn, torch.randn(5, 4), torch.randint(0, 4, (5, 2)))
    externs = {str(s.target) for s in c.schedule.steps if not hasattr(s, "stages")}
    assert {"aten.cumsum.default", "aten.gather.default"} <= externs, externs
    for n in SIZES:
        x, i = torch.randn(n, 4), torch.randint(0, 4, (n, 2))
        torch.testing.assert_close(c(x, i), fn(x, i))


def test_views_of_aten_results_read_their_real_strides() -> None:
    """Position ids as GPT-2 makes them: a slice (an aten call) of an expanded range. The
    fake value's strides (0, 1) are eager's, not those of the compact buffer the kernels
    wrote; the wrapper checks each extern result's strides rather than trusting them."""

    def fn(x: torch.Tensor) -> Any:
        pos = torch.arange(x.size(1)).unsqueeze(0).expand(x.size(0), -1)
        return x + pos[:, 1:].float().sum(-1, keepdim=True), pos[:, :1] * 2

    c = compiled(fn, torch.randn(5, 7))
    for n in SIZES:
        x = torch.randn(n, n + 1)
        torch.testing.assert_close(c(x), fn(x))


def test_a_wrong_size_is_refused_not_computed() -> None:
    """Sizes the graph was traced as equal (``x.size(1) == y.size(0)``) come from one input;
    an input that breaks the relation raises instead of reading out of bounds."""
    c = compiled(lambda x, y: x + y, torch.randn(4, 6), torch.randn(6))
    with pytest.raises((ValueError, RuntimeError)):
        c(torch.randn(3, 5), torch.randn(9))


def test_graph_cache_keys_on_the_symbolic_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """The second compile of the same symbolic graph, at another example size, is a graph
    cache hit (no lowering), and serves every size."""
    fn = lambda x: (x.exp() + 1).sum(-1)  # noqa: E731
    first = compile_graph(trace(fn, torch.randn(5, 3)), [torch.randn(5, 3)], {"graph_cache": 1})
    first(torch.randn(5, 3))  # the record is written after the build
    second = compile_graph(trace(fn, torch.randn(9, 4)), [torch.randn(9, 4)], {"graph_cache": 1})
    assert second.schedule is None and second.cache_hit  # type: ignore[attr-defined]
    for n in SIZES:
        x = torch.randn(n, n + 2)
        torch.testing.assert_close(second(x), fn(x))


def test_size_symbols_are_read_off_inputs() -> None:
    gm = trace(lambda x, y: x @ y, torch.randn(5, 3), torch.randn(3, 7))
    sv = size_vars(gm, [torch.randn(5, 3), torch.randn(3, 7)])
    assert sv is not None
    want = [("x_1", "size", 0), ("x_1", "size", 1), ("y_1", "size", 1)]
    assert sorted(sv.sources.values()) == want
    assert sorted(sv.hints.values()) == [3, 5, 7]
    static = make_fx(lambda x: x + 1)(torch.randn(2))
    assert size_vars(static, [torch.randn(2)]) is None


def test_addmm_biases_fuse_into_the_consumer() -> None:
    """With symbolic sizes too, ``addmm`` is ``mm`` plus an add in its consumer's kernel
    (an RNN step ran as aten's addmm, whose bias copy is a pass over the output: rnn-infer
    with ``dynamic=True`` took 1.15x the static graph's time)."""
    c = compiled(rnn_cell, *rnn_inputs(10))
    assert c.schedule is not None
    externs = [str(s) for s in c.schedule.steps if not isinstance(s, Kernel)]
    assert externs and not any("addmm" in e for e in externs), externs
    assert sum("aten.mm" in e for e in externs) == 2, externs
