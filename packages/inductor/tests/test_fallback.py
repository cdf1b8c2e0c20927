"""Ops without lowerings run as aten calls; graphs that cannot be lowered run as they are."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph
from ember.inductor.ir import Extern


def test_unsupported_op_runs_through_aten() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x.exp(), 1).sort(-1).values * 2 + torch.special.bessel_j0(x)

    x = torch.randn(4, 8)
    compiled = compile_graph(make_fx(f)(x), [x])
    torch.testing.assert_close(compiled(x), f(x))
    externs = [str(s.target) for s in compiled.schedule.steps if isinstance(s, Extern)]
    assert "aten.cumsum.default" in externs and "aten.sort.default" in externs


def test_extern_between_kernels_and_views_of_inputs() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = torch.relu(x @ w + 1)
        return h, w.t(), x[:, 1:], torch.addmm(h[:, :4].sum(1, keepdim=True), x, w)

    x, w = torch.randn(6, 5), torch.randn(5, 7)
    compiled = compile_graph(make_fx(f)(x, w), [x, w])
    got, want = compiled(x, w), f(x, w)
    torch.testing.assert_close(got, want)
    assert got[1].stride() == want[1].stride() and got[2].stride() == want[2].stride()


def test_random_ops_and_mutation() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand_like(x) * 0

    x = torch.randn(3, 3)
    compiled = compile_graph(make_fx(f)(x), [x])
    torch.testing.assert_close(compiled(x), x)


def test_non_tensor_input_runs_eagerly() -> None:
    gm = make_fx(lambda x, s: x * 2)(torch.ones(2), "tag")  # numbers compile: test_numbers.py
    with pytest.warns(UserWarning, match="running the graph eagerly: input s_1 is a str"):
        compiled = compile_graph(gm, [torch.ones(2), "tag"])
    torch.testing.assert_close(compiled(torch.ones(2), "tag"), torch.full((2,), 2.0))


def test_backward_graph() -> None:
    def fwd_bwd(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.nn.functional.layer_norm(torch.tanh(x @ w), (w.shape[1],)).softmax(-1)
        loss = (y * y).sum()
        return loss, *torch.autograd.grad(loss, [x, w])

    x = torch.randn(8, 16, requires_grad=True)
    w = torch.randn(16, 12, requires_grad=True)
    gm = make_fx(fwd_bwd)(x, w)
    compiled = compile_graph(gm, [x.detach(), w.detach()])
    torch.testing.assert_close(compiled(x.detach(), w.detach()), fwd_bwd(x, w))


def test_output_structures() -> None:
    x = torch.randn(3)
    for f in [lambda x: x * 2, lambda x: (x * 2,), lambda x: [x * 2, x], lambda x: {"a": [x + 1]}]:
        got, want = compile_graph(make_fx(f)(x), [x])(x), f(x)
        assert type(got) is type(want)
        torch.testing.assert_close(got, want)
