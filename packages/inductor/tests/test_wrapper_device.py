"""The Triton wrapper makes its graph's CUDA device current while it runs (Triton launches
on the current device). Checked without a GPU: ``torch.cuda``'s current-device calls are
stood in for, and the wrapper's calls to them recorded."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from ember.inductor import wrapper


@pytest.fixture
def devices(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The current device (the last entry) and every switch the wrapper makes."""
    seen: list[Any] = [0]

    @contextlib.contextmanager
    def device(index: int) -> Iterator[None]:
        seen.append(("enter", index))
        try:
            yield
        finally:
            seen.append(("leave", index))

    monkeypatch.setattr(torch.cuda, "current_device", lambda: seen[0])
    monkeypatch.setattr(torch.cuda, "device", device)
    return seen


def test_another_device_is_made_current_while_the_graph_runs(devices: list[Any]) -> None:
    call = wrapper._on_device(lambda *a: ("ran", a), torch.device("cuda:1"))
    assert call(1, 2) == ("ran", (1, 2))
    assert devices[1:] == [("enter", 1), ("leave", 1)]


def test_the_current_device_is_left_alone(devices: list[Any]) -> None:
    call = wrapper._on_device(lambda: "ran", torch.device("cuda:0"))
    assert call() == "ran" and devices == [0]


def test_bind_wraps_triton_graphs_on_cuda_only() -> None:
    source = "def call(x):\n    return (x,)\n"
    cpu = wrapper.bind(source, {}, {}, None, kernels={}, device="cpu")
    cuda = wrapper.bind(source, {}, {}, None, kernels={}, device="cuda:1")
    assert cpu.__name__ == "call" and cuda.__name__ == "on_device"
