"""Column reductions (codegen_tiles.py): reductions whose reduced dim is outer in memory run as
strips of outputs accumulated along the contiguous dim. Values against eager: max/min and
argmax/argmin with NaN and infinities (a NaN anywhere in a column gives NaN, argmax the
index of the first NaN), ragged and degenerate sizes, float32/float64/bfloat16, and float32
sums over long columns within the tolerance of benchmarks/bench_ops.py (4x eager's error)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph, decompositions
from ember.inductor.codegen_tiles import strip_width

T = torch.Tensor
ERROR_FACTOR = 4.0  # benchmarks/bench_ops.py: ember's error at most 4x eager's from float64


def _compile(fn: Callable[..., Any], *xs: T) -> Any:
    gm = make_fx(fn, decomposition_table=decompositions())(*xs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile_graph(gm, list(xs), {"graph_cache": False})


def _reductions(x: T) -> tuple[T, ...]:
    """Every kind over dim 0 (for a contiguous x, the dim outer in memory) in one graph."""
    return x.amax(0), x.amin(0), x.argmax(0), x.argmin(0), x.sum(0)


def _special(rows: int, cols: int, dtype: torch.dtype, seed: int) -> T:
    """Random values with NaN, +inf and -inf sprinkled in, a column of all -inf, one of
    all +inf, one with NaN twice (argmax: the first), and ties of the maximum."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    pick = torch.rand(rows, cols, generator=g)
    x[pick < 0.01] = float("nan")
    x[(pick >= 0.01) & (pick < 0.02)] = float("inf")
    x[(pick >= 0.02) & (pick < 0.03)] = float("-inf")
    if cols >= 4 and rows >= 3:
        x[:, 0], x[:, 1] = float("-inf"), float("inf")
        x[:, 2] = 1.0
        x[1, 2] = x[rows - 1, 2] = float("nan")
        x[:, 3] = torch.arange(rows) % 3  # ties of the max (first index wins)
    return x.to(dtype)


def _check(got: tuple[T, ...], want: tuple[T, ...]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        if g.is_floating_point() and g is not got[-1]:  # max/min: exact, NaN where eager's
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
        elif g.is_floating_point():  # the sum: NaN/inf where eager's, else close
            torch.testing.assert_close(g, w, rtol=1e-2, atol=1e-2, equal_nan=True)
        else:
            assert torch.equal(g, w), (g, w)


SIZES = [(37, 129), (1, 1000), (1000, 1), (64, 16), (300, 40)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_special_values_over_the_outer_dim_match_eager(
    size: tuple[int, int], dtype: torch.dtype
) -> None:
    x = _special(*size, dtype, seed=size[0] * 7 + size[1])
    compiled = _compile(_reductions, x)
    _check(compiled(x), _reductions(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_transposed_input_reduced_over_its_last_dim_matches_eager(dtype: torch.dtype) -> None:
    # x.t() reduced over -1: the rows of the reduction lie down memory's columns
    base = _special(129, 37, dtype, seed=3)

    def f(x: T) -> tuple[T, ...]:
        return x.amax(-1), x.amin(-1), x.argmax(-1), x.argmin(-1), x.sum(-1)

    compiled = _compile(f, base.t())
    _check(compiled(base.t()), f(base.t()))


@pytest.mark.parametrize("kind", ["amax", "amin", "argmax", "argmin"])
def test_a_single_max_or_arg_reduction_runs_as_a_column_kernel(kind: str) -> None:
    # alone in its kernel (no tiled copy of the input first), values as eager's
    x = _special(256, 200, torch.float32, seed=11)

    def f(x: T) -> T:
        return getattr(x.t(), kind)(-1)

    compiled = _compile(f, x)
    got, want = compiled(x), f(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert "xe = xb +" in compiled.source  # the column kernel's strips
    assert not [b for b in compiled.schedule.program.buffers if b.endswith("_r")]


def test_a_nan_anywhere_in_a_long_column_gives_nan() -> None:
    x = torch.randn(5000, 48)
    x[4321, 5] = float("nan")  # late in the column: after the max was found
    x[0, 7] = float("nan")  # first: nothing may replace it
    x[4999, 9] = float("nan")  # last row
    compiled = _compile(_reductions, x)
    got = compiled(x)
    for col in (5, 7, 9):
        assert got[0][col].isnan() and got[1][col].isnan() and got[4][col].isnan()
    assert (got[2][5], got[2][7], got[2][9]) == (4321, 0, 4999)
    _check(got, _reductions(x))


def _error(t: T, ref: T) -> float:
    return float((t.double() - ref).abs().max())


@pytest.mark.parametrize(
    "size, dim",
    [((1024, 1024), 0), ((256, 1024), 0), ((100000, 3), 0), ((20000, 64), 0), ((64, 20000), 1)],
)
def test_float32_sums_are_as_accurate_as_eager(size: tuple[int, int], dim: int) -> None:
    # the bench's rule: within assert_close, or at most 4x eager's error from float64
    x = torch.randn(*size, generator=torch.Generator().manual_seed(0))
    x = x if dim == 0 else x.t().contiguous().t()  # dim 1 of a column-major matrix

    def f(x: T) -> T:
        return x.sum(dim)

    got, want, ref = _compile(f, x)(x), f(x), f(x.double())
    assert _error(got, ref) <= ERROR_FACTOR * _error(want, ref) + 1e-6


def test_a_column_sum_of_bfloat16_matches_eager() -> None:
    x = torch.randn(2048, 96, dtype=torch.bfloat16)
    got, want = _compile(lambda x: x.sum(0), x)(x), x.sum(0)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_column_kernels_on_two_threads_match_eager() -> None:
    # strips narrower than the widest so each thread has some (ember_strip, per call)
    x = _special(300, 1000, torch.float32, seed=5)
    compiled = _compile(_reductions, x)
    old = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            _check(compiled(x), _reductions(x))
    finally:
        torch.set_num_threads(old)


def test_strip_width_is_the_row_up_to_the_widest_strip() -> None:
    assert strip_width(1024, 16) == 1024 and strip_width(4096, 16) == 1024
    assert strip_width(129, 16) == 144 and strip_width(8, 16) == 16
    assert strip_width(100, 32) == 128


def test_symbolic_sizes_run_column_kernels_with_nan() -> None:
    # a ranged kernel (codegen_ranges): tiles of the knob's width with run-time tails
    x = _special(70, 45, torch.float32, seed=9)
    gm = make_fx(_reductions, tracing_mode="symbolic", decomposition_table=decompositions())(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = compile_graph(gm, [x], {"graph_cache": False})
    assert "xe = xb +" in compiled.source
    for rows, cols in ((70, 45), (33, 100), (5, 17)):
        y = _special(rows, cols, torch.float32, seed=rows)
        _check(compiled(y), _reductions(y))


def test_two_folded_sums_in_one_column_kernel_match_eager() -> None:
    # a mean, then the sum of squares about it: two stages of one kernel, each folding its
    # float blocks into double totals (one counter per stage)
    x = torch.randn(300, 200) * 3 + 5

    def f(x: T) -> tuple[T, T]:
        return ((x - x.sum(0) / 300) ** 2).sum(0), x.sum(0) * 2

    compiled = _compile(f, x)
    for got, want in zip(compiled(x), f(x), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    assert compiled.source.count("_fold = 0;") >= 4  # declared and reset, per stage


def test_a_norms_weight_gradient_runs_in_strips_beside_its_row_kernel():
    """An RMS norm's backward: the weight gradient sums over the 128 tokens (a column sum);
    the input gradient reduces each token's 128 channels (a row sum). Equal lengths must not
    put them in one kernel: there each column was summed alone down a strided loop, and a
    per-token value read along the tokens (``rsqrt[y]``) does not stop the strips."""
    from ember.inductor.codegen_tiles import column_kernel
    from ember.inductor.scheduler import Kernel

    g, x, r, w = (
        torch.randn(2, 64, 128),
        torch.randn(2, 64, 128),
        torch.rand(2, 64, 1),
        torch.randn(128),
    )

    def f(g: T, x: T, r: T, w: T) -> tuple[T, T]:
        wgrad = (g * (x * r)).sum((0, 1))
        rows = (g * w * x).sum(-1, keepdim=True)
        return wgrad, g * w * r + rows * x * r.pow(3) / 128

    compiled = _compile(f, g, x, r, w)
    for got, want in zip(compiled(g, x, r, w), f(g, x, r, w), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    kernels = [s for s in compiled.schedule.steps if isinstance(s, Kernel)]
    sums = [k for k in kernels if any(s.reduce for st in k.stages for s in st.stores)]
    assert any(column_kernel(k) for k in sums), compiled.schedule
