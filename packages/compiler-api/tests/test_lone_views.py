"""Graph outputs that are views of an intermediate nothing else holds, where eager's output
is no view (a bias-free ``F.linear`` on a 3-d input, as language models' heads: eager's
``_unsafe_view``, the compiled graph's ``view``): handed out as plain tensors of the same
memory, not copied each call. Where eager's output is a view, the compiled one stays one."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ember.compiler
from ember.aotgraph import runtime

T = torch.Tensor


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> list[T]:
    """The outputs the runtime copies (``fresh_copy``) while the test runs."""
    seen: list[T] = []
    real = runtime.fresh_copy

    def counted(t: T) -> T:
        seen.append(t)
        return real(t)

    monkeypatch.setattr(runtime, "fresh_copy", counted)
    return seen


def _pair(fn: Any) -> tuple[Any, Any]:
    torch.manual_seed(0)
    eager = fn()
    torch.manual_seed(0)
    return eager, ember.compiler.compile(fn(), backend="inductor")


@pytest.mark.parametrize("backend_calls", [1, 3])
def test_head_on_3d_input_is_no_view_and_is_not_copied(copies: list[T], backend_calls: int) -> None:
    eager, compiled = _pair(lambda: torch.nn.Linear(8, 16, bias=False))
    for _ in range(backend_calls):
        x = torch.randn(2, 3, 8, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        got, want = compiled(x), eager(x2)
        assert (got._is_view(), want._is_view(), got._base is None) == (False, False, True)
        torch.testing.assert_close(got, want)
        got.add_(1)  # eager's output may be written in place: so may this one
        want.add_(1)
        (got * got).sum().backward()
        (want * want).sum().backward()
        torch.testing.assert_close(x.grad, x2.grad)
    assert not copies
    for p, q in zip(compiled.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


def test_a_view_whose_base_is_saved_is_still_copied(copies: list[T]) -> None:
    def fn(x: T, w: T) -> tuple[T, T]:
        y = x @ w  # y is saved for sin's backward, and y.view is returned
        return y.view(-1), y.sin()

    compiled = ember.compiler.compile(fn, backend="inductor")
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True)
    got, want = compiled(x, w), fn(x, w)
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e)
        assert g._is_view() == e._is_view()
    sum(t.sum() for t in got).backward()
    grads = [x.grad.clone(), w.grad.clone()]  # type: ignore[union-attr]
    x.grad = w.grad = None
    sum(t.sum() for t in want).backward()
    torch.testing.assert_close(grads, [x.grad, w.grad])


def test_linear_with_bias_stays_a_view_as_eagers(copies: list[T]) -> None:
    eager, compiled = _pair(lambda: torch.nn.Linear(8, 16))  # eager: ViewBackward0
    x = torch.randn(2, 3, 8, requires_grad=True)
    got, want = compiled(x), eager(x)
    torch.testing.assert_close(got, want)
    assert got._is_view() and want._is_view()
