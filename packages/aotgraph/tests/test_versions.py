"""Version counters of the inputs a compiled call writes (``ember.aotgraph.versions``):
moved as far as eager's in-place ops move them, on graphs with one input written or
hundreds (an optimizer step's), whether the compiler writes the inputs' memory itself (no
counter moves) or the runtime copies the new values back; so autograd's check of saved
tensors fails ``backward()`` after a compiled update exactly where eager's does."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import pytest
import torch
from torch.autograd import _unsafe_preserve_version_counter

from ember.aotgraph import aot_compile
from ember.aotgraph.hints import input_updates
from ember.aotgraph.versions import Versions

T = torch.Tensor


def _in_place(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A compiler whose "kernels" write each new value into its input's memory, as the
    inductor backend's do: no version counter moves."""
    updates = input_updates(gm)

    def run(*args: Any) -> list[Any]:
        outs = list(gm(*args))
        for k, i in updates.items():
            t = args[i]  # (an inference tensor has no counter to keep)
            keep = nullcontext() if t.is_inference() else _unsafe_preserve_version_counter(t)
            with torch.no_grad(), keep:
                t.copy_(outs[k])
            outs[k] = args[i]
        return outs

    return run


def _copied(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    return gm  # new values as outputs: the runtime copies them back (one version each)


COMPILERS = {"in-place": _in_place, "copied": _copied}


def _update(*ts: T) -> T:
    """An update of many tensors, as an optimizer's: every third written twice, every third
    once, the rest only read."""
    total = ts[0].new_zeros(())
    for k, t in enumerate(ts):
        if k % 3 == 0:
            t.mul_(0.5).add_(1)
        elif k % 3 == 1:
            t.add_(2)
        total = total + t.sum()
    return total


def _tensors(n: int) -> list[T]:
    g = torch.Generator().manual_seed(n)
    return [torch.randn(k % 4 + 1, generator=g) for k in range(n)]


@pytest.mark.parametrize("compiler", list(COMPILERS))
@pytest.mark.parametrize("n", [1, 2, 300])
def test_counters_move_as_in_eager_over_calls(compiler: str, n: int) -> None:
    want, mine = _tensors(n), _tensors(n)
    compiled = aot_compile(_update, _tensors(n), fw_compiler=COMPILERS[compiler], cache=False)
    for call in range(3):
        if call == 2:  # the caller moves some counters between calls (and writes one)
            for ts in (want, mine):
                ts[0].add_(1)
                torch.autograd.graph.increment_version(ts[-1])
        torch.testing.assert_close(compiled(*mine), _update(*want))
        assert [t._version for t in mine] == [t._version for t in want]
        torch.testing.assert_close(mine, want)
    assert len(compiled.inference.versions.deltas) == sum(k % 3 != 2 for k in range(n))


def test_a_storage_swapped_by_set_between_calls() -> None:
    want, mine = _tensors(4), _tensors(4)
    compiled = aot_compile(_update, _tensors(4), fw_compiler=_in_place, cache=False)
    compiled(*mine), _update(*want)
    for ts in (want, mine):  # other memory under the same tensors (set_ moves the counter)
        ts[0].set_(torch.full_like(ts[0], 3.0))
        ts[1].set_(torch.full_like(ts[1], 4.0))
    torch.testing.assert_close(compiled(*mine), _update(*want))
    assert [t._version for t in mine] == [t._version for t in want]
    torch.testing.assert_close(mine, want)


def _sgd(w: T, b: T) -> None:
    w.add_(w * -0.1)  # two updates of one input: its counter moves by 2 in eager
    w.mul_(0.99)
    b.add_(1)


@pytest.mark.parametrize("compiler", list(COMPILERS))
def test_backward_after_a_compiled_update_fails_as_in_eager(compiler: str) -> None:
    results = []
    examples = [torch.ones(3), torch.ones(3)]
    for step in (_sgd, aot_compile(_sgd, examples, fw_compiler=COMPILERS[compiler], cache=False)):
        w, b = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
        loss = (w * w).sum() + b.sum()  # mul saves w; b's sum saves nothing
        with torch.no_grad():
            step(w, b)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward(retain_graph=True)
        # b alone: nothing it needs was saved, so no check fails
        b2 = torch.ones(3, requires_grad=True)
        loss2 = b2.exp().sum()  # exp saves its result, not b2
        with torch.no_grad():
            step(torch.ones(3), b2)
        loss2.backward()
        results.append((w.detach().clone(), b.detach().clone(), b2.grad))
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want)


def test_inference_tensors_among_the_written_inputs() -> None:
    examples = [torch.zeros(2), torch.zeros(3), torch.zeros(2)]
    compiled = aot_compile(_update, examples, fw_compiler=_in_place, cache=False)
    compiled(*examples)  # traced here: in inference mode no counter would show eager's deltas
    with torch.inference_mode():
        frozen = [torch.ones(3), torch.ones(3)]  # no counters
    want, mine = (
        [torch.ones(2), frozen[0], torch.ones(2)],
        [torch.ones(2), frozen[1], torch.ones(2)],
    )
    with torch.inference_mode():
        torch.testing.assert_close(compiled(*mine), _update(*want))
    # the inference tensor (position 1) has none; the others move as in eager
    assert [mine[k]._version for k in (0, 2)] == [want[k]._version for k in (0, 2)] == [2, 0]
    torch.testing.assert_close(mine, want)


def test_versions_of_one_two_and_no_inputs() -> None:
    x, y = torch.zeros(1), torch.zeros(1)
    one = Versions.of(((1, 3),))
    reading = one.read([x, y])
    reading.advance()
    assert (x._version, y._version) == (0, 3)
    reading = Versions.of(((0, 2), (1, 1))).read([x, y])
    y.add_(1)  # the runtime's own write: the counter is set, not moved further
    reading.advance()
    assert (x._version, y._version) == (2, 4)
    Versions.of(()).read([x]).advance()
    assert x._version == 2
