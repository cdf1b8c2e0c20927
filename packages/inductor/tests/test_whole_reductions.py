"""Reductions of all elements (issue 19, session 20): bfloat16 sums whose float partial spans
several rows (``codegen_accum.row_group``) and argmax/argmin of everything as two order-free
reductions (``lower_argmax``), against eager and float64, with the structure that made each
faster. docs/performance.md, "Reductions (session 20)", has the timings.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph, decompositions, settings

T = torch.Tensor


def _compile(fn: Callable[..., Any], *args: T) -> Any:
    gm = make_fx(fn, decomposition_table=decompositions())(*args)
    with warnings.catch_warnings(), settings.section.patch(graph_cache=False):
        warnings.simplefilter("ignore")  # a cached graph has no source
        return compile_graph(gm, list(args), {"graph_cache": False})


def _one(out: Any) -> T:
    return out[0] if isinstance(out, tuple | list) else out


# (shape, rows sharing one float partial): 8 rows of 1024 fill ROW_PARTIAL (8192); a group
# divides the rows; rows longer than 4096 stand alone; a 3-d input groups its middle dim
GROUPS = [((1024, 1024), 8), ((6, 1024), 2), ((5, 1024), 1), ((64, 8192), 1), ((3, 8, 512), 8)]


@pytest.mark.parametrize(("shape", "group"), GROUPS)
def test_a_bfloat16_sum_of_everything_adds_rows_in_groups(
    shape: tuple[int, ...], group: int
) -> None:
    torch.manual_seed(0)
    x = (torch.randn(shape) + 0.5).bfloat16()
    compiled = _compile(lambda x: (x.sum(), x.mean()), x)
    exact = x.double().sum()
    got_sum, got_mean = compiled(x)
    torch.testing.assert_close(got_sum, x.sum(), rtol=8e-3, atol=0)
    torch.testing.assert_close(got_mean, x.mean(), rtol=8e-3, atol=0)
    # the float total before it is rounded to bfloat16: one double sum of float partials
    float_total = _one(_compile(lambda x: x.float().sum(), x)(x))
    assert abs(float(float_total) - float(exact)) <= 1e-5 * float(x.double().abs().sum())
    src = compiled.source
    if group > 1:  # one simd loop over the group's rows, the outer loop stepping by it
        assert re.search(r"#pragma omp simd collapse\(2\) reduction\(\+:buf\d+_row\)", src), src
        assert f"_g += {group})" in src, src
    else:
        assert "collapse(2)" not in src, src


def test_a_float32_sum_keeps_one_partial_a_row() -> None:
    """Float32 rows keep a simd loop each: one 16-float chain over 8 rows waits on its own
    adds (46 -> 54 us for 1M), where a chain per row overlaps the next row's."""
    x = torch.randn(1024, 1024)
    compiled = _compile(lambda x: x.sum(), x)
    torch.testing.assert_close(_one(compiled(x)), x.sum(), rtol=1e-5, atol=1e-3)
    assert "collapse(2)" not in compiled.source
    assert re.search(r"#pragma omp simd reduction\(\+:buf\d+_row\)", compiled.source)


def test_a_product_of_everything_stays_in_double() -> None:
    """Float partial products restarted at 1 drift with a bias (codegen_accum.row_partials):
    the product keeps one double accumulator."""
    x = 1 + 1e-3 * torch.randn(256, 1024)
    compiled = _compile(lambda x: x.prod(), x)
    exact = float(x.double().prod())
    assert abs(float(_one(compiled(x))) - exact) / exact < 1e-6
    assert "_row" not in compiled.source and "double buf0_acc = 1;" in compiled.source


def _inputs() -> list[T]:
    torch.manual_seed(0)
    x = torch.randn(37, 53)
    ties = torch.zeros(8, 8)
    ties[3, 2] = ties[1, 6] = 1  # the first in logical order, not in memory order
    ties[5, 1] = ties[2, 7] = -1
    nans = x.clone()
    nans[20, 3] = nans[5, 7] = float("nan")
    ints = torch.randint(-3, 3, (37, 53))
    return [
        x,
        x.t(),
        x[:, ::2],
        x.bfloat16(),
        x.double(),
        torch.randn(3, 4, 5).permute(2, 0, 1),
        torch.randn(100),
        ties,
        ties.t(),
        nans,
        nans.t(),
        ints,
        ints.t(),
        torch.full((8, 8), float("-inf")),
        torch.full((8, 8), float("inf")),
        torch.zeros(8, 8).index_fill_(1, torch.tensor([2]), -0.0),
    ]


ARGS: dict[str, Callable[[T], T]] = {
    "argmax": lambda a: a.argmax(),
    "argmin": lambda a: a.argmin(),
    "argmax_keepdim": lambda a: a.argmax(keepdim=True),
}


@pytest.mark.parametrize("name", ARGS)
def test_argmax_of_everything_is_the_first_position_of_the_extreme(name: str) -> None:
    fn = ARGS[name]
    for a in _inputs():
        got = _one(_compile(fn, a)(a))
        want = fn(a)
        assert got.shape == want.shape and got.dtype == want.dtype, (a.shape, got, want)
        assert torch.equal(got, want), (a.shape, a.stride(), got, want)


def test_argmax_of_a_transposed_input_runs_in_memory_order_in_lanes() -> None:
    """One ordered argmax walked a transposed input in logical order, unravelling a flat
    index per element (``a[1024*(y0 % 1024) + y0/1024]``), one branch each: 3.3 ms for 1M
    floats. Now a vector max and a vector min of positions, both along memory."""
    x = torch.randn(256, 512).t()
    compiled = _compile(lambda a: a.argmax(), x)
    assert torch.equal(_one(compiled(x)), x.argmax())
    src = compiled.source
    assert "%" not in src.split("kernel0(")[1], src  # no flat index unravelled
    assert re.search(r"#pragma omp simd reduction\(max:buf\d+_acc\)", src), src
    assert re.search(r"#pragma omp simd reduction\(min:buf\d+_acc\)", src), src
    assert re.search(r"a_1\[\(y1 \+ \(512 \* y0\)\)\]", src), src  # contiguous loads


def test_argmax_along_a_dim_keeps_its_ordered_reduction() -> None:
    x = torch.randn(64, 48)
    compiled = _compile(lambda a: (a.argmax(1), a.argmin(0)), x)
    for got, want in zip(compiled(x), (x.argmax(1), x.argmin(0)), strict=True):
        assert torch.equal(got, want)
    assert "reduction(min:" not in compiled.source
