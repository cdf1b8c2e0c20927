"""The Triton printer under Triton's interpreter (CPU tensors, ``cpu_backend="triton"``),
against eager: pointwise, reductions (persistent and looped), Welford, half precision,
externs with epilogues, and the graphs it declines (which the C++ printer then takes).

Triton reads ``TRITON_INTERPRET`` when it decorates a kernel, and compiles its own
standard library (``tl.sum``, ...) for one mode when it is first imported: this module
imports triton with the variable set, restores the environment, and sets it again only
while each test runs. If triton was imported before without it, the tests are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph, settings, wrapper_triton

pytestmark = pytest.mark.interpreted_triton  # skipped where no interpreter (conftest)

T = torch.Tensor
OPTIONS = {"cpu_backend": "triton", "graph_cache": False}


def _compiled(fn: Callable[..., Any], *inputs: T, atol: float | None = None) -> Any:
    """``fn`` traced and compiled by the Triton printer; its outputs checked against eager
    (``atol``: for long float sums, which add in another order than eager's)."""
    compiled = compile_graph(make_fx(fn)(*inputs), list(inputs), OPTIONS)
    assert compiled.target is not None and compiled.target.printer == "triton"
    got, want = compiled(*inputs), fn(*inputs)
    tol = {} if atol is None else {"atol": atol, "rtol": 1e-5}
    torch.testing.assert_close(got, want, equal_nan=True, **tol)
    return compiled


def test_pointwise_chain_over_a_ragged_size_is_one_flat_kernel() -> None:
    x, y = torch.randn(1000), torch.randn(1000)
    compiled = _compiled(lambda x, y: ((x * 2 + y).relu().exp() - y.abs()).sigmoid(), x, y)
    assert compiled.source.count("@triton.jit\ndef kernel") == 1
    assert "index < 1000" in compiled.source  # 1024-wide blocks, the last one masked


def test_broadcasting_and_ragged_rows() -> None:
    x, b, c = torch.randn(37, 129), torch.randn(129), torch.randn(37, 1)
    _compiled(lambda x, b, c: (x + b) * c - b.sqrt().nan_to_num(), x, b, c)


def test_transposed_and_strided_inputs() -> None:
    x = torch.randn(64, 48)
    _compiled(lambda x: x.t().exp() + x.t().cos(), x)
    _compiled(lambda x: x[:, ::3] * 2 + 1, x)
    _compiled(lambda x: x.t().contiguous() * x.t(), x.t())  # a transposed input itself


def test_softmax_persistent_and_looped() -> None:
    short = _compiled(lambda x: torch.softmax(x, -1), torch.randn(37, 129))
    assert "for roffset" not in short.source  # a row of 129 in one block
    long = _compiled(lambda x: torch.softmax(x, -1), torch.randn(3, 3000))
    assert "for roffset in range(0, 3000, 1024)" in long.source
    _compiled(lambda x: torch.log_softmax(x, 0), torch.randn(50, 7))  # over the non-last dim


def test_layer_norm_mean_and_variance_in_one_kernel() -> None:
    x, w, b = torch.randn(37, 129), torch.randn(129), torch.randn(129)
    fn = lambda x, w, b: torch.nn.functional.layer_norm(x, (129,), w, b)  # noqa: E731
    compiled = _compiled(fn, x, w, b)
    assert "_ember_welford)" not in compiled.source  # a row in one block: two passes
    _compiled(lambda x: torch.var_mean(x, 0, correction=0), torch.randn(33, 65))


@pytest.mark.slow
def test_looped_welford_and_argmax() -> None:
    compiled = _compiled(lambda x: x.var(-1) + x.mean(-1), torch.randn(4, 2000) + 100)
    assert "_ember_welford)" in compiled.source  # lanes joined by Chan's formula
    long = torch.randn(3, 5000)
    _compiled(lambda t: (t.argmax(1), t.amax(1), t.sum(1)), long)  # lanes joined


def test_long_columns_run_in_square_blocks() -> None:
    compiled = _compiled(lambda x: (x.sum(0), x.amax(0)), torch.randn(1100, 70), atol=1e-4)
    assert "for roffset in range(0, 1100, 64)" in compiled.source


def test_reductions_over_last_and_other_dims() -> None:
    x = torch.randn(37, 129)
    x[3, 5] = float("nan")

    def fn(x: T) -> tuple[T, ...]:
        return x.sum(0), x.amax(1), x.amin(0), x.argmax(-1), x.argmin(0), x.prod(1), x.sum()

    _compiled(fn, x)
    ties = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    _compiled(lambda t: (t.argmax(1), t.argmin(1), t.argmax(0)), ties)  # first wins


def test_bool_and_integer_kernels() -> None:
    x = torch.randn(40, 30)
    i = torch.randint(-50, 50, (40, 30))

    def fn(x: T, i: T) -> tuple[T, ...]:
        m = x > 0
        return m.any(1), m.all(0), torch.where(m, i * 3, i - 7), (i % 5) + i.abs(), x.isnan()

    _compiled(fn, x, i)
    _compiled(lambda i: (i.sum(1), i.amax(0), i.argmin(1)), i)


def test_math_functions() -> None:
    x = torch.linspace(-3, 3, 333)

    def fn(x: T) -> tuple[T, ...]:
        return x.tanh(), x.expm1(), x.abs().log1p(), x.erf(), x.trunc(), x.rsqrt(), x.sin()

    _compiled(fn, x)
    _compiled(fn, x.double())


def test_half_and_bfloat16_compute_in_float32() -> None:
    x = torch.randn(37, 129)
    for dtype in (torch.float16, torch.bfloat16):
        compiled = _compiled(lambda x: (torch.softmax(x, -1) * 3).tanh(), x.to(dtype))
        assert ".to(tl.float32)" in compiled.source
        _compiled(lambda x: x.sum(0) + x.amax(0), x.to(dtype))


def test_mm_extern_with_its_epilogue() -> None:
    x, w, b = torch.randn(16, 32), torch.randn(32, 24), torch.randn(24)
    compiled = _compiled(lambda x, w, b: torch.nn.functional.gelu(x @ w + b), x, w, b)
    assert "extern" in str(compiled.schedule)


def test_embedding_reads_through_its_indices() -> None:
    w, idx = torch.randn(10, 8), torch.randint(0, 10, (4, 5))
    _compiled(lambda w, i: torch.embedding(w, i).relu() * 2, w, idx)


def test_a_graph_the_printer_declines_falls_back_to_cpp(tmp_path: Path) -> None:
    x = torch.rand(20, 30) + 0.5
    fn = lambda x: x ** torch.tensor(2.5)  # noqa: E731  POW: no libdevice under the interpreter
    with settings.section.patch(trace=True, trace_dir=str(tmp_path)):
        compiled = compile_graph(make_fx(fn)(x), [x], OPTIONS)
    torch.testing.assert_close(compiled(x), fn(x))
    assert compiled.target is None and 'extern "C"' in compiled.source  # the C++ printer
    (record,) = tmp_path.glob("*/target.txt")
    assert "fell back: the Triton printer declined: POW" in record.read_text()


def test_module_is_cached_by_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    x = torch.randn(9, 7)
    _compiled(lambda x: x * 5 - 1, x)
    _compiled(lambda x: x * 5 - 1, x)
    (module,) = (tmp_path / "inductor" / "triton").glob("*/*.py")
    assert "@triton.jit" in module.read_text()


def test_device_choice_and_bad_options() -> None:
    cpu, meta = torch.ones(2), torch.ones(2, device="meta")
    mixed = wrapper_triton.choose([cpu, meta], "triton")
    assert mixed.printer == "eager" and "several devices" in mixed.reason
    assert wrapper_triton.choose([meta], "cpp").printer == "eager"
    assert wrapper_triton.choose([cpu], "triton").printer == "triton"
    gm = make_fx(lambda x: x + 1)(cpu)
    with pytest.raises(ValueError, match="cpu_backend='cuda'"):
        compile_graph(gm, [cpu], {"cpu_backend": "cuda"})


def test_asking_for_triton_without_it_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wrapper_triton, "_triton", lambda: None)
    x = torch.ones(3)
    with pytest.raises(RuntimeError, match="needs triton"):
        compile_graph(make_fx(lambda x: x + 1)(x), [x], OPTIONS)
    assert wrapper_triton.choose([x], "cpp").printer == "cpp"  # C++ needs no triton


def test_a_kernel_triton_cannot_build_runs_the_graph_eagerly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ember.inductor.check as check_module

    class CompilationError(Exception):  # as Triton raises it
        __module__ = "triton.compiler.errors"

    def broken(*args: Any) -> None:
        raise CompilationError("at 3:4: unsupported")

    x = torch.randn(6, 5)
    fn = lambda x: (x.exp() + 1, x.sum(1))  # noqa: E731
    compiled = compile_graph(make_fx(fn)(x), [x], OPTIONS)
    compiled._kernels = dict.fromkeys(compiled._kernels, broken)
    monkeypatch.setattr(check_module, "enabled", lambda: False)  # as outside the tests
    with pytest.warns(UserWarning, match="failed to build, running eagerly"):
        got = compiled(x)
    for g, w in zip(got, fn(x), strict=True):
        torch.testing.assert_close(g, w)
    torch.testing.assert_close(compiled(x)[1], fn(x)[1])  # and from then on


def test_max_autotune_keeps_the_fastest_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mode='max-autotune' on Triton: the graph's module under each block size and warp
    count (autotune.triton_candidates), the fastest kept (here: a timer that prefers
    256-point programs with 8 warps, which the combined trial of the two winners gives)."""
    from ember.inductor import autotune

    def prefers(call: Any) -> float:
        source = call.func.source
        return 1.0 - 0.2 * ("tl.arange(0, 256)" in source) - 0.1 * ("num_warps=8" in source)

    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "seconds_per_call", prefers)
    x = torch.randn(64, 100)
    fn = lambda x: (x * 2).exp() + 1  # noqa: E731
    compiled = compile_graph(make_fx(fn)(x), [x], {**OPTIONS, "max_autotune": True})
    torch.testing.assert_close(compiled(x), fn(x))
    assert "tl.arange(0, 256)" in compiled.source and "num_warps=8" in compiled.source
    (record,) = (tmp_path / "inductor" / "autotune").glob("*.json")
    assert len(json.loads(record.read_text())["trials"]) == 10  # 9 candidates and the winners

    def no_timing(call: Any) -> float:
        raise AssertionError("timed again: the choice on disk was not used")

    monkeypatch.setattr(autotune, "seconds_per_call", no_timing)
    again = compile_graph(make_fx(fn)(x), [x], {**OPTIONS, "max_autotune": True})
    assert again.source == compiled.source


def test_max_autotune_times_triton_for_real(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every block size and warp count gives eager's numbers (a softmax: row kernels)."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    x = torch.randn(6, 40)
    fn = lambda x: torch.softmax(x, -1) * x.sum(0)  # noqa: E731
    compiled = compile_graph(make_fx(fn)(x), [x], {**OPTIONS, "max_autotune": True})
    torch.testing.assert_close(compiled(x), fn(x))
    from ember.inductor.autotune import triton_candidates
    from ember.inductor.knobs import knobs

    for chosen in triton_candidates():
        with knobs(chosen):
            one = compile_graph(make_fx(fn)(x), [x], OPTIONS)
        torch.testing.assert_close(one(x), fn(x))


MATMULS: dict[str, tuple[Callable[..., Any], list[tuple[int, ...]], torch.dtype]] = {
    "mm-relu": (lambda a, w: (a @ w).relu(), [(40, 24), (24, 33)], torch.float32),
    "linear-gelu-residual": (
        lambda x, w, b: F.gelu(F.linear(x, w, b)) + x[:, :20],  # a transposed weight
        [(37, 48), (20, 48), (20,)],
        torch.float32,
    ),
    "product-also-read-elsewhere": (
        lambda a, w: ((a @ w) * 3, (a @ w).sum(-1)),
        [(16, 16), (16, 16)],
        torch.float32,
    ),
    "half": (lambda a, w: (a @ w) * 2, [(32, 64), (64, 32)], torch.float16),
}


@pytest.mark.parametrize("name", MATMULS)
def test_matmul_template_with_its_epilogue(name: str) -> None:
    """Knobs(matmul="template"): ``mm`` (and ``addmm``) as a tiled ``tl.dot`` kernel with
    its consumers' pointwise work after it, against eager."""
    from ember.inductor.knobs import Knobs, knobs

    fn, shapes, dtype = MATMULS[name]
    inputs = [torch.randn(s).to(dtype) for s in shapes]
    with knobs(Knobs(matmul="template")):
        compiled = compile_graph(make_fx(fn)(*inputs), inputs, OPTIONS)
    assert "tl.dot(" in compiled.source and "extern" not in str(compiled.schedule)
    tol = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.float16 else {}
    torch.testing.assert_close(compiled(*inputs), fn(*inputs), **tol)


def test_max_autotune_keeps_the_template_or_the_extern(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The template is timed against the extern call; whichever is faster is kept."""
    from ember.inductor import autotune

    fn, shapes, _ = MATMULS["linear-gelu-residual"]
    inputs = [torch.randn(s) for s in shapes]
    for template_wins in (True, False):
        monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / str(template_wins)))
        monkeypatch.setattr(
            autotune,
            "seconds_per_call",
            lambda call, wins=template_wins: 1.0 - 0.5 * (("tl.dot(" in call.func.source) == wins),
        )
        options = {**OPTIONS, "max_autotune": True}
        compiled = compile_graph(make_fx(fn)(*inputs), inputs, options)
        assert ("tl.dot(" in compiled.source) == template_wins
        torch.testing.assert_close(compiled(*inputs), fn(*inputs))
