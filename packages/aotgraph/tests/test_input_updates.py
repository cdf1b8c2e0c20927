"""The ``input_updates`` hint on the graphs ``aot_compile`` hands to compilers, and the
runtime around a compiler that honours it (writes the new values into the inputs and
returns them): values, gradients and version counters against eager, no copy back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from ember.aotgraph import JointGraph, Partition, aot_compile, partition_from_saved
from ember.aotgraph.hints import input_updates
from ember.aotgraph.runtime import write_back

T = torch.Tensor


class Honouring:
    """A compiler that runs the graph, then stores each hinted new value into its input, as a
    kernel would (no version bump), and returns the input in its place."""

    def __init__(self) -> None:
        self.hints: list[dict[int, int]] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        updates = input_updates(gm)
        self.hints.append(updates)

        def run(*args: Any) -> list[Any]:
            outs = list(gm(*args))
            for k, i in updates.items():
                with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(args[i]):
                    torch.Tensor.copy_(args[i], outs[k])  # (not a copy_ a test replaced)
                outs[k] = args[i]
            return outs

        return run


def _compile(fn: Callable[..., Any], *args: T) -> tuple[Any, Honouring]:
    compiler = Honouring()
    return aot_compile(fn, list(args), fw_compiler=compiler, cache=False), compiler


def _ema(x: T, buf: T) -> T:
    buf.mul_(0.9).add_(x.detach(), alpha=0.1)  # two in-place ops: version + 2
    return (x * 2).sum()


def _no_copy(t: T) -> T:
    """``t`` with a ``copy_`` that fails: the runtime must not copy into it."""

    def refuse(*args: Any, **kwargs: Any) -> T:
        raise AssertionError("copied back")

    t.copy_ = refuse  # type: ignore[method-assign]
    return t


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_new_values_written_in_place_match_eager_values_and_versions(grad: bool) -> None:
    x, buf = torch.randn(6, requires_grad=grad), torch.randn(6)
    compiled, compiler = _compile(_ema, x, buf.clone())
    want_buf = buf.clone()
    want = _ema(x, want_buf)
    mine = _no_copy(buf.clone())
    before = mine._version
    got = compiled(x, mine)
    assert compiler.hints[0] == {1: 1}  # output 0 is the sum, output 1 buf's new value
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(mine, want_buf)
    assert mine._version - before == want_buf._version == 2
    if grad:
        got.backward()
        torch.testing.assert_close(x.grad, torch.full((6,), 2.0))


def _reads_old(x: T, buf: T) -> T:
    y = (x * buf.clone()).sum()  # backward reads buf's old value (saved: see _save_inputs)
    buf.add_(1)
    return y


def _save_inputs(joint: JointGraph) -> Partition:
    """A partition that saves the inputs (primals) the backward graph needs, not clones."""
    names = {"primals_2"}
    return partition_from_saved(joint, [n for n in joint.gm.graph.nodes if n.name in names])


def test_an_input_the_backward_graph_reads_gets_no_hint() -> None:
    x, buf = torch.randn(5, requires_grad=True), torch.randn(5)
    compiler = Honouring()
    args = [x, buf.clone()]
    compiled = aot_compile(
        _reads_old, args, fw_compiler=compiler, partition=_save_inputs, cache=False
    )
    mine = buf.clone()
    compiled(x, mine).backward()
    assert compiled.partition.saved == ("primals_2",)
    assert compiler.hints[0] == {}  # the forward graph's: buf is saved
    torch.testing.assert_close(x.grad, buf)  # the old value, not buf + 1
    torch.testing.assert_close(mine, buf + 1)


def test_inputs_sharing_storage_get_no_hint() -> None:
    def f(a: T, b: T) -> T:
        a.add_(1)
        return b * 2

    base = torch.zeros(8)
    compiled, compiler = _compile(f, base[:4], base[4:])
    compiled(base[:4], base[4:])
    assert compiler.hints == [{}]
    torch.testing.assert_close(base, torch.tensor([1.0] * 4 + [0.0] * 4))


def test_a_compiler_ignoring_the_hint_gets_its_values_copied_back() -> None:
    x, buf = torch.randn(6), torch.randn(6)
    compiled = aot_compile(_ema, [x, buf.clone()], fw_compiler=lambda gm, ex: gm, cache=False)
    want_buf = buf.clone()
    _ema(x, want_buf)
    mine = buf.clone()
    compiled(x, mine)
    torch.testing.assert_close(mine, want_buf)
    assert mine._version == want_buf._version


def test_write_back_skips_a_value_over_the_inputs_memory_only() -> None:
    t = torch.zeros(4)
    write_back([_no_copy(t)], [0], [t.view_as(t)])  # autograd.Function's alias of an input
    u = torch.zeros(4)
    write_back([u], [0], [torch.ones(4)])
    torch.testing.assert_close(u, torch.ones(4))
    with pytest.raises(RuntimeError):  # a shape mismatch still fails as copy_ does
        write_back([torch.zeros(4)], [0], [torch.ones(3)])
