"""A plain tensor input's fake made directly (``inputfakes``) is what ``from_tensor`` makes;
every other tensor, and any two that share memory, go through ``from_tensor``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._subclasses import FakeTensorMode
from torch._subclasses.meta_utils import MetaConverter

from ember.aotgraph import aot_compile
from ember.aotgraph.inputfakes import input_fake, is_plain_input


def _mode() -> FakeTensorMode:
    return FakeTensorMode(allow_non_fake_inputs=True, static_shapes=True)


def _facts(t: torch.Tensor) -> tuple[Any, ...]:
    return (
        type(t).__name__, t.shape, t.stride(), t.dtype, t.device, t.requires_grad, t.is_leaf,
        isinstance(t, torch.nn.Parameter), t.storage_offset(), t.untyped_storage().nbytes(),
    )  # fmt: skip


PLAIN = {
    "parameter": lambda: torch.nn.Parameter(torch.randn(4, 3)),
    "frozen parameter": lambda: torch.nn.Parameter(torch.randn(4, 3), requires_grad=False),
    "column-major": lambda: torch.empty_strided((3, 4), (1, 3)),
    "int64": lambda: torch.arange(6).reshape(2, 3).clone(),
    "bool": lambda: torch.ones(5, dtype=torch.bool),
    "scalar": lambda: torch.tensor(2.5),
    "half leaf with grad": lambda: torch.ones(2, 2, dtype=torch.float16, requires_grad=True),
}


@pytest.mark.parametrize("make", PLAIN.values(), ids=PLAIN.keys())
def test_a_plain_input_is_made_directly_as_from_tensor_makes_it(make):
    real = make()
    assert is_plain_input(real)
    mode = _mode()
    fake = input_fake(mode, real)
    assert _facts(fake) == _facts(_mode().from_tensor(real))
    assert mode.from_tensor(real) is fake  # the converter answers it from now on
    assert input_fake(mode, real) is fake


NOT_PLAIN = {
    "view": lambda: torch.randn(4, 3)[1:],
    "transposed view": lambda: torch.randn(4, 3).t(),
    "empty": lambda: torch.empty(0, 3),
    "non-leaf": lambda: torch.ones(2, requires_grad=True) * 2,
    "inference": lambda: _in_inference_mode(),
    "conjugate": lambda: torch.randn(3, dtype=torch.complex64).conj(),
    "with grad": lambda: _with_grad(),
    "sparse": lambda: torch.eye(3).to_sparse(),
    "storage larger": lambda: _storage_larger(),
}


def _in_inference_mode() -> torch.Tensor:
    with torch.inference_mode():
        return torch.ones(3)


def _with_grad() -> torch.Tensor:
    p = torch.nn.Parameter(torch.ones(3))
    p.sum().backward()
    return p


def _storage_larger() -> torch.Tensor:
    t = torch.empty(0)
    t.set_(torch.ones(10).untyped_storage(), 0, (2, 3), (3, 1))
    return t


@pytest.mark.parametrize("make", NOT_PLAIN.values(), ids=NOT_PLAIN.keys())
def test_other_tensors_go_through_from_tensor(make, monkeypatch):
    real = make()
    assert not is_plain_input(real)
    converted: list[Any] = []
    plain = MetaConverter.__call__

    def counting(self: Any, t: Any, *args: Any, **kwargs: Any) -> Any:
        converted.append(t)
        return plain(self, t, *args, **kwargs)

    monkeypatch.setattr(MetaConverter, "__call__", counting)
    fake = input_fake(_mode(), real)
    assert converted and converted[0] is real
    assert fake.shape == real.shape and fake.stride() == real.stride()


def test_inputs_that_share_memory_get_fakes_that_share_a_storage():
    w = torch.nn.Parameter(torch.randn(4, 3))
    alias = w.detach()  # the same memory, not a view: neither is made directly
    assert not is_plain_input(w) and not is_plain_input(alias)
    mode = _mode()
    a, b = input_fake(mode, w), input_fake(mode, alias)
    assert a.untyped_storage()._cdata == b.untyped_storage()._cdata


def test_a_graph_over_shared_and_plain_inputs_runs_as_eager():
    """The aot trace's signature reads aliasing off the fakes' storages: an input returned
    and one aliasing another are told apart from plain ones as in eager."""
    w = torch.randn(4, 3)
    alias = w.detach()
    x = torch.randn(2, 3)

    def f(x: torch.Tensor, w: torch.Tensor, alias: torch.Tensor) -> Any:
        return (x @ w.t()).relu(), alias, w.t()

    gm = torch.fx.symbolic_trace(f)
    compiled = aot_compile(gm, [x, w, alias], fw_compiler=lambda g, _: g)
    got, want = compiled(x, w, alias), f(x, w, alias)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] is alias or got[1].untyped_storage()._cdata == w.untyped_storage()._cdata
    assert got[2].untyped_storage()._cdata == w.untyped_storage()._cdata
    torch.testing.assert_close(got[2], want[2])
