"""Per-op cliffs below eager (issue 19, ``benchmarks/bench_ops.py``): each fix's results
against eager, and the structural property that made it faster, so that it cannot come
back unnoticed. docs/performance.md, "Per-op cliffs fixed", has the timings. The last part:
reductions of all elements (session 20): bfloat16 sums whose float partial spans several rows
(``codegen_accum.row_group``) and argmax/argmin of everything as two order-free reductions
(``lower_argmax``), against eager and float64 (docs/performance.md, "Reductions (session 20)").
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
from ember.inductor.cpp_prelude import PRELUDE

T = torch.Tensor


def _compile(fn: Callable[..., Any], *args: T) -> Any:
    gm = make_fx(fn, decomposition_table=decompositions())(*args)
    with warnings.catch_warnings(), settings.section.patch(graph_cache=False):
        warnings.simplefilter("ignore")  # a cached graph has no source
        return compile_graph(gm, list(args), {"graph_cache": False})


def _with_nans(x: T, every: int) -> T:
    x = x.clone()
    x.view(-1)[::every] = float("nan")
    return x


def _prelude_function(name: str) -> str:
    match = re.search(rf"static inline \w+ {name}\(.*?\n(?=\S)", PRELUDE, re.S)
    assert match is not None, name
    return re.sub(r"//.*", "", match.group(0))  # the code, not its comments


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_min_of_mixed_layouts_propagate_nan_like_eager(dtype: torch.dtype) -> None:
    # x.t() with a contiguous y runs in 16x16 tiles, a loop gcc does not vectorise
    x = _with_nans(torch.randn(64, 96), 7).to(dtype).t()
    y = _with_nans(torch.randn(96, 64), 5).to(dtype)

    def f(x: T, y: T) -> tuple[T, ...]:
        return torch.maximum(x, y), torch.minimum(x, y), x.clamp(-0.5, 0.5), y.clamp_min(0.1)

    compiled = _compile(f, x, y)
    for got, want in zip(compiled(x, y), f(x, y), strict=True):
        torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)


def test_max_min_are_selects_not_branches() -> None:
    # a short circuit (`a > b || a != a`) is a branch where a loop is not vectorised,
    # mispredicted on random data: 4x slower scalar loops (bench_ops maximum t 0.48x)
    for name in ("ember_max", "ember_min"):
        body = _prelude_function(name)
        assert "||" not in body and "if (" not in body, body


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_sum_of_everything_adds_rows_in_float_lanes_then_in_double(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x = (torch.randn(512, 1024) + 0.5).to(dtype)

    def f(x: T) -> tuple[T, T]:
        return x.sum(), x.mean()

    compiled = _compile(f, x)
    exact = x.double().sum()
    for got, want in zip(compiled(x), f(x), strict=True):
        torch.testing.assert_close(
            got, want, rtol=8e-3 if dtype == torch.bfloat16 else 1e-5, atol=0
        )
    if dtype == torch.float32:  # no further from the exact sum than 2x eager's cascade
        assert abs(compiled(x)[0].double() - exact) <= 2 * abs(x.sum().double() - exact) + 1e-3
    # a double accumulator per element converts each and takes half the lanes: 2.4x slower;
    # 2-byte floats share one float partial among 8 rows (codegen_accum.row_group); a float
    # row adds in 32 lanes, then into its partial (codegen_accum.lane_split)
    if dtype == torch.bfloat16:
        partial = r"float buf\d+_row = 0;\n\s*#pragma omp simd collapse\(2\) reduction"
    else:
        partial = r"float buf\d+_row = 0; float buf\d+_row_v\[32\] = \{\};"
    assert re.search(partial + r"(.|\n)*reduction\(\+:buf\d+_row\)", compiled.source)
    assert re.search(r"buf\d+_acc \+= buf\d+_row;", compiled.source)


def test_long_rows_keep_the_double_accumulator() -> None:
    x = torch.randn(2, 20000)  # rows longer than ROW_PARTIAL: each lane would add 2500 floats
    compiled = _compile(lambda x: x.sum(), x)
    torch.testing.assert_close(compiled(x), x.sum(), rtol=1e-5, atol=1e-4)
    assert "_row" not in compiled.source


def test_the_index_check_is_one_pass_in_memory_order() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    from ember.inductor.wrapper_bind import _check_index

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[Any] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):  # type: ignore[no-untyped-def]
            self.seen.append((func, [a.stride() for a in args if isinstance(a, T)]))
            return func(*args, **(kwargs or {}))

    idx = torch.randint(0, 64, (64, 48)).t()  # a transposed index: aminmax walks strides
    with Ops() as ops:
        _check_index(idx, 64, "RuntimeError", "index {index} is out of bounds")
    views_and_reads = (torch.ops.aten.permute.default, torch.ops.aten._local_scalar_dense.default)
    passes = [(f, s) for f, s in ops.seen if f not in views_and_reads]
    # ((t >= 0) & (t < size)).all() was four passes and two bool tensors: 1.6 ms for 1M
    assert [f for f, _ in passes] == [torch.ops.aten.aminmax.default]
    assert passes[0][1] == [(48, 1)]  # the transposed index read in memory order


@pytest.mark.parametrize("layout", ["contig", "t"])
def test_gather_and_embedding_match_eager_and_raise_its_errors(layout: str) -> None:
    x = torch.randn(40, 40)
    idx = torch.randint(0, 40, (40, 40))
    if layout == "t":
        x, idx = x.t(), idx.t()

    def f(x: T, idx: T) -> tuple[T, T, T]:
        return (
            torch.gather(x, 1, idx),
            torch.nn.functional.embedding(idx, x),
            x.index_select(0, idx[0]),
        )

    compiled = _compile(f, x, idx)
    for got, want in zip(compiled(x, idx), f(x, idx), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    bad = idx.clone()
    bad[3, 5] = 40
    with pytest.raises(RuntimeError, match="index 40 is out of bounds"):
        compiled(x, bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
def test_transposed_operands_of_a_tile_are_staged_and_match_eager(dtype: torch.dtype) -> None:
    x = torch.randn(64, 96).mul(5).to(dtype).t()  # transposed: read across memory
    y = torch.randn(96, 64).mul(5).to(dtype)
    mask = torch.randn(64, 96).t() > 0

    def f(x: T, y: T, mask: T) -> tuple[T, ...]:
        if dtype == torch.bool:
            return x ^ y, torch.where(mask, x, y)
        outs = (torch.maximum(x, y), torch.where(mask, y, x), x.contiguous())
        if dtype.is_floating_point:
            outs += (torch.nn.functional.silu(x) * y, torch.tanh(x) * y + x)
        return outs

    compiled = _compile(f, x, y, mask)
    for got, want in zip(compiled(x, y, mask), f(x, y, mask), strict=True):
        torch.testing.assert_close(got, want, equal_nan=True)
        assert got.stride() == want.stride()
    # each tiled kernel copies its transposed operands to a local tile first: without it the
    # innermost loop has a load 1024 elements apart, which gcc does not vectorise (2-4x slower)
    kernels = compiled.source.split('extern "C" void kernel')[1:]
    assert kernels and all(re.search(r"_tile0\[16\]\[16\];", k) for k in kernels)
    assert all(re.search(r"= \w+_tile\d\[x2\]\[y0\];", k) for k in kernels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cat_of_a_transposed_input_stages_its_clamped_tile(dtype: torch.dtype) -> None:
    x, y = torch.randn(64, 48).to(dtype).t(), torch.randn(48, 32).to(dtype)

    def f(x: T, y: T) -> tuple[T, T]:  # (fused with a consumer: alone, aten's cat runs)
        return torch.cat([x, y], 1) * 2, torch.cat([y, x], 1).neg()

    compiled = _compile(f, x, y)
    for got, want in zip(compiled(x, y), f(x, y), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    staged = re.search(r"_tile0\[x2\]\[y0\] = x_1\[.*std::min", compiled.source)
    if dtype == torch.float32:
        # the copy reads x's rows through the cat's clamp (min(63, ...)) along memory: before,
        # the tile read them 64 elements apart (cat_cols f32 t 0.45x eager)
        assert staged
    else:  # y's clamped load would be a 16-bit gather in the vector loop: x86 has none
        assert not staged and "_tile" not in compiled.source


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cat_across_a_transposed_input_alone_runs_as_eagers_copy(dtype: torch.dtype) -> None:
    """cat_cols t: every tile read both inputs at clamped indices (0.36-0.71x eager); the
    aten cat alone is eager's speed. Along the rows, or fused, ember's kernel stays."""
    x, y = torch.randn(64, 48).to(dtype).t(), torch.randn(48, 32).to(dtype)
    cases: list[tuple[Callable[..., Any], tuple[T, ...], list[str]]] = [
        (lambda x, y: torch.cat([x, y], 1), (x, y), ["Extern"]),
        (lambda x, y: torch.cat([y, x], -1), (x, y), ["Extern"]),
        (lambda x, y: torch.cat([x, y], 1) * 2, (x, y), ["Kernel"]),
        (lambda x, y: torch.cat([x, x], 0), (x, y), ["Kernel"]),
        (lambda x, y: torch.cat([y, y], 1), (x, y), ["Kernel"]),  # no transposed input
    ]
    for fn, args, steps in cases:
        compiled = _compile(fn, *args)
        torch.testing.assert_close(compiled(*args), fn(*args), rtol=0, atol=0)
        assert _steps(compiled) == steps


def test_no_staging_without_a_transposed_load() -> None:
    x, y = torch.randn(64, 96), torch.randn(64, 96)
    compiled = _compile(lambda x, y: (x + y).exp(), x, y)
    torch.testing.assert_close(compiled(x, y), (x + y).exp())
    assert "_tile" not in compiled.source


def test_bf16_neg_and_abs_flip_the_sign_bit_only() -> None:
    x = torch.tensor([0.0, -0.0, 1.5, -3.25, float("inf"), -float("inf"), 1e-40, float("nan")])
    x = torch.cat([x, torch.randn(56)]).to(torch.bfloat16)

    def f(x: T) -> tuple[T, T, T]:
        return -x, x.abs(), (-x).exp()  # the last: neg feeds float math, no bit op

    compiled = _compile(f, x)
    for got, want in zip(compiled(x), f(x), strict=True):
        torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
        assert got[:6].view(torch.int16).tolist() == want[:6].view(torch.int16).tolist()
    kernels = compiled.source.split('extern "C" void kernel', 1)[1]
    # converting to float and back made bf16 neg 2.7x slower than eager
    assert "^ 0x8000u" in kernels and "& 0x7fffu" in kernels


EXACT_BF16: dict[str, Callable[..., T]] = {
    "relu": lambda x, y: torch.relu(x),
    "clamp": lambda x, y: x.clamp(-0.5, 0.5),
    "clamp_third": lambda x, y: x.clamp(-1 / 3, 1 / 3),  # eager rounds the bounds first
    "clamp_min_neg": lambda x, y: (-x).clamp_min(0.25),
    "maximum": torch.maximum,
    "masked": lambda x, y: torch.where(y > 0, x, 0.0),
    "where_inf": lambda x, y: torch.where(x > y, x.abs(), float("-inf")),
    "floor": lambda x, y: torch.floor(x),
    "ceil": lambda x, y: torch.ceil(y),
    "trunc": lambda x, y: torch.trunc(x),
}
ROUNDED_BF16: dict[str, Callable[..., T]] = {
    "add": lambda x, y: torch.maximum(x, y) + 1,
    "scaled": lambda x, y: x.clamp(-0.5, 0.5) * 3,
    "float32_input": lambda x, y: torch.relu(x.float() * 1.1).to(torch.bfloat16),
}


@pytest.mark.parametrize("name", sorted(EXACT_BF16) + sorted(ROUNDED_BF16))
def test_bf16_values_picked_from_bf16_values_are_stored_by_their_bits(name: str) -> None:
    """relu, clamp, max, masks of bfloat16 values compute in float but make values
    bfloat16 holds: stored as the float's top half, no rounding step (whose NaN test gcc
    threaded into clamp's selects: 0.56x eager); any other float is rounded."""
    special = [0.0, -0.0, 1.5, -3.25, float("inf"), -float("inf"), 1e-40, float("nan")]
    special += [-0.5, 127.5, -255.0, 3e38]
    x = torch.cat([torch.tensor(special), torch.randn(52) * 100]).to(torch.bfloat16)
    y = torch.cat([torch.tensor(special[::-1]), torch.randn(52) * 100]).to(torch.bfloat16)
    fn = {**EXACT_BF16, **ROUNDED_BF16}[name]
    compiled = _compile(lambda x, y: fn(x, y), x, y)
    got, want = compiled(x, y), fn(x, y)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    same = ~want.isnan()  # (NaN bits: eager's and the kernel's may differ in payload)
    assert got[same].view(torch.int16).tolist() == want[same].view(torch.int16).tolist()
    kernels = compiled.source.split('extern "C" void kernel', 1)[1]
    if name in EXACT_BF16:
        assert "ember_bf16_bits(" in kernels and "ember_float_to_bf16(" not in kernels, kernels
    else:  # (a bfloat16 intermediate, maximum's, may still be stored by its bits)
        assert "ember_float_to_bf16(" in kernels, kernels


BOUNDED: dict[str, Callable[[T], T]] = {
    "relu": torch.relu,
    "clamp": lambda x: x.clamp(-0.5, 0.5),
    "clamp_zero": lambda x: x.clamp(-0.0, 0.0),  # bounds that are signed zeros
    "clamp_inf": lambda x: x.clamp(-float("inf"), 2.0),
    "hardtanh": lambda x: torch.nn.functional.hardtanh(x),
    "hardswish": lambda x: torch.nn.functional.hardswish(x),
    "relu6_of_sum": lambda x: torch.nn.functional.relu6(x + x),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(BOUNDED))
def test_a_max_or_min_by_a_number_names_the_number_out_of_gccs_sight(
    name: str, dtype: torch.dtype
) -> None:
    """``max(x, c)`` is printed ``c > x ? c : x`` with ``c`` named through ``ember_opaque``
    before the loop (gcc folded a literal's select into compares and blends: clamp 0.7x
    eager); NaN, infinities and both zeros come out bit for bit as eager's."""
    special = [0.0, -0.0, 0.5, -0.5, 6.0, float("inf"), -float("inf"), float("nan"), 1e-40]
    x = torch.cat([torch.tensor(special), torch.randn(4087) * 4]).to(dtype).reshape(64, 64)
    fn = BOUNDED[name]
    compiled = _compile(fn, x)
    got, want = compiled(x), fn(x)
    assert got.isnan().equal(want.isnan())
    same = ~want.isnan()
    assert (
        got[same]
        .view(torch.int64 if dtype == torch.float64 else torch.int32)
        .equal(want[same].view(torch.int64 if dtype == torch.float64 else torch.int32))
    )
    kernels = compiled.source.split('extern "C" void kernel', 1)[1]
    assert "ember_opaque(" in kernels and "ember_max(" not in kernels, kernels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cols", [1024, 96, 1000])
def test_a_row_sum_keeps_32_lanes_apart_where_they_divide_the_row(
    cols: int, dtype: torch.dtype
) -> None:
    """A row sum (or product) along a contiguous row that 32 divides (twice or more) adds
    into 32 accumulators, four AVX2 vectors whose adds overlap (``codegen_accum.lane_split``;
    x.mean(-1) of 1M floats: 0.8x eager -> 1.1x); other rows keep ``omp simd reduction``.
    The sums stay about as close to the exact ones as eager's."""
    torch.manual_seed(0)
    x = (torch.randn(48, cols, dtype=torch.float64) + 3).to(dtype)
    x[0, 5], x[1, 7], x[2, 1] = float("nan"), float("inf"), -float("inf")

    def fn(x: T) -> tuple[T, T, T]:
        return x.mean(-1), (x * x).sum(-1), (x * 0.01 + 1).prod(-1)

    compiled = _compile(fn, x)
    got, want = compiled(x), fn(x)
    exact = x.double().mean(-1), (x.double() ** 2).sum(-1), (x.double() * 0.01 + 1).prod(-1)
    for g, w, e in zip(got, want, exact, strict=True):
        assert g.dtype == w.dtype and g.isnan().equal(w.isnan())
        assert g[:3].tolist()[1:] == w[:3].tolist()[1:]  # inf; -inf
        rest, bound = slice(3, None), (w[3:].double() - e[3:]).abs().max().item()
        assert (g[rest].double() - e[rest]).abs().max().item() <= max(3 * bound, 1e-6 * cols)
    kernels = compiled.source.split('extern "C" void kernel', 1)[1]
    assert ("_acc_v[32]" in kernels) == (cols % 32 == 0), kernels


def _steps(compiled: Any) -> list[str]:
    return [type(s).__name__ for s in compiled.schedule.steps]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_runs_as_aten_only_where_it_stands_alone(dtype: torch.dtype, approximate: str) -> None:
    x, y = torch.randn(64, 96).to(dtype), torch.randn(64, 96).to(dtype)
    F = torch.nn.functional

    def alone(x: T) -> T:
        return F.gelu(x, approximate=approximate)

    def fused(x: T, y: T) -> tuple[T, T, T]:  # a consumer, a producer, a reduction
        return (
            F.gelu(x, approximate=approximate) * y,
            F.gelu(x + y, approximate=approximate),
            F.gelu(x, approximate=approximate).sum(1),
        )

    one = _compile(alone, x)
    torch.testing.assert_close(one(x), alone(x))
    # eager's GELU (erf) is 1.6-2.3x faster than ember's kernel alone; with tanh ember's is
    # 1.8-2.6x faster than eager's
    assert _steps(one) == (["Extern"] if approximate == "none" else ["Kernel"])
    many = _compile(fused, x, y)
    tol = {"rtol": 1.6e-2, "atol": 1e-1} if dtype == torch.bfloat16 else {}
    for got, want in zip(many(x, y), fused(x, y), strict=True):
        torch.testing.assert_close(got, want, **tol)
    assert "Extern" not in _steps(many)  # fused chains keep their kernels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_addmm_stays_whole_under_a_gelu_that_stands_alone(dtype: torch.dtype) -> None:
    """``gelu(addmm(b, x, w))`` returned as it is: addmm keeps its bias (not split into mm
    and a fused add), so the GELU stands alone on its result and runs as eager's kernel
    (split, the add moved the GELU into ember's erf kernel: 0.67x eager in bfloat16). With
    a consumer after the GELU, the bias still fuses into the GELU's kernel."""
    F = torch.nn.functional
    b, x, w = (torch.randn(*s).to(dtype) for s in ((48,), (32, 16), (16, 48)))

    def alone(b: T, x: T, w: T) -> T:
        return F.gelu(torch.addmm(b, x, w))

    def consumed(b: T, x: T, w: T) -> T:
        return F.gelu(torch.addmm(b, x, w)) * 2

    tol = {"rtol": 1.6e-2, "atol": 1e-1} if dtype == torch.bfloat16 else {}
    one = _compile(alone, b, x, w)
    torch.testing.assert_close(one(b, x, w), alone(b, x, w), **tol)
    names = [str(s.target) for s in one.schedule.steps]
    assert names == ["aten.addmm.default", "aten.gelu.default"], names
    two = _compile(consumed, b, x, w)
    torch.testing.assert_close(two(b, x, w), consumed(b, x, w), **tol)
    assert [str(getattr(s, "target", "kernel")) for s in two.schedule.steps] == [
        "aten.mm.default",
        "kernel",
    ]


def test_the_gelu_kernel_matches_eager_in_float32() -> None:
    # (no infinities: eager's GELU gives NaN for both, the decomposition did not)
    x = torch.cat([torch.randn(4000) * 4, torch.tensor([0.0, -0.0, 10.0, -10.0])])
    y = torch.ones_like(x)
    F = torch.nn.functional
    compiled = _compile(lambda x, y: (F.gelu(x) * y, F.gelu(x, approximate="tanh") * y), x, y)
    for got, want in zip(compiled(x, y), (F.gelu(x), F.gelu(x, approximate="tanh")), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_float_product_of_everything_drifts_no_more_than_eagers(seed: int) -> None:
    """1M factors near 1: one float accumulator per lane drifted 0.77% off the exact product
    (eager 0.46%); accumulated in double, as a sum of everything is, it stays on it."""
    torch.manual_seed(seed)
    x = 1 + 1e-3 * torch.randn(1024, 1024)
    out = _compile(lambda t: t.prod(), x)(x)
    got = out[0] if isinstance(out, tuple | list) else out
    exact = float(x.double().prod())
    ours = abs(float(got) - exact) / exact
    eagers = abs(float(x.prod()) - exact) / exact
    assert ours <= 2 * eagers + 1e-6, (ours, eagers)


# --- reductions of all elements (session 20) ------------------------------------------


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
    adds (46 -> 54 us for 1M), where a chain per row overlaps the next row's. (The sum
    reads a value computed on the fly: alone it runs as aten, lower_alone.ATEN_ALONE.)"""
    x = torch.randn(1024, 1024)
    compiled = _compile(lambda x: x.abs().sum(), x)
    torch.testing.assert_close(_one(compiled(x)), x.abs().sum(), rtol=1e-5, atol=1e-3)
    assert "collapse(2)" not in compiled.source
    assert re.search(r"#pragma omp simd reduction\(\+:buf\d+_row\)", compiled.source)


def test_a_product_of_everything_stays_in_double() -> None:
    """Float partial products restarted at 1 drift with a bias (codegen_accum.row_partials):
    the product keeps one double accumulator (of a value computed on the fly: alone, the
    product runs as aten)."""
    x = 1 + 1e-3 * torch.randn(256, 1024)
    compiled = _compile(lambda x: x.abs().prod(), x)
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


def _targets(compiled: Any) -> list[str]:
    return [str(s.target) if hasattr(s, "target") else "kernel" for s in compiled.schedule.steps]


ALONE_REDUCTIONS = {  # lower_alone.ATEN_ALONE: float32 reductions that run as eager's kernel
    "sum()": (lambda x: x.sum(), "aten.sum.dim_IntList"),
    "amax()": (lambda x: x.amax(), "aten.amax.default"),
    "amin((0, 1))": (lambda x: x.amin((0, 1)), "aten.amin.default"),
    "prod()": (lambda x: x.prod(), "aten.prod.default"),
    "prod(-1)": (lambda x: x.prod(-1), "aten.prod.dim_int"),
    "sum(-1)": (lambda x: x.sum(-1), "aten.sum.dim_IntList"),
}


@pytest.mark.parametrize("name", sorted(ALONE_REDUCTIONS))
def test_a_float32_reduction_to_one_value_alone_runs_as_eagers_kernel(name: str) -> None:
    fn, target = ALONE_REDUCTIONS[name]
    x = 1 + 1e-3 * torch.randn(512, 256)
    compiled = _compile(fn, x)
    assert _targets(compiled) == [target]
    torch.testing.assert_close(_one(compiled(x)), fn(x), rtol=0, atol=0)  # eager's own kernel


KEPT_REDUCTIONS = {  # where ember's kernel is the faster, or the op does not stand alone
    "amax(-1)": (lambda x: x.amax(-1), torch.float32, (512, 256)),
    "column sum": (lambda x: x.sum(0), torch.float32, (512, 256)),
    "transposed product": (lambda x: x.t().prod(-1), torch.float32, (512, 256)),
    "bfloat16 sum()": (lambda x: x.sum(), torch.bfloat16, (512, 256)),
    "small sum()": (lambda x: x.sum(), torch.float32, (64, 64)),
    "fused sum()": (lambda x: (x * 2).sum(), torch.float32, (512, 256)),
    "sum() read twice": (lambda x: (x.sum(), x.sum() * 2), torch.float32, (512, 256)),
}


@pytest.mark.parametrize("name", sorted(KEPT_REDUCTIONS))
def test_other_reductions_keep_embers_kernel(name: str) -> None:
    fn, dtype, shape = KEPT_REDUCTIONS[name]
    x = (1 + 1e-3 * torch.randn(shape)).to(dtype)
    compiled = _compile(fn, x)
    assert "kernel" in _targets(compiled), _targets(compiled)
    got, want = compiled(x), fn(x)
    got = got if isinstance(want, tuple) else _one(got)
    torch.testing.assert_close(got, want, rtol=2e-2 if dtype == torch.bfloat16 else 1e-4, atol=0)


def test_a_reduction_of_symbolic_size_keeps_embers_kernel() -> None:
    """Under symbolic sizes a small size may come (an aten call's dispatch costs more than
    a small kernel), so the size is not guarded on for this choice."""
    x = torch.randn(512, 256)
    gm = make_fx(lambda x: x.sum(), tracing_mode="symbolic")(x)
    with settings.section.patch(graph_cache=False):
        compiled = compile_graph(gm, [x], {"graph_cache": False})
    assert _targets(compiled) == ["kernel"]
    for n in (3, 700):
        y = torch.randn(n, 256)
        torch.testing.assert_close(_one(compiled(y)), y.sum(), rtol=1e-5, atol=1e-3)
