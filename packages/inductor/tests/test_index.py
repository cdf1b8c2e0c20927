"""``x[i, j]`` (``aten.index.Tensor``) lowered into kernels: every placement of the indexed
dimensions against eager, negative indices, eager's IndexError for one out of range, the
causal mask a language model builds, and what stays the aten call (boolean masks, indices
computed from inputs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph
from ember.inductor.scheduler import Extern

T = torch.Tensor
aten = torch.ops.aten


def _compiled(fn: Callable[..., Any], *args: Any, options: Any = None) -> Any:
    opts = {"graph_cache": False, **(options or {})}
    return compile_graph(make_fx(fn)(*args), list(args), opts)


def _externs(compiled: Any) -> list[Any]:
    return [s.target for s in compiled.schedule.steps if isinstance(s, Extern)]


def _same(got: Any, want: T) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=0, rtol=0)


X = torch.arange(3 * 4 * 5, dtype=torch.float32).view(3, 4, 5)
I0 = torch.tensor([[2, 0], [-1, 1]])  # rows, one counted from the end
I1 = torch.tensor([3, -4])  # broadcasts against I0's rows
I2 = torch.tensor([[4], [0]], dtype=torch.int32)

CASES: dict[str, tuple[Callable[..., T], tuple[T, ...]]] = {
    "one": (lambda x, i: x[i] * 2, (X, I0)),
    "two_broadcast": (lambda x, i, j: x[i, j] + 1, (X, I0, I1)),
    "all_three": (lambda x, i, j, k: x[i, j, k] - 1, (X, I0, I1, I2)),
    "middle": (lambda x, j: x[:, j] * 3, (X, I1)),
    "last_two": (lambda x, j, k: x[:, j, k] + 2, (X, I1, I2)),
    "apart": (lambda x, i, k: x[i, :, k] * 2, (X, I0, I2)),  # the index shape goes first
    "ellipsis": (lambda x, k: x[..., k] * 2, (X, I2)),
    "transposed_table": (lambda x, i, j: x.transpose(0, 2)[i, j] + 1, (X, I1, I0)),
    "scalar_index": (lambda x, i: aten.index.Tensor(x, [None, i]) + 1, (X, torch.tensor(-2))),
    "int_table": (lambda x, i: x.long()[i] + 1, (X, I0)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_indexing_matches_eager_in_a_kernel(case: str, options: Any) -> None:
    fn, args = CASES[case]
    compiled = _compiled(fn, *args, options=options)
    assert aten.index.Tensor not in _externs(compiled)
    _same(compiled(*args), fn(*args))


def test_the_causal_mask_of_a_language_model_is_one_kernel() -> None:
    """transformers builds its mask with ``x[batch, q]`` over ``arange`` positions: those
    indices lie in range by construction, so nothing is checked at run time."""

    def mask(positions: T) -> T:
        b = torch.arange(2).view(2, 1, 1, 1)
        q = torch.arange(8).view(1, 1, 8, 1)
        kv = torch.arange(8).view(1, 1, 1, 8)
        same_doc = positions[b, q] == positions[b, kv]
        return same_doc & (positions[b, kv] <= positions[b, q])

    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6, 7]])
    compiled = _compiled(mask, positions)
    assert _externs(compiled) == [] and compiled.schedule.program.index_checks == []
    _same(compiled(positions), mask(positions))


@pytest.mark.parametrize(
    ("fn", "bad"),
    [
        (lambda x, i: x[i] + 1, torch.tensor([0, 3])),
        (lambda x, i: x[i] + 1, torch.tensor([-4, 0])),
        (lambda x, i: x[:, i] + 1, torch.tensor([[1], [4]])),
        (lambda x, i: x[:, :, i] + 1, torch.tensor([-6])),
        (lambda x, i: x[torch.tensor([0, 1]), i] + 1, torch.tensor([1, 7])),
    ],
    ids=["past_end", "negative_past_start", "middle", "last", "second_of_two"],
)
def test_an_index_out_of_range_raises_eagers_error(fn: Callable[..., T], bad: T) -> None:
    compiled = _compiled(fn, X, torch.zeros_like(bad))
    assert aten.index.Tensor not in _externs(compiled)
    assert compiled.schedule.program.index_checks
    with pytest.raises(IndexError) as want:
        fn(X, bad)
    with pytest.raises(IndexError) as got:
        compiled(X, bad)
    assert str(got.value) == str(want.value)
    good = bad.clamp(-2, 2)
    _same(compiled(X, good), fn(X, good))


def test_every_index_from_minus_size_to_size_minus_one_is_read_as_eager() -> None:
    i = torch.arange(-4, 4)
    compiled = _compiled(lambda x, i: x[:, i] * 1, X, i)
    _same(compiled(X, i), X[:, i])


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, i: x[i > 0] + 1,  # a mask: the result's size depends on the data
        lambda x, i: x[i * 2] + 1,  # computed from an input: the aten call checks its range
    ],
    ids=["mask", "computed"],
)
def test_what_a_kernel_cannot_check_runs_as_the_aten_call(fn: Callable[..., T]) -> None:
    x, i = torch.randn(4, 3), torch.tensor([1, 0, -1, 1])
    compiled = _compiled(fn, x, i)
    _same(compiled(x, i), fn(x, i))
    if fn(x, i).shape[0] == 4:  # (the computed index)
        assert aten.index.Tensor in _externs(compiled)
        with pytest.raises(IndexError):
            compiled(x, torch.tensor([2, 0, 0, 0]))


def test_a_dynamic_table_and_index() -> None:
    """Sizes as symbols: the index wraps and is checked against the table's symbolic size."""

    def f(x: T, i: T) -> T:
        return x[i] * 2

    x, i = torch.randn(6, 4), torch.tensor([5, -6, 0])
    gm = make_fx(f, tracing_mode="symbolic")(x, i)
    compiled = compile_graph(gm, [x, i], {"graph_cache": False})
    assert aten.index.Tensor not in _externs(compiled)
    for rows, idx in [(6, [5, -6, 0]), (9, [8, -1, 2, 3, 4]), (2, [1])]:
        x, i = torch.randn(rows, 4), torch.tensor(idx)
        _same(compiled(x, i), f(x, i))
    with pytest.raises(IndexError, match="index 2 is out of bounds for dimension 0 with size 2"):
        compiled(torch.randn(2, 4), torch.tensor([2]))
