"""Compiled optimizer steps on ``inductor`` write parameters and state in place: no copy
back after the kernels, the same tensors (and memory) as before, and version counters
moved as eager's in-place ops move them."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ember.compiler

STEPS = 3


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _set_grads(params: list[torch.nn.Parameter], k: int) -> None:
    g = torch.Generator().manual_seed(k)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def _tensors(params: list[torch.nn.Parameter], opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Parameters and their state tensors, in a fixed order."""
    out: list[torch.Tensor] = []
    for p in params:
        out += [p, *(v for _, v in sorted(opt.state[p].items()) if isinstance(v, torch.Tensor))]
    return out


class _CountCopies:
    """Counts ``Tensor.copy_`` calls from Python (the runtime's write-back makes them)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count, original = 0, torch.Tensor.copy_

        def counting(t: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            self.count += 1
            return original(t, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "copy_", counting)


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "single"])
@pytest.mark.parametrize(
    ("name", "kw"),
    [("AdamW", {"lr": 0.1}), ("SGD", {"lr": 0.1, "momentum": 0.9})],
    ids=["AdamW", "SGD"],
)
def test_step_writes_in_place_with_eager_versions(
    monkeypatch: pytest.MonkeyPatch, name: str, kw: dict[str, Any], foreach: bool
) -> None:
    ref, mine = list(_model().parameters()), list(_model().parameters())
    ref_opt = getattr(torch.optim, name)(ref, foreach=foreach, **kw)
    my_opt = getattr(torch.optim, name)(mine, foreach=foreach, **kw)
    step = ember.compiler.compile(my_opt.step, backend="inductor")
    for k in range(2):  # the first step fills the lazy state (eagerly); the second compiles
        _set_grads(ref, k), _set_grads(mine, k)
        ref_opt.step()
        step()
    before = [(t, t.data_ptr()) for t in _tensors(mine, my_opt)]
    ref_versions = [t._version for t in _tensors(ref, ref_opt)]
    my_versions = [t._version for t in _tensors(mine, my_opt)]
    copies = _CountCopies(monkeypatch)
    for k in range(2, 2 + STEPS):
        _set_grads(ref, k), _set_grads(mine, k)
        ref_opt.step()
        step()
    assert copies.count == 0  # every new value was written by the kernels
    for (t, ptr), now in zip(before, _tensors(mine, my_opt), strict=True):
        assert now is t and now.data_ptr() == ptr
    for a, b in zip(_tensors(ref, ref_opt), _tensors(mine, my_opt), strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
    moved_ref = [t._version - v for t, v in zip(_tensors(ref, ref_opt), ref_versions, strict=True)]
    moved = [t._version - v for t, v in zip(_tensors(mine, my_opt), my_versions, strict=True)]
    assert moved == moved_ref and all(m > 0 for m in moved)


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "single"])
def test_parameters_changed_between_compiled_steps_as_in_eager(foreach: bool) -> None:
    # between steps: an in-place update, a storage swapped by set_(), a counter moved; the
    # compiled steps after them give eager's parameters, state and counters, and a loss
    # computed before a step fails backward() after it, as eager's does
    ref, mine = list(_model().parameters()), list(_model().parameters())
    ref_opt = torch.optim.AdamW(ref, lr=0.1, foreach=foreach)
    my_opt = torch.optim.AdamW(mine, lr=0.1, foreach=foreach)
    step = ember.compiler.compile(my_opt.step, backend="inductor")
    for k in range(2):
        _set_grads(ref, k), _set_grads(mine, k)
        ref_opt.step()
        step()
    for ps in (ref, mine):
        with torch.no_grad():
            ps[0].mul_(0.5)
            ps[1].set_(ps[1].detach() * 2)  # other memory under the same parameter
        torch.autograd.graph.increment_version(ps[2])
    for k in range(2, 2 + STEPS):
        _set_grads(ref, k), _set_grads(mine, k)
        ref_opt.step()
        step()
    for a, b in zip(_tensors(ref, ref_opt), _tensors(mine, my_opt), strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
    assert [t._version for t in _tensors(mine, my_opt)] == [
        t._version for t in _tensors(ref, ref_opt)
    ]
    for ps, run in ((ref, ref_opt.step), (mine, step)):
        loss = sum((p * p).sum() for p in ps)  # mul saves each parameter
        run()
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()  # type: ignore[union-attr]
