"""Inference freezing through the ``inductor`` backend (``options={"freezing": True}``,
``config.inductor.freezing``): folds, re-freezing after in-place updates, training graphs
never frozen. The freezing pass's own tests, without ember.compiler, are in
``packages/inductor/tests/test_freezing.py``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from models import ConvBN  # benchmarks/models: on the path for every package's tests

import ember.compiler
from ember.inductor import freezing

aten = torch.ops.aten


def ops(gm: torch.fx.GraphModule) -> list[Any]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[freezing.FrozenGraph]:
    """Every FrozenGraph that ember.inductor makes during the test."""
    made: list[freezing.FrozenGraph] = []
    real = freezing.freeze

    def spy(*args: Any) -> Any:
        out = real(*args)
        if isinstance(out, freezing.FrozenGraph):
            made.append(out)
        return out

    monkeypatch.setattr(freezing, "freeze", spy)
    return made


def test_batch_norm_folds_into_the_conv_end_to_end(plans: list[freezing.FrozenGraph]) -> None:
    torch.manual_seed(0)
    m = ConvBN().eval()
    compiled = ember.compiler.compile(m, backend="inductor", options={"freezing": True})
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), m(x))
        torch.testing.assert_close(compiled(x), m(x))
    (frozen,) = plans
    assert frozen.plan.conv_affine == 1
    # the batch norm arithmetic is gone from the per-call graph: conv, relu, view, addmm
    left = ops(frozen.plan.graph)
    assert aten.sub.Tensor not in left and aten.mul.Tensor not in left, left
    assert aten.permute.default not in left  # the linear weight's transpose was folded
    assert frozen.refreezes == 0  # the same parameters every call: no work spent again


def test_in_place_updates_refreeze(plans: list[freezing.FrozenGraph]) -> None:
    torch.manual_seed(0)
    m = ConvBN().eval()
    compiled = ember.compiler.compile(m, backend="inductor", options={"freezing": True})
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        compiled(x)
        m.conv.weight.mul_(2)
        torch.testing.assert_close(compiled(x), m(x))
        m.bn.running_var.mul_(3)
        torch.testing.assert_close(compiled(x), m(x))
        m.fc.weight.add_(1)
        torch.testing.assert_close(compiled(x), m(x))
        m.load_state_dict(ConvBN().eval().state_dict())  # copy_ into each tensor
        torch.testing.assert_close(compiled(x), m(x))
    (frozen,) = plans
    assert frozen.refreezes == 4
    assert "updated in place (version" in frozen.reasons[0], frozen.reasons
    assert frozen.fallback is None


def test_training_graphs_are_never_frozen(plans: list[freezing.FrozenGraph]) -> None:
    torch.manual_seed(0)
    m = ConvBN().eval()
    reference = ConvBN().eval()
    reference.load_state_dict(m.state_dict())
    compiled = ember.compiler.compile(m, backend="inductor", options={"freezing": True})
    x = torch.randn(2, 3, 8, 8)
    for _ in range(2):  # a training step moves the weights: the next step must see them
        compiled(x).sum().backward()
        reference(x).sum().backward()
        with torch.no_grad():
            for p, q in zip(m.parameters(), reference.parameters(), strict=True):
                torch.testing.assert_close(p.grad, q.grad)
                p -= 0.1 * p.grad
                q -= 0.1 * q.grad
    assert plans == []


def test_the_setting_turns_it_on(plans: list[freezing.FrozenGraph]) -> None:
    m = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16)
    with ember.compiler.config.patch({"inductor.freezing": True}):
        compiled = ember.compiler.compile(m, backend="inductor")
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), m(x))
    assert len(plans) == 1 and plans[0].plan.frozen


def test_a_bad_option_fails_in_compile() -> None:
    with pytest.raises((TypeError, ValueError), match=r"freezing.*must be a bool"):
        ember.compiler.compile(torch.nn.Linear(2, 2), backend="inductor", options={"freezing": 1})


def test_symbolic_sizes_keep_the_folds(plans: list[freezing.FrozenGraph]) -> None:
    """Under dynamic=True the batch is symbolic; the weights stay constants of one size."""
    torch.manual_seed(0)
    m = ConvBN().eval()
    compiled = ember.compiler.compile(
        m, backend="inductor", dynamic=True, options={"freezing": True}
    )
    with torch.no_grad():
        for batch in (2, 3, 5):
            x = torch.randn(batch, 3, 8, 8)
            torch.testing.assert_close(compiled(x), m(x))
    assert len(plans) == 1 and plans[0].plan.conv_affine == 1 and plans[0].refreezes == 0


class Scaled(torch.nn.Module):
    """A linear layer, a registered buffer and a 1-D data input (as a UNet's timesteps)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.full((4,), 2.0))
        self.shift = torch.ones(4)  # a plain tensor attribute: not module state

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale + t + self.shift


def test_only_parameters_and_buffers_are_frozen(plans: list[freezing.FrozenGraph]) -> None:
    """The capture's sources say which inputs are module state: the 1-D data input ``t``
    and the plain attribute are live inputs, so new values each call cost no re-freeze."""
    torch.manual_seed(0)
    m = Scaled().eval()
    compiled = ember.compiler.compile(m, backend="inductor", options={"freezing": True})
    with torch.no_grad():
        for _ in range(3):
            x, t = torch.randn(2, 4), torch.randn(4)
            torch.testing.assert_close(compiled(x, t), m(x, t))
        m.scale.mul_(3)  # a buffer updated in place: re-frozen once, never stale
        torch.testing.assert_close(compiled(x, t), m(x, t))
    (frozen,) = plans
    inputs = frozen.plan.graph.graph.find_nodes(op="placeholder")
    assert len(frozen.plan.frozen) == 3, frozen.plan  # weight, bias, scale
    assert len(frozen.plan.live) == 3 and len(inputs) >= 3, frozen.plan  # x, t, shift
    assert frozen.refreezes == 1
