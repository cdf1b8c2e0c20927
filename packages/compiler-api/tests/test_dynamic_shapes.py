"""Dynamic shapes (issue 18): symbolic sizes in capture, their guards, and the policy.

Each test compares with eager and counts graphs: ``dynamic=True`` serves every size with
one graph, the default compiles static first and goes dynamic after a size changes (two
graphs), ``dynamic=False`` compiles per size. Relations on sizes are guarded, so a size
that breaks one compiles again, never reuses a graph where eager differs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import ember.compiler
from ember.compiler import CompilationProfiler, MarkedDynamicError
from ember.compiler.testing import assert_same

BACKENDS = ["eager", "aot_eager", "inductor"]  # the backends that take symbolic sizes
SIZES = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    ember.compiler.reset()
    yield
    ember.compiler.reset()


def sweep(fn: Callable[..., Any], make: Callable[[int], tuple[Any, ...]], **kw: Any) -> Any:
    """``fn`` compiled with ``kw``, called on ``make(n)`` for each of SIZES, each result
    compared with eager's; the compiled object."""
    compiled = ember.compiler.compile(fn, **kw)
    for n in SIZES:
        args = make(n)
        assert_same(compiled(*args), fn(*args))
    assert compiled.stats.failures == [], compiled.stats.failures
    return compiled


def batch_ops(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    flat = x.reshape(-1)  # n * 6 elements
    half = flat[: n * 3].view(-1, 3)
    return half.sum(0) * n + torch.arange(n).float().mean() + x.size(1)


def default_graphs(backend: str, sizes: int) -> int:
    """Graphs the default policy makes over ``sizes`` sizes: two with automatic dynamic, else
    one per size (a backend that says ``automatic_dynamic = False``)."""
    return 2 if ember.compiler.backends.automatic_dynamic(backend) else sizes


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("dynamic", "graphs"), [(True, 1), (None, 2), (False, len(SIZES))])
def test_the_policy_decides_how_many_graphs_a_batch_sweep_makes(
    backend: str, dynamic: bool | None, graphs: int
) -> None:
    if dynamic is None:
        graphs = default_graphs(backend, len(SIZES))
    with ember.compiler.config.patch({"guards.cache_size_limit": 64}):
        compiled = sweep(
            batch_ops, lambda n: (torch.randn(n, 6),), backend=backend, dynamic=dynamic
        )
    assert compiled.stats.graphs == graphs


def lengths(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    seq = x.size(1)
    scores = x @ x.transpose(1, 2) / seq  # (b, s, s)
    scores = scores.masked_fill(mask[:, None, :seq] == 0, -1e9)
    return scores.softmax(-1).sum((1, 2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sequence_length_sweep_is_one_graph_with_dynamic_true(backend: str) -> None:
    def make(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(3, n, 4), (torch.rand(3, 16) > 0.3).float()

    compiled = sweep(lengths, make, backend=backend, dynamic=True)
    assert compiled.stats.graphs == 1
    with ember.compiler.config.patch({"guards.cache_size_limit": 64}):
        default = sweep(lengths, make, backend=backend)
    assert default.stats.graphs <= default_graphs(backend, len(SIZES))


def branchy(x: torch.Tensor) -> torch.Tensor:
    if x.shape[0] > 4:  # a relation guard: s0 > 4 (or its negation)
        return x * 2
    return x - 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_branch_on_a_size_guards_the_relation_and_recompiles_across_it(backend: str) -> None:
    compiled = ember.compiler.compile(branchy, backend=backend, dynamic=True)
    for n in [6, 7, 9, 3, 2, 4, 5, 8]:
        x = torch.randn(n)
        assert_same(compiled(x), branchy(x))
    assert compiled.stats.graphs == 2  # one for s0 > 4, one for 2 <= s0 <= 4


def scaled_rows(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0) * x.shape[0] + x.expand(x.shape[0], 6).amax(0, keepdim=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sizes_0_and_1_specialise_and_stay_correct(backend: str) -> None:
    compiled = ember.compiler.compile(scaled_rows, backend=backend, dynamic=True)
    for n in [5, 1, 7, 1, 3]:
        x = torch.randn(n, 6)
        assert_same(compiled(x), scaled_rows(x))
    assert compiled.stats.graphs == 2  # symbolic (>= 2), and size 1
    x = torch.randn(0, 6)
    with pytest.raises(IndexError, match="amax"):  # eager's error, raised by eager
        scaled_rows(x)
    with pytest.raises(IndexError, match="amax"):
        compiled(x)


def pair(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x + y).sum(0) + x.shape[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_relation_between_two_inputs_is_guarded(backend: str) -> None:
    compiled = ember.compiler.compile(pair, backend=backend, dynamic=True)
    for n in [3, 5, 8]:
        x, y = torch.randn(n, 2), torch.randn(n, 2)
        assert_same(compiled(x, y), pair(x, y))
    assert compiled.stats.graphs == 1
    x, y = torch.randn(4, 2), torch.randn(5, 2)  # the relation s0 == s1 fails: eager raises
    with pytest.raises(RuntimeError, match="must match the size"):
        pair(x, y)
    with pytest.raises(RuntimeError, match="must match the size"):
        compiled(x, y)
    x, y = torch.randn(4, 2), torch.randn(1, 2)  # broadcasting: another graph, eager's values
    assert_same(compiled(x, y), pair(x, y))


def loop_over(x: torch.Tensor) -> torch.Tensor:
    out = x[:, 0]
    for i in range(1, x.size(1)):  # iterating specialises the size (guarded by value)
        out = out + x[:, i]
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loop_over_a_size_specialises_that_size_only(backend: str) -> None:
    compiled = ember.compiler.compile(loop_over, backend=backend, dynamic=True)
    for n in [3, 5, 9]:
        x = torch.randn(n, 4)
        assert_same(compiled(x), loop_over(x))
    assert compiled.stats.graphs == 1  # the batch stays symbolic
    x = torch.randn(3, 5)
    assert_same(compiled(x), loop_over(x))
    assert compiled.stats.graphs == 2


def take(x: torch.Tensor, n: int) -> torch.Tensor:
    return x[:n] * n + torch.arange(n).float().sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_int_argument_that_changes_becomes_a_symbol(backend: str) -> None:
    x = torch.randn(20)
    with ember.compiler.config.patch({"guards.cache_size_limit": 64}):
        compiled = sweep(take, lambda n: (x, n), backend=backend)
    assert compiled.stats.graphs == default_graphs(backend, len(SIZES))  # static, then n


@pytest.mark.parametrize("backend", BACKENDS)
def test_mark_dynamic_bounds_are_guarded(backend: str) -> None:
    compiled = ember.compiler.compile(branchy, backend=backend)
    x = torch.randn(8)
    ember.compiler.mark_dynamic(x, 0, min=6, max=12)
    assert_same(compiled(x), branchy(x))
    for n in [6, 10, 12]:  # inside the bounds: the same graph (marks are on tensors)
        y = torch.randn(n)
        ember.compiler.mark_dynamic(y, 0, min=6, max=12)
        assert_same(compiled(y), branchy(y))
    assert compiled.stats.graphs == 1
    y = torch.randn(13)  # outside: the bound fails, another graph
    assert_same(compiled(y), branchy(y))
    assert compiled.stats.graphs == 2
    ember.compiler.reset()
    ember.compiler.mark_dynamic(y, 0, min=6, max=12)  # a mark its own size breaks: an error
    with pytest.raises(MarkedDynamicError, match=r"is 13, outside the bounds \[6, 12\]"):
        ember.compiler.compile(branchy, backend=backend)(y)


def specialising(x: torch.Tensor) -> torch.Tensor:
    if x.shape[0] == 8:
        return x + 1
    return x


@pytest.mark.parametrize("backend", BACKENDS)
def test_specialising_a_marked_dimension_is_an_error_naming_the_line(backend: str) -> None:
    compiled = ember.compiler.compile(specialising, backend=backend)
    x = torch.randn(8)
    ember.compiler.mark_dynamic(x, 0)
    with pytest.raises(MarkedDynamicError, match=r"x.size\(0\) was marked dynamic.*test_dyn"):
        compiled(x)
    ember.compiler.reset()
    y = torch.randn(8)
    ember.compiler.maybe_mark_dynamic(y, 0)  # allowed to specialise: no error
    assert_same(ember.compiler.compile(specialising, backend=backend)(y), specialising(y))


@pytest.mark.parametrize("backend", BACKENDS)
def test_mark_static_keeps_a_dimension_static_under_dynamic_true(backend: str) -> None:
    compiled = ember.compiler.compile(branchy, backend=backend, dynamic=True)
    for n in [5, 6, 7]:
        x = torch.randn(n)
        ember.compiler.mark_static(x, 0)
        assert_same(compiled(x), branchy(x))
    assert compiled.stats.graphs == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_parameters_stay_static_and_a_model_serves_every_batch(backend: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    compiled = ember.compiler.compile(model, backend=backend, dynamic=True)
    for n in SIZES:
        x = torch.randn(n, 6, requires_grad=True)
        out, ref = compiled(x), model(x)
        assert_same(out, ref)
        (gx,) = torch.autograd.grad(out.sum(), x)
        (rx,) = torch.autograd.grad(ref.sum(), x)
        assert_same(gx, rx)
    assert compiled.stats.graphs == 1


def test_a_failing_relation_explains_itself_in_words() -> None:
    profiler = CompilationProfiler()
    compiled = ember.compiler.compile(branchy, backend=profiler, dynamic=True)
    compiled(torch.randn(6))
    compiled(torch.randn(3))
    report = str(profiler.report())
    assert "s0: 3 is not >= 5 (s0 = x.size(0))" in report, report  # refined from s0 > 4
    assert "if x.shape[0] > 4" in report, report  # the line whose branch set it


def test_bad_marks_are_clear_errors() -> None:
    x = torch.randn(3, 4)
    with pytest.raises(IndexError, match="dim 2 is out of range"):
        ember.compiler.mark_dynamic(x, 2)
    with pytest.raises(ValueError, match="min 9 is above max 4"):
        ember.compiler.mark_dynamic(x, 0, min=9, max=4)
    with pytest.raises(TypeError, match="expected a tensor"):
        ember.compiler.mark_dynamic([1, 2], 0)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_calling_a_dynamic_function_share_one_graph(backend: str) -> None:
    import threading

    compiled = ember.compiler.compile(batch_ops, backend=backend, dynamic=True)
    errors: list[BaseException] = []

    def worker(first: int) -> None:
        try:
            for n in range(first, first + 6):
                x = torch.randn(n, 6)
                assert_same(compiled(x), batch_ops(x))
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in (2, 4, 6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert compiled.stats.graphs == 1


# -- a fuzzer: random size relations, random sizes (0 and 1 among them) ------------------------


def relations_program(threshold: int, mod: int, cut: int) -> Callable[..., Any]:
    """A function whose result depends on relations between its inputs' sizes and ints."""

    def f(x: torch.Tensor, y: torch.Tensor, k: int) -> torch.Tensor:
        n, m = x.shape[0], y.shape[0]
        a = x * 2 if n > threshold else x - 1
        if (n + k) % mod == 0:
            a = a + 1
        b = y[: n // cut] if m >= n // cut else y[:1]
        return a.sum(0) + b.sum() * (n - m) + x.new_ones(max(n - k, 0)).sum()

    return f


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dynamic", [True, None])
def test_random_sizes_never_reuse_a_graph_where_eager_differs(backend: str, dynamic: Any) -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=25, deadline=None, database=None)
    @given(
        st.integers(0, 6), st.integers(2, 4), st.integers(1, 3),
        st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9), st.integers(0, 5)),
                 min_size=4, max_size=10),
    )  # fmt: skip
    def run(threshold: int, mod: int, cut: int, calls: list[tuple[int, int, int]]) -> None:
        ember.compiler.reset()
        fn = relations_program(threshold, mod, cut)
        compiled = ember.compiler.compile(fn, backend=backend, dynamic=dynamic)
        for n, m, k in calls:
            x, y = torch.randn(n, 3), torch.randn(m)
            try:
                want = fn(x, y, k)
            except Exception as e:  # eager's error must be ember's
                with pytest.raises(type(e)):
                    compiled(x, y, k)
                continue
            assert_same(compiled(x, y, k), want)

    with ember.compiler.config.patch({"guards.cache_size_limit": 64}):
        run()


class Cached(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.table = torch.randn(6, 4)  # a plain tensor attribute: symbolic under dynamic=True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).sum(0) + self.table.sum(0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mark_static_of_a_module_pins_its_tensor_attributes(backend: str) -> None:
    model = Cached()
    ember.compiler.mark_static(model)
    compiled = ember.compiler.compile(model, backend=backend, dynamic=True)
    for n in [3, 5]:
        x = torch.randn(n, 4)
        assert_same(compiled(x), model(x))
    assert compiled.stats.graphs == 1  # the batch is symbolic
    model.table = torch.randn(7, 4)  # unmarked, and now of another size: guarded, new graph
    x = torch.randn(3, 4)
    assert_same(compiled(x), model(x))
    assert compiled.stats.graphs == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_mark_static_a_module_tensor_attribute_is_symbolic(backend: str) -> None:
    model = Cached()
    compiled = ember.compiler.compile(model, backend=backend, dynamic=True)
    x = torch.randn(3, 4)
    assert_same(compiled(x), model(x))
    model.table = torch.randn(7, 4)  # its size is symbolic: the same graph serves it
    assert_same(compiled(x), model(x))
    assert compiled.stats.graphs == 1


def scaled_by_item(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * y.sum().item() + 1


def masked(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    return x[x > 0].sum() * 2, torch.nonzero(x).shape[0]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])  # inductor: test below
def test_data_dependent_values_stay_in_the_graph_when_asked(backend: str) -> None:
    x, y = torch.randn(4), torch.randn(3)
    default = ember.compiler.compile(scaled_by_item, backend=backend)
    assert_same(default(x, y), scaled_by_item(x, y))
    assert len(default.stats.breaks) == 1  # torch's default: .item() breaks the graph
    settings = {"capture.scalar_outputs": True, "capture.dynamic_output_shape_ops": True}
    with ember.compiler.config.patch(settings):
        for fn, args in [(scaled_by_item, (x, y)), (masked, (torch.randn(7),))]:
            ember.compiler.reset()
            compiled = ember.compiler.compile(fn, backend=backend, fullgraph=True)
            for _ in range(3):  # new values, the same graph
                assert_same(compiled(*args), fn(*args))
                args = tuple(torch.randn_like(a) for a in args)
            assert compiled.stats.graphs == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_mark_unbacked_serves_sizes_0_and_1_and_breaks_on_a_branch(backend: str) -> None:
    def total(x: torch.Tensor) -> torch.Tensor:
        return x.sum(0) * 2 + x.shape[0]

    compiled = ember.compiler.compile(total, backend=backend)
    for n in [1, 5, 0, 3]:  # compiled at 1: the size must not specialise there either
        x = torch.randn(n, 3)
        ember.compiler.mark_unbacked(x, 0)
        assert_same(compiled(x), total(x))
    assert compiled.stats.graphs == 1 and not compiled.stats.failures  # 0, 1 not specialised
    ember.compiler.reset()
    branching = ember.compiler.compile(branchy, backend=backend)
    x = torch.randn(6)
    ember.compiler.mark_unbacked(x, 0)
    assert_same(branching(x), branchy(x))  # the branch runs natively, after a graph break
    assert branching.stats.graphs == 0 or branching.stats.breaks


def test_aot_eager_traces_an_unbacked_input_size_and_its_gradient() -> None:
    compiled = ember.compiler.compile(scaled_rows, backend="aot_eager")
    for n in [5, 1, 8]:
        x = torch.randn(n, 6, requires_grad=True)
        ember.compiler.mark_unbacked(x, 0)
        got, want = compiled(x), scaled_rows(x)
        assert_same(got, want)
        (g,) = torch.autograd.grad(got.sum(), x)
        (w,) = torch.autograd.grad(want.sum(), x)
        assert_same(g, w)
    assert compiled.stats.graphs == 1 and not compiled.stats.failures


def test_inductor_takes_item_and_data_dependent_sizes_without_a_wrong_result() -> None:
    settings = {"capture.scalar_outputs": True, "capture.dynamic_output_shape_ops": True}
    with ember.compiler.config.patch(settings):
        x, y = torch.randn(4), torch.randn(3)
        compiled = ember.compiler.compile(scaled_by_item, backend="inductor", fullgraph=True)
        assert_same(compiled(x, y), scaled_by_item(x, y))
        compiled = ember.compiler.compile(masked, backend="inductor")
        for n in (7, 9):
            x = torch.randn(n)
            assert_same(compiled(x), masked(x))
        # compiled (data-dependent sizes run as aten calls), or run eagerly saying why
        failures = compiled.stats.failures
        assert compiled.stats.graphs or "unbacked" in failures[0].reason.lower(), failures


def divided(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return b / (a.abs() + 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_keep_eagers_strides_for_a_transposed_input(backend: str) -> None:
    """Found by the guard fuzzer: inductor's symbolic kernels wrote a compact output where
    eager keeps the transposed input's layout."""
    compiled = ember.compiler.compile(divided, backend=backend, dynamic=True)
    for n, m in [(4, 5), (6, 3), (7, 7)]:
        a, b = torch.randn(n, m), torch.randn(m, n).t()
        got, want = compiled(a, b), divided(a, b)
        assert_same(got, want)
        assert got.stride() == want.stride()


def permuted(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (x @ w).permute(0, 2, 1).sin() * 2, x.transpose(0, 1) + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_permuted_outputs_are_written_in_eagers_layout_by_the_kernels(backend: str) -> None:
    """Outputs eager lays out dense in another order (a backward's transposed gradient) are
    written so by the symbolic kernels: the graph compiles instead of running as aten calls."""
    import warnings

    compiled = ember.compiler.compile(permuted, backend=backend, dynamic=True)
    w = torch.randn(8, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "running the graph eagerly" would be a warning
        for n in (3, 5, 7):
            x = torch.randn(n, 4, 8)
            got, want = compiled(x, w), permuted(x, w)
            for g, e in zip(got, want, strict=True):
                assert_same(g, e)
                assert g.stride() == e.stride()
    assert compiled.stats.graphs == 1 and not compiled.stats.failures


def first_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = (x * 2).sin()
    return y[:, 0], y.narrow(-1, 1, 2)  # windows of a wider tensor: eager keeps the gaps


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_that_are_windows_keep_eagers_gaps(backend: str) -> None:
    """A selected row of a symbolic result (BERT's pooled token, which made its backward run
    as aten calls) is written with eager's strides, gaps included, by the kernels."""
    import warnings

    compiled = ember.compiler.compile(first_rows, backend=backend, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n, t in [(3, 5), (4, 7), (6, 4)]:
            x = torch.randn(n, t, 6)
            for g, e in zip(compiled(x), first_rows(x), strict=True):
                assert_same(g, e)
                assert g.stride() == e.stride()
    assert compiled.stats.graphs == 1 and not compiled.stats.failures
