"""A module's buffer rebound inside compiled code (``self.count = self.count + 1``, a
running statistic kept by assignment): nn.Module's ``__setattr__`` stores the new tensor in
``_buffers``, and ember replays that store after the graph, so the buffer, ``state_dict``
and the outputs equal eager's on every call with one graph and no recompiles. Reaching the
``_buffers`` dict itself after such a store (``named_buffers``, ``state_dict``) breaks the
graph there rather than read the old tensor; rebinding a parameter still breaks (eager
raises for a plain tensor)."""

from __future__ import annotations

import pytest
import torch

import ember.compiler

BACKENDS = ["eager", "aot_eager", "inductor"]


class Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(1))
        self.register_buffer("ema", torch.zeros(2))
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count = self.count + 1
        y = self.lin(x) * self.count
        self.ema = 0.9 * self.ema + 0.1 * y.detach().mean(0)
        self.count = self.count * 2  # rebound twice: the second value is the one kept
        return y + self.count + self.ema


class ReadsBack(Counter):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count = self.count + 1
        buffers = dict(self.named_buffers())  # after the store: the new tensor
        return x + buffers["count"] + self._buffers["count"] + self.count


def _pair(cls: type[torch.nn.Module]) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    eager = cls()
    mine = cls()
    mine.load_state_dict(eager.state_dict())
    return eager, mine


@pytest.mark.parametrize("backend", BACKENDS)
def test_rebound_buffers_equal_eager_with_one_graph(backend: str) -> None:
    eager, mine = _pair(Counter)
    compiled = ember.compiler.compile(mine, backend=backend)
    for step in range(4):
        x = torch.randn(3, 2)
        torch.testing.assert_close(compiled(x), eager(x), msg=f"step {step}")
        for name, buf in eager.state_dict().items():
            torch.testing.assert_close(mine.state_dict()[name], buf)
    assert list(mine._buffers) == ["count", "ema"]  # stored where eager stores them
    assert compiled.stats.graphs == 1 and not compiled.stats.failures, compiled.stats


@pytest.mark.parametrize("backend", BACKENDS)
def test_reading_buffers_dict_after_a_store_breaks_and_is_right(backend: str) -> None:
    eager, mine = _pair(ReadsBack)
    compiled = ember.compiler.compile(mine, backend=backend)
    for _ in range(3):
        x = torch.randn(2)
        torch.testing.assert_close(compiled(x), eager(x))
    torch.testing.assert_close(mine.count, eager.count)
    explained = ember.compiler.explain(ReadsBack())(torch.randn(2))
    reasons = [b.reason for b in explained.break_reasons]
    assert "reading a module's _buffers after setting a buffer" in reasons, reasons


def test_rebinding_a_parameter_still_breaks_and_raises_as_eager() -> None:
    class Bad(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.w = self.w * 2  # eager: TypeError, a plain tensor for a parameter
            return x

    with pytest.raises(TypeError) as eager_error:
        Bad()(torch.ones(2))
    with pytest.raises(TypeError) as compiled_error:
        ember.compiler.compile(Bad(), backend="eager")(torch.ones(2))
    assert str(compiled_error.value) == str(eager_error.value)
