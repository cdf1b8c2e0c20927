"""One-pass Welford variance: numerics against float64, the shapes of its loops (lanes, tails,
tiles, thread chunks), the mean it shares with layer and batch norm, interpreter and checker."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor.check import IRError, check
from ember.inductor.compile import compile_graph, decompose, decompositions
from ember.inductor.interpret import interpret
from ember.inductor.ir import Expr, Program, Reduction
from ember.inductor.lowering import lower_graph
from ember.inductor.ops import Op, Reduce
from ember.inductor.scheduler import Kernel

T = torch.Tensor


def _compile(fn: Callable[..., Any], *xs: T) -> Any:
    gm = make_fx(fn, decomposition_table=decompositions())(*xs)
    return compile_graph(gm, list(xs), {"graph_cache": False})


def _program(fn: Callable[..., Any], *xs: T) -> Program:
    gm = make_fx(fn, decomposition_table=decompositions())(*xs)
    return lower_graph(gm, list(xs))


def _kinds(prog: Program) -> list[Reduce]:
    return [n.kind for n in prog.nodes if isinstance(n, Reduction)]


def _leaves(tree: Any) -> list[T]:
    return [t for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, T)]


@pytest.mark.parametrize(
    ("dims", "shape"),
    [((-1,), (64, 768)), ((0,), (300, 40)), ((0, 1), (256, 768)), ((0, 2), (16, 8, 50))],
    ids=["rows", "columns", "threads", "batch_norm"],
)
def test_large_mean_small_variance_matches_float64(
    dims: tuple[int, ...], shape: tuple[int, ...]
) -> None:
    g = torch.Generator().manual_seed(0)
    x = 1e4 + torch.randn(*shape, generator=g) * 1e-2  # float32: var ~1e-4, mean^2 ~1e8
    want = x.double().var(dims)
    got = _compile(lambda x: x.var(dims), x)(x).double()
    err = float(((got - want) / want).abs().max())
    # a sum of squares loses every digit here: E[x^2] - E[x]^2 in float32 is noise
    n = x.numel() // want.numel()
    naive = ((x * x).mean(dims) - x.mean(dims) ** 2) * n / (n - 1)
    naive_err = float(((naive.double() - want) / want).abs().max())
    assert err < 1e-5, err
    assert naive_err > 0.5, naive_err


@pytest.mark.parametrize("n", [1 << 17, (1 << 17) + 13])
def test_whole_tensor_var_split_over_threads(n: int) -> None:
    g = torch.Generator().manual_seed(1)
    x = 3.0 + torch.randn(n, generator=g)
    want = x.double().var()
    got = _compile(lambda x: torch.var(x), x)(x).double()
    assert abs(float(got - want)) < 1e-5 * float(want)
    y = x[: (n // 512) * 512].view(-1, 512)  # two loops: chunks of rows
    got2 = _compile(lambda y: torch.var_mean(y, correction=0), y)(y)
    want2 = torch.var_mean(y.double(), correction=0)
    for a, b in zip(got2, want2, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-6)


CASES: dict[str, Callable[..., Any]] = {
    "last": lambda x: x.var(-1),
    "first": lambda x: x.var(0),
    "middle_keepdim": lambda x: x.var(1, keepdim=True),
    "all": lambda x: x.var(),
    "all_keepdim": lambda x: x.var((0, 1, 2), keepdim=True, correction=0),
    "outer_two": lambda x: x.var((0, 2), correction=0),
    "var_mean": lambda x: torch.var_mean(x, -1, correction=1),
    "std": lambda x: x.std(1),
    "layer_norm": lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:]),
    "batch_norm": lambda x: torch.nn.functional.batch_norm(x, None, None, training=True),
}

INPUTS: dict[str, Callable[[], T]] = {
    "lanes_and_tail": lambda: torch.randn(3, 5, 40),  # 40 = two lanes blocks and a tail of 8
    "short_rows": lambda: torch.randn(6, 4, 7),  # fewer points than lanes
    "tiles": lambda: torch.randn(9, 3, 37),  # a column kernel with a partial tile
    "transposed": lambda: torch.randn(40, 5, 3).permute(2, 1, 0),
    "sliced": lambda: torch.randn(4, 7, 50)[1:, ::2, 3:],
    "single": lambda: torch.randn(1, 1, 1),
}


@pytest.mark.parametrize("inputs", list(INPUTS))
def test_matches_eager(inputs: str) -> None:
    x = INPUTS[inputs]()
    fns = dict(CASES)
    if inputs == "single":  # eager's batch norm wants two values a channel
        fns.pop("batch_norm")
    got = _compile(lambda x: tuple(f(x) for f in fns.values()), x)(x)
    for name, g, w in zip(fns, got, (f(x) for f in fns.values()), strict=True):
        for a, b in zip(_leaves(g), _leaves(w), strict=True):
            msg = f"{name}: {{}}"
            torch.testing.assert_close(a, b, equal_nan=True, msg=lambda m, s=msg: s.format(m))


def test_zero_size_reduction() -> None:
    x = torch.randn(3, 0)
    fns = {
        "var": lambda x: x.var(-1),
        "var0": lambda x: x.var(-1, correction=0),
        "var_mean": lambda x: torch.var_mean(x, -1),
        "sum_and_var": lambda x: (x.sum(-1), x.var(-1)),
        "over_rows": lambda x: x.var(0),
    }
    got = _compile(lambda x: tuple(f(x) for f in fns.values()), x)(x)
    for name, g, w in zip(fns, got, (f(x) for f in fns.values()), strict=True):
        for a, b in zip(_leaves(g), _leaves(w), strict=True):
            torch.testing.assert_close(a, b, equal_nan=True, msg=name)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_other_dtypes(dtype: torch.dtype) -> None:
    x = (5 + torch.randn(6, 50, generator=torch.Generator().manual_seed(2))).to(dtype)
    fns = {k: CASES[k] for k in ("last", "first", "all", "var_mean", "layer_norm")}
    got = _compile(lambda x: tuple(f(x) for f in fns.values()), x)(x)
    tol = {} if dtype == torch.float64 else {"atol": 2e-2, "rtol": 2e-2}
    for name, g, w in zip(fns, got, (f(x) for f in fns.values()), strict=True):
        for a, b in zip(_leaves(g), _leaves(w), strict=True):
            assert a.dtype == b.dtype, name
            torch.testing.assert_close(a, b, msg=name, **tol)
    if dtype != torch.float64:  # computed in float32: as close as eager's own float32 var
        want = x.float().var(-1)
        torch.testing.assert_close(got[0].float(), want, atol=0, rtol=1e-2)


@pytest.mark.parametrize(
    ("fn", "shape"),
    [
        (lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:]), (8, 48)),
        (lambda x: torch.nn.functional.batch_norm(x, None, None, training=True), (4, 3, 5, 6)),
        (lambda x: torch.var_mean(x, 0), (33, 20)),
    ],
)
def test_mean_and_variance_in_one_pass(fn: Callable[..., Any], shape: tuple[int, ...]) -> None:
    x = torch.randn(*shape)
    prog = _program(fn, x)
    assert sorted(k.name for k in _kinds(prog)) == ["WELFORD_M2", "WELFORD_MEAN"], prog
    compiled = _compile(fn, x)
    stages = [st for k in compiled.schedule.steps if isinstance(k, Kernel) for st in k.stages]
    welford = [st for st in stages if st.is_reduction]
    assert len(welford) == 1 and len(welford[0].stores) == 2, compiled.schedule
    assert compiled.source.count("_w_c += 1;") == 1, compiled.source  # one pass's count
    for a, b in zip(_leaves(compiled(x)), _leaves(fn(x)), strict=True):
        torch.testing.assert_close(a, b)


def test_mean_before_var_joins_the_welford_pass() -> None:
    x = torch.randn(5, 24)
    fn = lambda x: (x.mean(-1), x.sum(-1), x.var(-1))  # noqa: E731
    prog = _program(fn, x)
    check(prog)
    assert _kinds(prog) == [Reduce.WELFORD_MEAN, Reduce.WELFORD_M2], prog
    for a, b in zip(_compile(fn, x)(x), fn(x), strict=True):
        torch.testing.assert_close(a, b)


def test_interpreter_agrees_with_eager() -> None:
    x = INPUTS["transposed"]()
    fns = {k: CASES[k] for k in ("last", "first", "all", "var_mean", "layer_norm", "batch_norm")}
    f = lambda x: tuple(fn(x) for fn in fns.values())  # noqa: E731
    gm = decompose(make_fx(f)(x), [x])
    prog = lower_graph(gm, [x])
    check(prog)
    assert Reduce.WELFORD_M2 in _kinds(prog)
    for g, w in zip(interpret(prog, [x]), _leaves(f(x)), strict=True):
        torch.testing.assert_close(g, w)
    empty = torch.randn(2, 0)
    prog = _program(lambda x: torch.var_mean(x, -1, correction=0), empty)
    want = torch.var_mean(empty, -1, correction=0)
    for g, w in zip(interpret(prog, [empty]), want, strict=True):
        torch.testing.assert_close(g, w, equal_nan=True)


def test_printed_ir_names_the_kind() -> None:
    x = torch.randn(4, 8)
    text = str(_program(lambda x: torch.var_mean(x, -1), x))
    assert "buf0[4] = WELFORD_M2[8](x_1[8*i0 + r0])" in text
    assert "WELFORD_MEAN[8](x_1[8*i0 + r0])" in text


def test_checker_rejects_welford_of_integers() -> None:
    x = torch.randn(4, 8)
    prog = _program(lambda x: x.var(-1), x)
    check(prog)
    k, node = next((k, n) for k, n in enumerate(prog.nodes) if isinstance(n, Reduction))
    bad = Expr(Op.CAST, torch.int64, (node.body,))
    nodes = list(prog.nodes)
    nodes[k] = dataclasses.replace(node, body=bad)
    with pytest.raises(IRError, match=r"buf0: WELFORD_M2 of torch\.int64, not float32/float64"):
        check(dataclasses.replace(prog, nodes=nodes))
    nodes[k] = dataclasses.replace(node, body=Expr(Op.CAST, torch.float64, (node.body,)))
    with pytest.raises(IRError, match=r"buf0: WELFORD_M2 of torch\.float64 into torch\.float32"):
        check(dataclasses.replace(prog, nodes=nodes))


def test_inf_and_nan_rows_match_eager() -> None:
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[inf, 1.0, 2.0], [1.0, nan, 3.0], [5.0, 1.0, 2.0], [1.0, 2.0, -inf]])
    fn = lambda x: (torch.var_mean(x, -1), x.var(0))  # noqa: E731
    for a, b in zip(_leaves(_compile(fn, x)(x)), _leaves(fn(x)), strict=True):
        torch.testing.assert_close(a, b, equal_nan=True)
