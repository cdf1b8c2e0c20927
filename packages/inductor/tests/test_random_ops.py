"""Random ops: torch's kernels by default, counter-based numbers in the kernels on request."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph
from ember.inductor.interpret import interpret
from ember.inductor.ir import Extern
from ember.inductor.lowering import lower_graph
from ember.inductor.philox import rounds

aten = torch.ops.aten
FUSED = {"fallback_random": False}


@pytest.mark.parametrize(
    ("counter", "key", "want"),
    [  # Random123's known-answer tests for Philox4x32-10
        ((0, 0, 0, 0), (0, 0), "6627e8d5 e169c58d bc57ac4c 9b00dbd8"),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, "408f276d 41c83b0e a20bc7c6 6d5451fd"),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            "d16cfe09 94fdcceb 5001e420 24126ea1",
        ),
    ],
)
def test_philox_known_answers(counter: tuple, key: tuple, want: str) -> None:
    words = rounds([torch.tensor(c) for c in counter], [torch.tensor(k) for k in key])
    assert " ".join(f"{int(w):08x}" for w in words) == want


def program(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y, mask = aten.native_dropout.default(x, 0.3, True)
    coin = aten.bernoulli.p(x, 0.25)
    return y * 2 + 1, mask, torch.rand_like(x), torch.randn(x.shape) * x, coin


X = torch.randn(300, 70)  # 21,000 elements: statistics within a percent


def test_fused_random_numbers_are_the_reference_generators_numbers() -> None:
    gm = make_fx(program)(X)
    compiled = compile_graph(gm, [X], FUSED)
    torch.manual_seed(3)
    got = compiled(X)
    torch.manual_seed(3)  # the same seeds reach the reference interpreter
    want = interpret(lower_graph(gm, [X], fused_random=True), [X])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_fused_random_numbers_have_the_right_distributions() -> None:
    compiled = compile_graph(make_fx(program)(X), [X], FUSED)
    y, mask, u, n, coin = compiled(X)
    assert mask.dtype == torch.bool and abs(mask.float().mean().item() - 0.7) < 0.015
    torch.testing.assert_close(y, torch.where(mask, X / 0.7 * 2 + 1, torch.ones_like(X)))
    assert 0 <= u.min().item() and u.max().item() < 1 and abs(u.mean().item() - 0.5) < 0.01
    z = n / X
    assert abs(z.mean().item()) < 0.03 and abs(z.std().item() - 1) < 0.03
    assert set(coin.unique().tolist()) <= {0.0, 1.0} and abs(coin.mean().item() - 0.25) < 0.015
    # neighbours are not correlated (a counter-based generator with a poor mixing would be)
    flat = u.flatten()
    assert abs(torch.corrcoef(torch.stack([flat[:-1], flat[1:]]))[0, 1].item()) < 0.03


def test_seeded_calls_repeat_and_unseeded_calls_differ() -> None:
    compiled = compile_graph(make_fx(program)(X), [X], FUSED)
    torch.manual_seed(0)
    first = compiled(X)
    second = compiled(X)
    torch.manual_seed(0)
    again = compiled(X)
    for a, b, c in zip(first, second, again, strict=True):
        assert torch.equal(a, c)
        assert not torch.equal(a, b)


def test_dropout_and_its_mask_are_fused_into_kernels() -> None:
    compiled = compile_graph(make_fx(program)(X), [X], {**FUSED, "graph_cache": False})
    assert compiled.schedule is not None
    externs = {str(s.target) for s in compiled.schedule.steps if isinstance(s, Extern)}
    assert externs == {"aten.randint.low"}  # one seed per random op, nothing else


def test_by_default_random_ops_draw_eagers_numbers() -> None:
    compiled = compile_graph(make_fx(program)(X), [X])
    torch.manual_seed(5)
    got = compiled(X)
    torch.manual_seed(5)
    want = program(X)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_training_through_fused_dropout_uses_one_mask_forward_and_backward() -> None:
    from ember.aotgraph import aot_compile

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(x, 0.4, training=True) * 3

    x = torch.randn(64, 33, requires_grad=True)
    fn = aot_compile(
        torch.fx.symbolic_trace(f),
        [x],
        fw_compiler=lambda gm, ex: compile_graph(gm, ex, FUSED),
    )
    y = fn(x)
    y.sum().backward()
    assert x.grad is not None
    kept = y != 0
    torch.testing.assert_close(x.grad, kept.float() * 3 / 0.6)
    torch.testing.assert_close(y, torch.where(kept, x.detach() * 3 / 0.6, torch.zeros_like(y)))
