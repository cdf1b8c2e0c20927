"""Fusion beyond program order: a node joins the kernel that computed its inputs, and nodes
that cut the same rows differently share a kernel."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph
from ember.inductor.scheduler import Kernel

T = torch.Tensor


def _kernels(compiled: object) -> list[Kernel]:
    schedule = getattr(compiled, "schedule", None)
    assert schedule is not None
    return [s for s in schedule.steps if isinstance(s, Kernel)]


def _gelu_saving_its_derivative(x: T, w: T, w2: T) -> tuple[T, ...]:
    h = (x @ w).view(4, 16, 64)  # rows cut as [4, 16] while the matmul's are [64]
    cdf = 1 + torch.erf(h * 0.7071)
    y = (h * 0.5 * cdf).view(64, 64) @ w2
    slope = cdf * 0.5 + h * torch.exp(h * h * -0.5) * 0.3989  # saved for a backward
    return y.relu(), slope


def test_a_late_node_joins_the_kernel_of_its_inputs() -> None:
    x, w, w2 = torch.randn(64, 32), torch.randn(32, 64), torch.randn(64, 16)
    gm = make_fx(_gelu_saving_its_derivative)(x, w, w2)
    compiled = compile_graph(gm, [x, w, w2], {"graph_cache": False})
    for got, want in zip(compiled(x, w, w2), _gelu_saving_its_derivative(x, w, w2), strict=True):
        torch.testing.assert_close(got, want)
    (first, *_) = _kernels(compiled)
    stores = [s for st in first.stages for s in st.stores]
    # the GELU, its input for the next matmul and the derivative: one kernel, erf computed
    # once and never stored
    assert len(stores) == 3 and sum(not s.local for s in stores) == 2


def test_rows_cut_differently_share_a_kernel() -> None:
    def f(x: T) -> tuple[T, T]:
        m = x.amax(-1, keepdim=True)  # a kernel over [4, 16]
        flat = (x - m).view(64, 8).exp()  # pointwise over [64, 8]
        return flat, flat.view(4, 16, 8).sum(-1)  # a reduction over [4, 16] again

    x = torch.randn(4, 16, 8)
    compiled = compile_graph(make_fx(f)(x), [x], {"graph_cache": False})
    for got, want in zip(compiled(x), f(x), strict=True):
        torch.testing.assert_close(got, want)
    assert len(_kernels(compiled)) == 1


def _targets(compiled: object) -> list[object]:
    schedule = getattr(compiled, "schedule", None)
    assert schedule is not None
    return [s.target for s in schedule.steps if not isinstance(s, Kernel)]


def _linear_gelu(x: T, w: T, b: T) -> T:
    return torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)) * 3


def _linear_kept(x: T, w: T, b: T) -> tuple[T, ...]:
    h = torch.nn.functional.linear(x, w, b)
    return h, h.relu()  # h is an output: it must be stored anyway


def _linear_viewed(x: T, w: T, b: T) -> T:
    return torch.nn.functional.linear(x, w, b).view(-1, 4, 8).transpose(1, 2) @ w[:4, :4]


def test_the_bias_of_a_linear_layer_is_added_by_its_consumer() -> None:
    """addmm copies the bias into its output before multiplying; when every user computes
    on the result, ember calls mm and the consumer's kernel adds the bias as it reads."""
    x, w, b = torch.randn(8, 32), torch.randn(64, 32), torch.randn(64)
    aten = torch.ops.aten
    for fn, want in [
        (_linear_gelu, [aten.mm.default]),
        (_linear_kept, [aten.addmm.default]),
        (_linear_viewed, [aten.addmm.default, aten.bmm.default]),
    ]:
        compiled = compile_graph(make_fx(fn)(x, w, b), [x, w, b], {"graph_cache": False})
        torch.testing.assert_close(compiled(x, w, b), fn(x, w, b))
        assert _targets(compiled) == want, fn.__name__
