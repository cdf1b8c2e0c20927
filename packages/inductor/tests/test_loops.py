"""Loop shapes: inner loops cut by floor/Mod are split; results stay eager's."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph, decompositions

T = torch.Tensor


def _qkv_backward(x: T, w: T) -> tuple[T, ...]:
    """Attention-style q, k, v selected from one projection, then their gradient: the
    backward writes each head's piece of the projection's gradient (floor/Mod indices)."""
    q, k, v = (x @ w).view(4, 16, 3, 2, 8).permute(2, 0, 3, 1, 4)
    loss = (q.tanh() * k + v.sin()).sum()
    return loss, *torch.autograd.grad(loss, [x, w])


def test_inner_loop_cut_by_divisions_is_split() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 16, 32, requires_grad=True)
    w = torch.randn(32, 48, requires_grad=True)
    gm = make_fx(_qkv_backward, decomposition_table=decompositions())(x, w)
    compiled = compile_graph(gm, [x, w], {"graph_cache": False})
    for got, want in zip(compiled(x, w), _qkv_backward(x, w), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)  # a sum of 2048 terms
    assert compiled.source is not None
    assert "const int64_t y0 = " in compiled.source  # a split stage: y0 = 16*y0_0 + y0_1
    assert "/ 16)" not in compiled.source.split("const int64_t y0 = ")[1].split("}")[0]


def test_views_of_a_computed_value_start_where_the_op_says() -> None:
    # traced with real tensors and the view -> _unsafe_view decomposition: the fake values
    # of these views lost their offsets
    def f(x: T, w: T) -> T:
        q, k, v = (x @ w).view(4, 16, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return q.tanh() * k + v[:, 1:].sin() + v[:, 1:, 3:4]

    x, w = torch.randn(4, 16, 32), torch.randn(32, 48)
    gm = make_fx(f, decomposition_table=decompositions())(x, w)
    compiled = compile_graph(gm, [x, w], {"graph_cache": False})
    torch.testing.assert_close(compiled(x, w), f(x, w))


def test_values_fixed_in_a_loop_are_computed_before_it() -> None:
    # batch norm backward through a relu: the select's other side is one value per channel,
    # which gcc would load under the mask (a masked load of one address: no vectorising)
    def f(x: T, mean: T, g: T) -> T:
        y = ((x - mean[:, None, None]) * 2.0).relu()
        return torch.where(y <= 0, 0.0, g[None, :, None, None] / 1024)

    x, mean, g = torch.randn(2, 4, 8, 32), torch.randn(4), torch.randn(4)
    compiled = compile_graph(make_fx(f)(x, mean, g), [x, mean, g], {"graph_cache": False})
    torch.testing.assert_close(compiled(x, mean, g), f(x, mean, g))
    source = compiled.source or ""
    body = source[source.index("void kernel0(") :]
    assert body.index("g_1[") < body.index("#pragma omp simd")  # loaded once per channel
