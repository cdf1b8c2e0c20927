"""Each lowered op against eager, over shapes, strides (non-contiguous, broadcast, zero-size)
and dtypes. Ops are batched into one graph per variant so the suite compiles few kernels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import LOWERINGS, compile_graph
from ember.inductor.compile import decompose
from ember.inductor.interpret import interpret
from ember.inductor.lowering import lower_graph
from ember.inductor.scheduler import Extern

T = torch.Tensor
UNARY: dict[str, Callable[[T], T]] = {
    "neg": torch.neg,
    "abs": torch.abs,
    "exp": torch.exp,
    "expm1": torch.expm1,
    "log": lambda x: torch.log(x.abs() + 0.5),
    "log1p": lambda x: torch.log1p(x.abs()),
    "sqrt": lambda x: torch.sqrt(x.abs()),
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.1),
    "reciprocal": lambda x: torch.reciprocal(x + 10),
    "sin": torch.sin,
    "cos": torch.cos,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "erf": torch.erf,
    "floor": torch.floor,
    "ceil": torch.ceil,
    "trunc": torch.trunc,
    "relu": torch.relu,
    "sign": torch.sign,
    "gelu": torch.nn.functional.gelu,
    "silu": torch.nn.functional.silu,
    "isnan": torch.isnan,
    "clamp": lambda x: x.clamp(-0.5, 0.5),
    "pow2": lambda x: x**2,
    "pow": lambda x: x.abs() ** 1.5,
    "square_scalar": lambda x: x * 3 - 1,
}
BINARY: dict[str, Callable[[T, T], T]] = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": lambda a, b: a / (b.abs() + 1),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "eq": torch.eq,
    "ne": torch.ne,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
    "where": lambda a, b: torch.where(a > b, a, b),
    "add_alpha": lambda a, b: torch.add(a, b, alpha=2),
    "and": lambda a, b: (a > 0) & (b > 0),
    "or": lambda a, b: (a > 0) | (b > 0),
}
REDUCE: dict[str, Callable[[T], Any]] = {
    "sum": lambda x: x.sum(-1),
    "sum0": lambda x: x.sum(0),
    "sum_all": lambda x: x.sum(),
    "sum_keep": lambda x: x.sum(-1, keepdim=True),
    "mean": lambda x: x.mean(-1),
    "amax": lambda x: x.amax(-1),
    "amin": lambda x: x.amin(0),
    "prod": lambda x: x.prod(-1),
    "argmax": lambda x: x.argmax(-1),
    "argmin": lambda x: x.argmin(0),
    "argmax_all": lambda x: x.argmax(),
    "any": lambda x: (x > 0.5).any(-1),
    "all": lambda x: (x > -2).all(0),
    "var": lambda x: x.var(-1),
    "var0": lambda x: x.var(0),
    "var_mean": lambda x: torch.var_mean(x, -1, correction=0),
    "softmax": lambda x: x.softmax(-1),
    "log_softmax": lambda x: x.log_softmax(0),
    "layer_norm": lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:]),
}
VIEWS: dict[str, Callable[[T], T]] = {
    "t": lambda x: x.t() * 1,
    "permute": lambda x: x.permute(1, 0).exp(),
    "view": lambda x: (x + 1).reshape(-1),
    "view2": lambda x: x.reshape(-1).exp().view(x.shape),
    "slice": lambda x: x[1:, ::2] + 1,
    "select": lambda x: x[1] * 2,
    "unsqueeze": lambda x: x.unsqueeze(1) + 1,
    "expand": lambda x: x[:1].expand(x.shape) * 2,
    "cat": lambda x: torch.cat([x, x * 2], 0),
    "cat1": lambda x: torch.cat([x.exp(), x], -1),
    "pad": lambda x: torch.nn.functional.pad(x, (1, 2)) * 1,
    "flip_t": lambda x: x.t().contiguous(),
    "full": lambda x: x + torch.full(x.shape, 2.0),
    "arange": lambda x: x + torch.arange(x.shape[-1]),
    "zeros_like": lambda x: torch.zeros_like(x) + x,
    "to_double": lambda x: x.double() * 2,
    "to_int": lambda x: (x * 3).to(torch.int32),
    "masked_fill": lambda x: x.masked_fill(x > 0, -1),
}

FLOAT_SUITES = {**UNARY, **REDUCE, **VIEWS}

# Each suite runs through both printers (the conftest's ``options`` fixture): C++, and
# Triton under its interpreter (issue 20).


def _graph(fns: dict[str, Callable[..., Any]], arity: int) -> Callable[..., Any]:
    def f(*xs: T) -> tuple[Any, ...]:
        return tuple(fn(*xs[:arity]) for fn in fns.values())

    return f


def _inputs(kind: str, dtype: torch.dtype, arity: int) -> list[T]:
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> T:
        return torch.randn(*shape, generator=g).to(dtype)

    if kind == "contiguous":
        return [rand(6, 8) for _ in range(arity)]
    if kind == "transposed":
        return [rand(8, 6).t() for _ in range(arity)]
    if kind == "broadcast":
        return [rand(6, 1).expand(6, 8), rand(1, 8)][:arity]
    if kind == "offset":
        return [rand(7, 9)[1:, 1:] for _ in range(arity)]
    if kind == "zero":
        return [rand(3, 0) for _ in range(arity)]
    raise AssertionError(kind)


def _run(
    fns: dict[str, Callable[..., Any]],
    arity: int,
    inputs: list[T],
    options: dict[str, Any] | None = None,
    **tol: Any,
) -> None:
    f = _graph(fns, arity)
    gm = make_fx(f)(*inputs)
    compiled = compile_graph(gm, inputs, options)
    if options is not None:  # the Triton printer took the graph (no fallback to C++)
        assert compiled.target is not None and compiled.target.printer == "triton"
    got, want = compiled(*inputs), f(*inputs)
    for name, g, w in zip(fns, got, want, strict=True):
        torch.testing.assert_close(g, w, equal_nan=True, msg=lambda m, n=name: f"{n}: {m}", **tol)
        for gt, wt in zip(
            torch.utils._pytree.tree_leaves(g), torch.utils._pytree.tree_leaves(w), strict=True
        ):
            if wt.numel() > 1 and wt.is_contiguous():
                assert gt.is_contiguous(), f"{name}: eager gives a contiguous result"


@pytest.mark.parametrize("kind", ["contiguous", "transposed", "offset", "zero"])
def test_unary_reduce_views_float32(kind: str, options: Any) -> None:
    fns = FLOAT_SUITES if kind != "zero" else {**UNARY, **VIEWS, "sum": REDUCE["sum"]}
    if options is not None:  # libdevice's pow has no interpreter twin: C++ takes such graphs
        fns = {k: f for k, f in fns.items() if k != "pow"}
    _run(fns, 1, _inputs(kind, torch.float32, 1), options)


@pytest.mark.parametrize("kind", ["contiguous", "broadcast", "transposed"])
def test_binary_float32(kind: str, options: Any) -> None:
    _run(BINARY, 2, _inputs(kind, torch.float32, 2), options)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_other_float_dtypes(dtype: torch.dtype, options: Any) -> None:
    fns = {
        **{k: UNARY[k] for k in ("exp", "tanh", "sigmoid", "relu", "neg")},
        **{k: REDUCE[k] for k in ("sum", "amax", "softmax", "mean")},
        **{k: VIEWS[k] for k in ("t", "cat")},
    }
    tol = {} if dtype == torch.float64 else {"atol": 2e-2, "rtol": 2e-2}
    _run(fns, 1, _inputs("contiguous", dtype, 1), options, **tol)
    _run(
        {k: BINARY[k] for k in ("add", "mul", "maximum", "lt", "where")},
        2,
        _inputs("broadcast", dtype, 2),
        options,
        **tol,
    )


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.bool])
def test_integer_and_bool(dtype: torch.dtype, options: Any) -> None:
    x = (torch.arange(48).view(6, 8) % 7 - 3).to(dtype)
    y = (torch.arange(48).view(6, 8) % 5 - 2).to(dtype)
    fns: dict[str, Callable[..., Any]] = {
        "eq": torch.eq,
        "lt": torch.lt,
        "maximum": torch.maximum,
        "where": lambda a, b: torch.where(a > b, a, b),
        "sum": lambda a, b: a.sum(-1),
        "amax": lambda a, b: a.amax(0),
        "t": lambda a, b: a.t().contiguous(),
        "cat": lambda a, b: torch.cat([a, b], 1),
        "to_float": lambda a, b: a.float() / 2,
    }
    if dtype != torch.bool:
        fns |= {
            "argmax": lambda a, b: a.argmax(-1),
            "add": torch.add,
            "mul": torch.mul,
            "neg": lambda a, b: -a,
            "abs": lambda a, b: a.abs(),
        }
    else:
        fns |= {
            "and": torch.logical_and,
            "or": torch.logical_or,
            "not": lambda a, b: ~a,
            "any": lambda a, b: a.any(-1),
            "all": lambda a, b: a.all(0),
        }
    _run(fns, 2, [x, y], options)


def test_indexing(options: Any) -> None:
    w, idx = torch.randn(10, 4), torch.tensor([[1, 9], [0, 3]])
    fns: dict[str, Callable[..., Any]] = {
        "embedding": lambda w, i: torch.nn.functional.embedding(i, w) * 2,
        "index_select": lambda w, i: w.index_select(0, i.flatten().abs()) + 1,
        "gather": lambda w, i: torch.gather(w, 1, (i.abs() % 4).repeat(5, 2)[:10]) + 1,
    }
    _run(fns, 2, [w, idx], options)


def test_reference_interpreter_agrees_with_eager() -> None:
    x = _inputs("transposed", torch.float32, 1)
    fns = {**UNARY, **{k: REDUCE[k] for k in ("sum", "sum0", "amax", "argmax", "var")}, **VIEWS}
    f = _graph(fns, 1)
    gm = decompose(make_fx(f)(*x), x)
    prog = lower_graph(gm, x)
    got = interpret(prog, x)
    want = torch.utils._pytree.tree_leaves(f(*x))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, equal_nan=True)


def test_common_ops_have_lowerings() -> None:
    aten = torch.ops.aten
    for op in [
        aten.add.Tensor,
        aten.exp.default,
        aten.sum.dim_IntList,
        aten.view.default,
        aten.cat.default,
        aten.where.self,
        aten.amax.default,
        aten.full.default,
    ]:
        assert op in LOWERINGS, op


def test_pointwise_chain_fuses_into_one_kernel() -> None:
    x = torch.randn(32, 64)
    gm = make_fx(lambda x: ((x * 2).exp() + 1).tanh().sum(-1) + x.amax(-1))(x)
    compiled = compile_graph(gm, [x])
    kernels = [s for s in compiled.schedule.steps if not isinstance(s, Extern)]
    assert len(kernels) == 1, compiled.schedule


def test_only_column_reductions_are_tiled() -> None:
    from ember.inductor.codegen_tiles import column_kernel
    from ember.inductor.scheduler import Kernel

    x = torch.randn(37, 5, 43)
    for f, column in [
        (lambda x: x.var(0), True),
        (lambda x: x.var(-1), False),
        (lambda x: torch.nn.functional.layer_norm(x, (43,)), False),
    ]:
        compiled = compile_graph(make_fx(f)(x), [x], {"graph_cache": False})
        torch.testing.assert_close(compiled(x), f(x), atol=1e-4, rtol=1e-4)
        kernels = [s for s in compiled.schedule.steps if isinstance(s, Kernel)]
        assert [column_kernel(k) for k in kernels][:1] == [column], compiled.schedule


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_casts_to_every_dtype(dtype: torch.dtype) -> None:
    x = (torch.randn(4, 6) * 3).to(dtype)
    fns: dict[str, Callable[..., Any]] = {
        f"to_{t}": (lambda x, t=t: (x.to(t) * 2).to(dtype))
        for t in (torch.float64, torch.float32, torch.int32, torch.int64, torch.int8)
    }
    fns["to_bool"] = lambda x: (x > 0).to(dtype) + x
    fns["sigmoid64"] = lambda x: x.to(torch.float64).sigmoid().to(dtype)
    _run(fns, 1, [x], atol=2e-2, rtol=2e-2)


def test_a_failed_cpp_build_runs_the_graph_eagerly_with_the_wrappers_outputs() -> None:
    """A C++ build that fails warns and runs the graph as aten calls, its outputs flat as
    the wrapper's would be (they were ``gm.forward``'s nest: a nested output failed to
    unflatten)."""

    def f(x: T) -> Any:
        return x.max(0), x.sum(), x.t(), (x + 1, [x * 2])

    x = torch.randn(6, 8)
    gm = make_fx(f)(x)
    with pytest.warns(UserWarning, match="C\\+\\+ build failed, running eagerly"):
        compiled = compile_graph(gm, [x], {"cflags": ["-fno-such-flag"], "graph_cache": False})
        got = compiled(x)
    want = f(x)
    leaves = torch.utils._pytree.tree_leaves
    assert len(leaves(got)) == len(leaves(want)) == 6
    for g, w in zip(leaves(got), leaves(want), strict=True):
        torch.testing.assert_close(g, w)
