"""Helpers for aotgraph's tests: models of the zoo as graphs shaped like ember's capture makes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.aotgraph import api


def captured(model: torch.nn.Module, args: list[Any]) -> tuple[torch.fx.GraphModule, list[Any]]:
    """``model`` as a graph of ``(*args, *parameters, *buffers)`` (parameters lifted to inputs,
    as ember's capture makes them; here traced to aten ops by ``make_fx`` on fake tensors),
    and the inputs to call it with (the model's own tensors, so updates reach the model)."""
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    state = [*model.parameters(), *model.buffers()]
    n = len(args)

    def run(*flat: Any) -> Any:
        return torch.func.functional_call(model, dict(zip(names, flat[n:], strict=True)), flat[:n])

    gm = make_fx(run, tracing_mode="fake")(*args, *state)
    return gm, [*args, *state]


@pytest.fixture
def capture() -> Callable[[torch.nn.Module, list[Any]], tuple[torch.fx.GraphModule, list[Any]]]:
    """:func:`captured`, for tests."""
    return captured


@pytest.fixture
def traces(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the tracing passes that ran, in order."""
    ran: list[str] = []
    for name in ("analyze", "trace_joint", "trace_forward", "trace_inference"):
        original = getattr(api, name)

        def counted(*args: Any, _name: str = name, _fn: Any = original, **kwargs: Any) -> Any:
            ran.append(_name)
            return _fn(*args, **kwargs)

        monkeypatch.setattr(api, name, counted)
    return ran
