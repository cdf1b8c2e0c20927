"""The generated wrapper: pooled intermediates, extern calls, number inputs."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph

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
