"""Ops that run as their aten kernel when they stand alone, and in ember's kernels otherwise.

Where eager's kernel for an op is faster than ember's code for it, and the op is all a
kernel would do (its operand is already in memory, a graph input or an extern's result,
and its result is only returned), ember calls the aten op (issue 19: "or fall back to
aten where ember cannot beat it"). Where it fuses (a producer computed on the fly, or a
consumer in the same kernel), it keeps its lowering: a fused chain saves whole passes over
memory, which is worth more than the op's own speed. One table, each op with the reason.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from ember.inductor import compile_graph
>>> x = torch.randn(8, 16)
>>> alone = compile_graph(make_fx(torch.nn.functional.gelu)(x), [x])
>>> fused = compile_graph(make_fx(lambda x: torch.nn.functional.gelu(x) * 2)(x), [x])
>>> [type(s).__name__ for s in alone.schedule.steps]
['Extern']
>>> [type(s).__name__ for s in fused.schedule.steps]
['Kernel']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ember.inductor.ir import Expr, const
from ember.inductor.lower_ops import pointwise
from ember.inductor.lowering import Fallback, Lowerer, Value, lowering
from ember.inductor.ops import Op

__all__ = ["ATEN_ALONE", "alone", "runs_alone"]

aten = torch.ops.aten

# op -> when its aten kernel beats ember's alone (given the fx node), and by how much
# (bench_ops.py, 1 thread)
ATEN_ALONE: dict[Any, Callable[[torch.fx.Node], bool]] = {
    # GELU with erf: eager's vectorised GELU uses a cheaper erf (Abramowitz-Stegun 7.1.26)
    # than ember_erf's 2.4 ULP; alone, 1M values: ember 0.44x (bf16), 0.61x (f32). GELU
    # with tanh stays ember's (1.8-2.6x eager).
    aten.gelu.default: lambda node: node.kwargs.get("approximate", "none") == "none",
}


# fewer elements reduce faster in ember's kernel than through an aten call (its dispatch)
ALONG_MIN = 1 << 16


def _along_memory(node: torch.fx.Node) -> bool:
    """A float32 or float64 reduction of at least ``ALONG_MIN`` elements to one value (a sum,
    product, max or min of everything), or a sum or product whose reduce loop runs along
    memory (it reduces the operand's unit-stride dim).

    ember's kernel reduces such a loop in one vector accumulator (``#pragma omp simd
    reduction``), one chain of dependent adds or multiplies, where eager's keeps several
    vectors; products accumulate in double besides (``codegen_accum.acc_type``). With 8 float
    lanes (AVX2) the chain is the kernel's speed. 1M float32, 1 thread, the compiled graph
    called directly, x eager, kernel -> aten call (two runs): ``sum()`` 0.66-0.69 ->
    0.90-0.96, ``amax()`` 0.53-0.68 -> 0.89-0.98, ``prod()`` 0.47 -> 0.83-0.91, ``prod(-1)``
    0.42-0.45 -> 0.92-0.94, ``sum(-1)`` 0.64 -> 0.84 (one run). Not
    ``amax(-1)``, ``amin(-1)`` (the kernel at 0.95), columns (a reduce loop across memory:
    ember's column kernel is the faster) nor 2-byte floats (eager's bfloat16 reductions are
    slower than ember's kernels)."""
    x = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    out = node.meta.get("val")
    if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    if x.dtype not in (torch.float32, torch.float64) or out.dtype != x.dtype:
        return False
    numel = x.numel()  # (symbolic: sizes vary, small ones among them; keep ember's kernel)
    if not isinstance(numel, int) or numel < ALONG_MIN:
        return False
    arg = node.args[1] if len(node.args) > 1 and node.target is not aten.prod.default else None
    dims: list[int] = [arg] if isinstance(arg, int) else list(arg or ())  # type: ignore[arg-type]
    reduced = set(range(x.ndim)) if not dims else {d % max(x.ndim, 1) for d in dims}
    if reduced >= {d for d in range(x.ndim) if not _is(x.size(d), 1)}:
        return True  # everything to one value
    # (a symbolic stride or size is not compared: that would guard on it)
    along = any(_is(x.stride(d), 1) and not _is(x.size(d), 1) for d in reduced)
    return along and node.target in (aten.sum.dim_IntList, aten.prod.dim_int)


def _is(n: Any, value: int) -> bool:
    return isinstance(n, int) and n == value


ALONG_MEMORY = (aten.sum.dim_IntList, aten.prod.default, aten.prod.dim_int, aten.amax.default)
ATEN_ALONE |= dict.fromkeys((*ALONG_MEMORY, aten.amin.default), _along_memory)


def _cat_across(node: torch.fx.Node) -> bool:
    """A ``cat`` along the last dimension with an input laid out across it (``x.t()``).

    ember's kernel runs such a cat in tiles (the transposed input is copied tile by tile),
    and every tile reads every input at clamped indices: the select chain is cut into
    pieces (``piecewise.py``) only where it compares the innermost loop variable, and here
    it compares ``y0 + 16*x1``. 1M elements, ``bench_ops`` ``cat_cols`` t: ember 0.54-0.71x
    eager in float32, 0.36-0.40x in bfloat16 (a 16-bit gather per element). Along another
    dimension (``cat_rows`` t: 1.0-2.7x eager) the tiles' rows are outer loops, and the
    kernel stays ember's."""
    pieces = node.args[0] if node.args else ()
    out = node.meta.get("val")
    if not isinstance(out, torch.Tensor) or not isinstance(pieces, list | tuple) or not out.ndim:
        return False
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if not isinstance(dim, int) or dim % out.ndim != out.ndim - 1:
        return False
    metas = [p.meta.get("val") for p in pieces if isinstance(p, torch.fx.Node)]
    return any(_across(m) for m in metas)


def _across(m: Any) -> bool:
    """A tensor of static sizes whose last dimension does not run along memory (a symbolic
    size or stride is not compared: that would guard on it)."""
    if not isinstance(m, torch.Tensor) or m.ndim < 2:
        return False
    n, stride = m.size(-1), m.stride(-1)
    return isinstance(n, int) and isinstance(stride, int) and n > 1 and stride != 1


ATEN_ALONE[aten.cat.default] = _cat_across


def alone(ctx: Lowerer, operand: Value) -> bool:
    """Whether the node being lowered is all its kernel would do: ``operand`` lies in
    memory (a graph input or a realized value) and every user of the result is the
    graph's output."""
    node = ctx.node
    return (
        node is not None
        and operand.ref is not None
        and bool(node.users)
        and all(u.op == "output" for u in node.users)
    )


def runs_alone(ctx: Lowerer, operand: Value) -> bool:
    """Whether the node being lowered runs as its aten op: :data:`ATEN_ALONE` says eager's
    kernel is faster, it stands :func:`alone`, and the kernels are C++ (the table's
    measurements are CPU ones)."""
    node = ctx.node
    rule = ATEN_ALONE.get(node.target) if node is not None else None
    return (
        node is not None
        and rule is not None
        and ctx.printer == "cpp"
        and rule(node)
        and alone(ctx, operand)
    )


def _gelu(x: Expr, approximate: str) -> Expr:
    """GELU in the order of torch's decomposition (``x * 0.5 * (1 + erf(x / sqrt(2)))``)."""
    f = x.dtype

    def c(v: float) -> Expr:
        return const(v, f)

    def e(op: Op, *args: Expr) -> Expr:
        return Expr(op, f, args)

    half = e(Op.MUL, x, c(0.5))
    if approximate == "tanh":
        cube = e(Op.MUL, e(Op.MUL, x, x), x)
        beta = 1.41421356237309504880 * 1.12837916709551257390 * 0.5  # torch's kBeta
        inner = e(Op.MUL, c(beta), e(Op.ADD, x, e(Op.MUL, cube, c(0.044715))))
        return e(Op.MUL, half, e(Op.ADD, e(Op.TANH, inner), c(1.0)))
    alpha = 0.70710678118654752440  # torch's kAlpha, 1/sqrt(2)
    return e(Op.MUL, half, e(Op.ADD, e(Op.ERF, e(Op.MUL, x, c(alpha))), c(1.0)))


@lowering(aten.gelu.default)
def gelu(ctx: Lowerer, x: Value, approximate: str = "none") -> Value:
    """GELU in ember's kernels, or the aten op where :data:`ATEN_ALONE` says so."""
    if not x.dtype.is_floating_point:
        raise Fallback("gelu of integers: eager's error")
    if runs_alone(ctx, x):
        raise Fallback("gelu alone: eager's kernel is faster (ATEN_ALONE)")

    def fn(a: Expr) -> Expr:
        return _gelu(a, approximate)

    fn.__name__ = "gelu"
    return pointwise(ctx, fn, x)
