"""The generated wrapper: pooled intermediates, extern calls, number inputs."""

from __future__ import annotations

import gc
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph
from ember.inductor.wrapper import POOL_MAX_BYTES
from ember.inductor.wrapper_bind import pooled_bytes

T = torch.Tensor


def _two_layers(x: T, w: T, w2: T) -> tuple[T, T]:
    h = (x.sin() @ w).tanh()  # x.sin(): an intermediate a matmul reads, pooled
    y = (h @ w2).relu()  # h (over the first matmul's result) is the second one's input
    return y, y.sum(0)


def _compiled() -> tuple[object, T, T]:
    w, w2 = torch.randn(16, 16), torch.randn(16, 4)
    x = torch.randn(8, 16)
    return compile_graph(make_fx(_two_layers)(x, w, w2), [x, w, w2]), w, w2


def test_pooled_intermediates_never_reach_the_caller() -> None:
    compiled, w, w2 = _compiled()
    xs = [torch.randn(8, 16) for _ in range(3)]
    outs = [compiled(x, w, w2) for x in xs]  # type: ignore[operator]
    assert "_take(_pool)" in compiled.wrapper  # type: ignore[attr-defined]
    for x, got in zip(xs, outs, strict=True):  # earlier results survive later calls
        for g, want in zip(got, _two_layers(x, w, w2), strict=True):
            torch.testing.assert_close(g, want)


def test_a_pool_keeps_small_sets_only_and_pooled_bytes_counts_them() -> None:
    """A graph keeps at most ``POOL_MAX_BYTES`` of intermediates between calls, and
    ``pooled_bytes`` (what a steady-state memory measure adds) counts what it keeps."""
    w, w2 = torch.randn(16, 16), torch.randn(16, 4)
    x = torch.randn(5, 16)  # sizes no other test compiles: a graph (and a pool) of its own
    gc.collect()  # other tests' graphs, and their pools, gone
    before = pooled_bytes()
    small = compile_graph(make_fx(_two_layers)(x, w, w2), [x, w, w2])
    small(x, w, w2)  # type: ignore[operator]
    assert pooled_bytes() - before == 5 * 16 * 4  # its pooled x.sin()
    rows = POOL_MAX_BYTES // 64 + 8  # x.sin() of rows x 16 float32: past the limit
    x = torch.randn(rows, 16)
    big = compile_graph(make_fx(_two_layers)(x, w, w2), [x, w, w2])
    now = pooled_bytes()
    for got, want in zip(big(x, w, w2), _two_layers(x, w, w2), strict=True):  # type: ignore[operator]
        torch.testing.assert_close(got, want)
    assert "_take(_pool)" not in big.wrapper and pooled_bytes() == now  # type: ignore[attr-defined]


def test_a_graph_allocating_more_than_the_limit_keeps_no_pool() -> None:
    """A small intermediate is not pooled when the graph allocates more than
    ``POOL_MAX_BYTES`` in all: there the saved allocation is noise, the resident set not."""

    def f(x: T, w: T, big: T) -> tuple[T, T]:
        return x.sin() @ w, big * 2  # x.sin(): 320 bytes; big * 2: returned, 256 KiB

    x, w, big = torch.randn(5, 16), torch.randn(16, 16), torch.randn(256, 256)
    compiled = compile_graph(make_fx(f)(x, w, big), [x, w, big])
    for got, want in zip(compiled(x, w, big), f(x, w, big), strict=True):  # type: ignore[operator]
        torch.testing.assert_close(got, want)
    assert "_take(_pool)" not in compiled.wrapper  # type: ignore[attr-defined]
    few = big[:8, :8].clone()
    small = compile_graph(make_fx(f)(x, w, few), [x, w, few])
    small(x, w, few)  # type: ignore[operator]
    assert "_take(_pool)" in small.wrapper  # type: ignore[attr-defined]


def test_pooled_wrapper_is_thread_safe(in_threads: Any) -> None:
    compiled, w, w2 = _compiled()

    def work(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for _ in range(50):
            x = torch.randn(8, 16, generator=g)
            got_want = zip(compiled(x, w, w2), _two_layers(x, w, w2), strict=True)  # type: ignore[operator]
            for got, want in got_want:
                torch.testing.assert_close(got, want)

    in_threads(work)


def _embedding_grad(grad: T, idx: T) -> T:
    # embedding's backward as its decomposition writes it: zeros, then index_put
    return torch.zeros(10, 4).index_put((idx,), grad, accumulate=True) * 2


def _zeros_kept(grad: T, idx: T) -> tuple[T, T]:
    zeros = torch.zeros(10, 4) + 1
    return zeros.index_put((idx,), grad, accumulate=True), zeros  # self read afterwards


def _index_put_in_place(compiled: Any) -> bool:
    """The schedule writes the index_put extern's result over its ``self``."""
    lines = str(compiled.schedule).splitlines()
    name = next(line.split(" = ")[0] for line in lines if "extern aten.index_put" in line)
    placed = next((line for line in lines if line.startswith("in place: ")), "in place: ")
    return any(p.startswith(f"{name}<-") for p in placed.removeprefix("in place: ").split(", "))


def test_functional_extern_writes_a_dying_buffer_in_place() -> None:
    grad, idx = torch.randn(6, 4), torch.tensor([1, 3, 1, 0, 9, 3])
    compiled = compile_graph(make_fx(_embedding_grad)(grad, idx), [grad, idx])
    got = compiled(grad, idx)  # type: ignore[operator]
    assert _index_put_in_place(compiled)
    torch.testing.assert_close(got, _embedding_grad(grad, idx))
    again = compiled(grad, idx)  # type: ignore[operator]
    torch.testing.assert_close(again, _embedding_grad(grad, idx))
    assert again.data_ptr() != got.data_ptr()  # the result escapes: fresh memory each call


def test_functional_extern_keeps_a_buffer_read_afterwards() -> None:
    grad, idx = torch.randn(6, 4), torch.tensor([1, 3, 1, 0, 9, 3])
    compiled = compile_graph(make_fx(_zeros_kept)(grad, idx), [grad, idx])
    assert not _index_put_in_place(compiled)
    for g, want in zip(compiled(grad, idx), _zeros_kept(grad, idx), strict=True):  # type: ignore[operator]
        torch.testing.assert_close(g, want)


def _backward_peak(boxed: bool, monkeypatch: Any) -> tuple[float, str, T]:
    """Peak tensor bytes of a training step of a 6-layer tanh MLP (profiler memory events),
    the backward wrapper's source and the first layer's weight gradient."""
    import contextvars

    from torch.profiler import ProfilerActivity, profile

    import ember.inductor.compiled as compiled_module
    from ember.aotgraph import aot_compile

    if not boxed:  # as before boxed backward graphs: the compiler never sees the flag
        monkeypatch.setattr(
            compiled_module, "CALLED_BOXED", contextvars.ContextVar("off", default=False)
        )
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[m for _ in range(6) for m in (torch.nn.Linear(256, 256), torch.nn.Tanh())]
    )
    x = torch.randn(256, 256)
    compiler = lambda gm, ex: compile_graph(gm, ex, {"graph_cache": False})  # noqa: E731
    gm = torch.fx.symbolic_trace(model)
    f = aot_compile(gm, [x], fw_compiler=compiler)
    f(x).sum().backward()  # compiles the backward graph
    model.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        f(x).sum().backward()  # (the forward too: the activations are allocated in view)
    moves = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]"
    )  # type: ignore[union-attr]
    live = peak = 0
    for _, n in moves:
        live += n
        peak = max(peak, live)
    assert f.training is not None
    return peak, f.training.backward.wrapper, model[0].weight.grad


def test_a_backward_graph_frees_its_saved_activations_as_it_goes(monkeypatch: Any) -> None:
    """A backward graph's wrapper is boxed (``call_boxed``): it deletes each saved
    activation after its last use, so the pass peaks lower than when all stay alive to its
    end (six 256 KiB activations), with the same gradients."""
    boxed_peak, source, grad = _backward_peak(True, monkeypatch)
    plain_peak, plain_source, plain_grad = _backward_peak(False, monkeypatch)
    assert "def call_boxed(_args):" in source and "_args.clear()" in source
    assert "call_boxed" not in plain_source
    torch.testing.assert_close(grad, plain_grad)
    assert boxed_peak <= plain_peak - 3 * 256 * 1024, (boxed_peak, plain_peak)
