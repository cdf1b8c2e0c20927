"""aot_compile on inputs that share storage, inputs written or restrided in place, and
outputs a compiler returns in one storage: results, inputs after the call, version counters,
aliasing and gradients as in eager; what cannot be compiled raises NotImplementedError."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from ember.aotgraph import aot_compile, store
from ember.aotgraph.aliasing import Merge, fresh_copy, outputs_to_clone


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("EMBER_AOT_CACHE", raising=False)


def as_is(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    return gm


def compile_(fn: Callable[..., Any], inputs: list[Any], **kwargs: Any) -> Any:
    return aot_compile(torch.fx.symbolic_trace(fn), inputs, fw_compiler=as_is, **kwargs)


def state(t: torch.Tensor) -> tuple[Any, ...]:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t._version, t.tolist())


def view_written_base_read(base, view):
    view.mul_(2)
    return base + 1


def rows() -> list[torch.Tensor]:
    base = torch.arange(6.0).reshape(3, 2)
    return [base, base[1]]


@pytest.mark.parametrize("cache", [False, True])
def test_inputs_sharing_a_written_storage_are_merged(cache):
    f = compile_(view_written_base_read, rows(), cache=cache)
    placeholders = f.inference_graph.graph.find_nodes(op="placeholder")
    assert len(placeholders) == 1  # one base for both inputs
    for _ in range(2):
        got, want = rows(), rows()
        torch.testing.assert_close(f(*got), view_written_base_read(*want))
        assert [state(t) for t in got] == [state(t) for t in want]
    again = compile_(view_written_base_read, rows(), cache=cache)  # from the disk cache
    assert again.cache_hit is (True if cache else None)
    got, want = rows(), rows()
    torch.testing.assert_close(again(*got), view_written_base_read(*want))
    assert [state(t) for t in got] == [state(t) for t in want]


def test_inputs_sharing_storage_unwritten_are_not_merged():
    f = compile_(lambda a, b: a + b, rows())
    assert len(f.inference_graph.graph.find_nodes(op="placeholder")) == 2


def test_merge_of_the_same_tensor_twice():
    t = torch.arange(4.0)
    merge = Merge.of([t, t, torch.ones(1)], versions=(1, 1, 0), grad=False)
    assert merge is not None and merge.kept == (0, 2)
    base, _ = merge.inputs([t, t, torch.ones(1)])
    assert base.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    assert base._version == t._version  # a view: writes to it move the caller's counter


def test_shared_storage_of_two_dtypes_written_is_refused():
    x = torch.zeros(4)
    with pytest.raises(NotImplementedError, match="different dtypes"):
        Merge.of([x, x.view(torch.int32)], versions=(1, 1), grad=False)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: (x.add_(1), x.mul_(2), x.sum())[2],
        lambda x: (x[0].add_(1), x[1].add_(1), x * 2)[2],
        lambda x: (x.t_(), x + 1)[1],
    ],
    ids=["two-ops", "two-views", "t_"],
)
def test_version_counter_moves_as_in_eager(fn):
    f = compile_(fn, [torch.ones(2, 2)])
    for _ in range(2):
        got, want = torch.ones(2, 2), torch.ones(2, 2)
        torch.testing.assert_close(f(got), fn(want))
        assert state(got) == state(want)


def test_out_argument_grown_past_its_storage():
    def fn(x, out):
        torch.mul(x, 3, out=out)
        return out + 1

    f = compile_(fn, [torch.ones(2, 3), torch.empty(0)])
    got, want = [torch.ones(2, 3), torch.empty(0)], [torch.ones(2, 3), torch.empty(0)]
    torch.testing.assert_close(f(*got), fn(*want))
    assert [state(t) for t in got] == [state(t) for t in want]


def test_written_input_that_requires_grad_gets_eagers_history():
    def fn(x, w):
        y = x * w
        x.mul_(w)
        return x * y

    results = []
    for run in (fn, None):
        leaf, w = torch.arange(1.0, 4.0, requires_grad=True), torch.full((3,), 2.0)
        x = leaf * 1
        if run is None:
            run = compile_(fn, [x, w])
        out = run(x, w)
        (out.sum() + x.sum()).backward()
        results.append((out.detach(), x.detach(), leaf.grad, x._version))
    (o1, x1, g1, v1), (o2, x2, g2, v2) = results
    torch.testing.assert_close((o2, x2, g2), (o1, x1, g1))
    assert v1 == v2


def test_requires_grad_set_inside_takes_the_gradient_from_there():
    def fn(x):
        y = x * 2  # before requires_grad_(): no gradient flows through y
        x.requires_grad_()
        return (x * y).sum()

    f = compile_(fn, [torch.arange(3.0)])
    for run in (fn, f, f):
        x = torch.arange(3.0)
        out = run(x)
        assert x.requires_grad and out.requires_grad
        out.backward()
        torch.testing.assert_close(x.grad, 2 * torch.arange(3.0))


def test_requires_grad_false_inside_is_refused():
    with pytest.raises(NotImplementedError, match="requires_grad_"):
        compile_(lambda x: (x.requires_grad_(False), x * 2)[1], [torch.ones(2, requires_grad=True)])


def test_outputs_a_compiler_merged_are_copied():
    def merging(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        def run(*args: Any) -> list[Any]:
            outs = gm(*args)
            return [outs[0], outs[0], *outs[2:]]  # as a compiler that merges equal outputs

        return run

    fn = torch.fx.symbolic_trace(lambda x: (x % 3, torch.remainder(x, 3)))
    f = aot_compile(fn, [torch.arange(4.0)], fw_compiler=merging)
    for _ in range(2):
        a, b = f(torch.arange(4.0))
        assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
        a.add_(10)
        torch.testing.assert_close(b, torch.arange(4.0) % 3)


def test_outputs_to_clone_and_fresh_copy():
    y, x = torch.ones(2, 3), torch.ones(2)
    assert outputs_to_clone((0, 1), [], [y, y.t()]) == (1,)
    assert outputs_to_clone((0, 0), [], [y, y.t()]) == ()
    assert outputs_to_clone((0,), [x], [x[0]]) == (0,)
    copy = fresh_copy(y.t())
    assert (copy.stride(), copy._is_view()) == ((1, 3), True)
    assert fresh_copy(y)._base is None


def test_signature_fields_survive_the_disk_record():
    fn = torch.fx.symbolic_trace(lambda x, out: (torch.add(x, 1, out=out), x.t_(), x * 2)[2])
    f = aot_compile(fn, [torch.ones(2, 3), torch.empty(0)], fw_compiler=as_is)
    sig = store._decode_signature(store._encode_signature(f.inference.signature))
    assert sig == f.inference.signature
    assert sig.replaced == (1,) and {i for i, _ in sig.restrided} == {0, 1}
