"""Capture's graph inputs: a plain tensor's fake made directly (``inputfakes``), the same as
``from_tensor``'s; tensors that share memory keep fakes that share a storage (issue 19)."""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses import FakeTensorMode
from torch._subclasses.meta_utils import MetaConverter

from ember.capture import hook
from ember.capture.frame_compiler import FrameCompiler
from ember.capture.inputfakes import input_fake, is_plain_input


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 4)
        self.register_buffer("scale", torch.full((4,), 2.0))

    def forward(self, x: torch.Tensor, alias: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale + alias.sum()


def _placeholder_fakes(fn: Any, *args: Any) -> tuple[dict[str, Any], Any]:
    """The fakes of the graph's placeholders, by name, and the compiled call's result."""
    seen: dict[str, Any] = {}

    def backend(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
        for node in gm.graph.find_nodes(op="placeholder"):
            seen[node.name] = node.meta["example_value"]
        return gm.forward

    compiler = FrameCompiler(backend, "eager", entry_codes=(fn.__code__,))
    with hook.intercepting(compiler):
        out = fn(*args)
    assert len(compiler.stats.compiled) == 1, compiler.stats.failures[0].reason
    return seen, out


def test_parameters_and_buffers_are_made_directly_and_keep_their_facts(monkeypatch):
    net = Net()
    assert all(is_plain_input(t) for t in (net.lin.weight, net.lin.bias, net.scale))
    x, other = torch.randn(2, 3), torch.randn(5)
    described: list[Any] = []
    plain = MetaConverter.__call__

    def counting(self: Any, t: Any, *args: Any, **kwargs: Any) -> Any:
        described.append(t)
        return plain(self, t, *args, **kwargs)

    monkeypatch.setattr(MetaConverter, "__call__", counting)
    fakes, out = _placeholder_fakes(net.forward, x, other)
    assert described == []  # five plain inputs: none through torch's meta converter
    torch.testing.assert_close(out, net(x, other))
    weight = next(f for name, f in fakes.items() if "weight" in name)
    assert weight.requires_grad and isinstance(weight, torch.nn.Parameter)
    assert (weight.shape, weight.stride()) == (net.lin.weight.shape, net.lin.weight.stride())


def test_inputs_that_share_memory_keep_fakes_that_share_a_storage():
    net = Net()
    alias = net.scale.detach()  # the buffer's memory, reached as an argument too
    assert not is_plain_input(net.scale)
    x = torch.randn(2, 3)
    fakes, out = _placeholder_fakes(net.forward, x, alias)
    torch.testing.assert_close(out, net(x, alias))
    storages = {f.untyped_storage()._cdata for f in fakes.values() if f.shape == (4,)}
    assert len(storages) == 2  # the bias's own; the buffer's and the argument's, shared


def test_the_converter_answers_the_direct_fake_for_the_tensor():
    mode = FakeTensorMode(static_shapes=True)
    w = torch.nn.Parameter(torch.randn(3, 2))
    fake = input_fake(mode, w)
    assert mode.from_tensor(w, static_shapes=True) is fake
