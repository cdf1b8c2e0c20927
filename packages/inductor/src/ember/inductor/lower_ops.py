"""Lowerings of pointwise ops, reductions, creation ops, ``cat`` and indexing.

Pointwise ops follow torch's type promotion: operands are cast to the
computation dtype (half and bfloat16 compute in float32), the op is applied,
the result is cast to eager's output dtype.

>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from ember.inductor.lowering import lower_graph
>>> gm = make_fx(lambda x: torch.where(x > 0, x, 0.5 * x))(torch.randn(4))
>>> print(lower_graph(gm, [torch.randn(4)]).nodes[0])
buf0[4] = WHERE(GT(x_1[i0], 0.0), x_1[i0], MUL(x_1[i0], 0.5))
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch
import torch.fx
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as KIND
from torch._prims_common import elementwise_dtypes

from ember.inductor.ir import Expr, I, R, Scalar, const, scalar
from ember.inductor.knobs import KNOBS
from ember.inductor.low_precision import LOW, rounded, to_common
from ember.inductor.lower_views import broadcast
from ember.inductor.lowering import (
    LOWERINGS,
    READS_MEMORY,
    Fallback,
    Lowerer,
    Value,
    lowering,
    size_const,
)
from ember.inductor.ops import Op, Reduce
from ember.inductor.symbolic import FloatSize

__all__ = ["cast", "pointwise"]

aten = torch.ops.aten
FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


def cast(e: Expr, dtype: torch.dtype) -> Expr:
    if e.dtype == dtype:
        return e
    if e.op is Op.CONST:
        return const(_convert(e.arg, dtype), dtype)
    return Expr(Op.CAST, dtype, (e,))


def _convert(value: Any, dtype: torch.dtype) -> Any:
    if dtype == torch.bool:
        return bool(value)
    return float(value) if dtype.is_floating_point else int(value)


def _fits(value: Any, dtype: torch.dtype) -> Any:
    """``value``, if eager can fill a ``dtype`` tensor with it; else Fallback: the aten call
    raises eager's error ("value cannot be converted to type int8_t without overflow")
    where a kernel would store a wrapped number."""
    if not isinstance(value, bool | int | float):
        return value
    try:
        torch.full((2,), value, dtype=dtype, device="cpu")  # eager's check (one element: none)
    except RuntimeError as e:
        raise Fallback(f"fill value {value!r} for {dtype}: {e}") from None
    return value


def _compute(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _meta_of(ctx: Lowerer, a: Any) -> Any:
    """What type promotion sees for a lowering argument: a fake tensor or a Python scalar."""
    if isinstance(a, Value):
        return torch.empty((), dtype=a.dtype) if a.ndim == 0 else torch.empty((1,), dtype=a.dtype)
    if isinstance(a, Scalar):  # a Python number to type promotion, whatever its value
        return {torch.float64: 1.0, torch.int64: 1, torch.bool: True}[a.dtype]
    if isinstance(a, sympy.Basic | FloatSize):  # a symbolic size (float() of one)
        return 1.0 if isinstance(a, FloatSize) else 1
    return a


def pointwise(
    ctx: Lowerer,
    fn: Callable[..., Expr],
    *args: Any,
    kind: KIND = KIND.DEFAULT,
    compute: torch.dtype | None = None,
) -> Value:
    """Apply ``fn`` (over Exprs in the computation dtype) to tensors and scalars."""
    out_meta = ctx.meta
    if not isinstance(out_meta, torch.Tensor):
        raise Fallback("pointwise op without a tensor result")
    sizes, out_dtype = ctx.shape(out_meta), out_meta.dtype
    low = None
    if compute is None:
        numbers = Value | Scalar | int | float | bool | sympy.Basic | FloatSize
        metas = [_meta_of(ctx, a) for a in args if isinstance(a, numbers)]
        compute = _compute(elementwise_dtypes(*metas, type_promotion_kind=kind)[0])
        common = elementwise_dtypes(*metas, type_promotion_kind=KIND.DEFAULT)[1]
        low = common if common in LOW else None
    if compute not in FLOATS and fn in FLOAT_ONLY:
        raise Fallback(f"{fn.__name__} on {compute}")
    loaders = [
        broadcast(a, sizes).loader if isinstance(a, Value) else _scalar(a, compute) for a in args
    ]
    if low is not None:
        loaders = [
            rounded(ld, low) if to_common(fn, a, low) else ld
            for ld, a in zip(loaders, args, strict=True)
        ]

    def loader(idx: Sequence[sympy.Expr]) -> Expr:
        return cast(fn(*[cast(load(idx), compute) for load in loaders]), out_dtype)

    return Value(sizes, out_dtype, loader)


def _scalar(a: Any, dtype: torch.dtype) -> Callable[[Sequence[sympy.Expr]], Expr]:
    if isinstance(a, Scalar):
        if a.dtype == torch.float64 and not dtype.is_floating_point:
            raise Fallback("float scalar with an integer computation")
        leaf = cast(scalar(a), dtype)  # eager too converts the number to the computation dtype
        return lambda idx: leaf
    if isinstance(a, sympy.Basic) or (isinstance(a, FloatSize) and dtype.is_floating_point):
        return lambda idx: size_const(getattr(a, "size", a), dtype)  # symbolic: kernel args
    if not isinstance(a, int | float | bool):
        raise Fallback(f"scalar argument {a!r}")
    if isinstance(a, float) and not dtype.is_floating_point:
        raise Fallback("float scalar with an integer computation")
    e = const(_convert(a, dtype), dtype)
    return lambda idx: e


def _un(op: Op) -> Callable[[Expr], Expr]:
    def fn(a: Expr) -> Expr:
        return Expr(op, torch.bool if op in (Op.ISNAN, Op.NOT) else a.dtype, (a,))

    fn.__name__ = op.name.lower()
    return fn


def _bin(op: Op) -> Callable[[Expr, Expr], Expr]:
    def fn(a: Expr, b: Expr) -> Expr:
        return Expr(op, torch.bool if op in CMP else a.dtype, (a, b))

    fn.__name__ = op.name.lower()
    return fn


CMP = {Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE}
FLOAT_ONLY: set[Callable[..., Expr]] = set()


def _register_unary(target: Any, op: Op, kind: KIND, float_only: bool = True) -> None:
    fn = _un(op)
    if float_only:
        FLOAT_ONLY.add(fn)
    lowering(target)(lambda ctx, a: pointwise(ctx, fn, a, kind=kind))


for _target, _op in [
    (aten.exp.default, Op.EXP),
    (aten.expm1.default, Op.EXPM1),
    (aten.log.default, Op.LOG),
    (aten.log1p.default, Op.LOG1P),
    (aten.sqrt.default, Op.SQRT),
    (aten.rsqrt.default, Op.RSQRT),
    (aten.reciprocal.default, Op.RECIPROCAL),
    (aten.sin.default, Op.SIN),
    (aten.cos.default, Op.COS),
    (aten.tanh.default, Op.TANH),
    (aten.sigmoid.default, Op.SIGMOID),
    (aten.erf.default, Op.ERF),
]:
    _register_unary(_target, _op, KIND.INT_TO_FLOAT)
for _target, _op in [
    (aten.floor.default, Op.FLOOR),
    (aten.ceil.default, Op.CEIL),
    (aten.trunc.default, Op.TRUNC),
]:
    _register_unary(_target, _op, KIND.DEFAULT)
_register_unary(aten.neg.default, Op.NEG, KIND.DEFAULT, float_only=False)
_register_unary(aten.abs.default, Op.ABS, KIND.DEFAULT, float_only=False)
_register_unary(aten.logical_not.default, Op.NOT, KIND.ALWAYS_BOOL, float_only=False)
_register_unary(aten.isnan.default, Op.ISNAN, KIND.ALWAYS_BOOL)

_ADD, _SUB, _MUL = _bin(Op.ADD), _bin(Op.SUB), _bin(Op.MUL)


@lowering(aten.add.Tensor, aten.add.Scalar, scalars=True)
def add(ctx: Lowerer, a: Any, b: Any, *, alpha: Any = 1) -> Value:
    if alpha != 1:
        return pointwise(ctx, lambda x, y, k: _ADD(x, _MUL(y, k)), a, b, alpha)
    return pointwise(ctx, _ADD, a, b)


@lowering(aten.sub.Tensor, aten.sub.Scalar, scalars=True)
def sub(ctx: Lowerer, a: Any, b: Any, *, alpha: Any = 1) -> Value:
    if alpha != 1:
        return pointwise(ctx, lambda x, y, k: _SUB(x, _MUL(y, k)), a, b, alpha)
    return pointwise(ctx, _SUB, a, b)


@lowering(aten.rsub.Tensor, aten.rsub.Scalar, scalars=True)
def rsub(ctx: Lowerer, a: Any, b: Any, *, alpha: Any = 1) -> Value:
    return sub(ctx, b, a, alpha=alpha)


_DIV = _bin(Op.DIV)
FLOAT_ONLY.add(_DIV)


@lowering(aten.div.Tensor, aten.div.Scalar, scalars=True)
def div(ctx: Lowerer, a: Any, b: Any) -> Value:
    return pointwise(ctx, _DIV, a, b, kind=KIND.INT_TO_FLOAT)


def _binary(
    targets: Sequence[Any], op: Op, kind: KIND = KIND.DEFAULT, floats: bool = False
) -> None:
    fn = _bin(op)
    if floats:
        FLOAT_ONLY.add(fn)
    lowering(*targets, scalars=True)(lambda ctx, a, b: pointwise(ctx, fn, a, b, kind=kind))


_binary([aten.mul.Tensor, aten.mul.Scalar], Op.MUL)
_binary([aten.maximum.default], Op.MAX)
_binary([aten.minimum.default], Op.MIN)
_binary([aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar], Op.POW, KIND.BOOL_TO_LONG, True)
_binary([aten.logical_and.default], Op.AND, KIND.ALWAYS_BOOL)
_binary([aten.logical_or.default], Op.OR, KIND.ALWAYS_BOOL)
_binary([aten.logical_xor.default], Op.XOR, KIND.ALWAYS_BOOL)
for _name, _op in [
    ("eq", Op.EQ),
    ("ne", Op.NE),
    ("lt", Op.LT),
    ("le", Op.LE),
    ("gt", Op.GT),
    ("ge", Op.GE),
]:
    _packet = getattr(aten, _name)
    _binary([_packet.Tensor, _packet.Scalar], _op, KIND.ALWAYS_BOOL)


@lowering(
    aten.bitwise_and.Tensor,
    aten.bitwise_or.Tensor,
    aten.bitwise_xor.Tensor,
    aten.bitwise_not.default,
)
def bitwise(ctx: Lowerer, *args: Any) -> Value:
    if any(isinstance(a, Value) and a.dtype != torch.bool for a in args):
        raise Fallback("bitwise ops on integers")
    assert ctx.node is not None
    op = {"and": Op.AND, "or": Op.OR, "xor": Op.XOR, "not": Op.NOT}[
        str(ctx.node.target).split("_")[1].split(".")[0]
    ]
    fn = _un(op) if op is Op.NOT else _bin(op)
    return pointwise(ctx, fn, *args, kind=KIND.ALWAYS_BOOL)


_MAX, _MIN = _bin(Op.MAX), _bin(Op.MIN)


def where_(c: Expr, a: Expr, b: Expr) -> Expr:
    return Expr(Op.WHERE, a.dtype, (cast(c, torch.bool), a, b))


@lowering(
    aten.where.self,
    aten.where.ScalarSelf,
    aten.where.ScalarOther,
    aten.where.Scalar,
    scalars=True,
)
def where(ctx: Lowerer, cond: Value, a: Any, b: Any) -> Value:
    a, b = _fits(a, ctx.meta.dtype), _fits(b, ctx.meta.dtype)
    metas = [_meta_of(ctx, x) for x in (a, b)]
    compute = _compute(elementwise_dtypes(*metas, type_promotion_kind=KIND.NO_OPMATH)[0])
    return pointwise(ctx, lambda c, x, y: where_(_as_bool(c), x, y), cond, a, b, compute=compute)


def _as_bool(e: Expr) -> Expr:
    """Undo the computation-dtype cast that ``pointwise`` put on a bool condition."""
    return e.args[0] if e.op is Op.CAST and e.args[0].dtype == torch.bool else cast(e, torch.bool)


@lowering(aten.relu.default)
def relu(ctx: Lowerer, a: Value) -> Value:
    return pointwise(ctx, lambda x: _MAX(x, const(_convert(0, x.dtype), x.dtype)), a)


@lowering(aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default, scalars=True)
def clamp(ctx: Lowerer, a: Value, lo: Any = None, hi: Any = None) -> Value:
    assert ctx.node is not None
    if str(ctx.node.target).startswith("aten.clamp_max"):
        lo, hi = None, lo
    bounds = [b for b in (lo, hi) if b is not None]

    def fn(x: Expr, *bs: Expr) -> Expr:
        it = iter(bs)
        if lo is not None:
            x = _MAX(x, next(it))
        if hi is not None:
            x = _MIN(x, next(it))
        return x

    return pointwise(ctx, fn, a, *bounds)


@lowering(aten.sign.default, aten.sgn.default)
def sign(ctx: Lowerer, a: Value) -> Value:
    def fn(x: Expr) -> Expr:
        if x.dtype == torch.bool:  # a bool is its own sign (and bools have no negation)
            return x
        zero, one = const(_convert(0, x.dtype), x.dtype), const(_convert(1, x.dtype), x.dtype)
        gt, lt = _bin(Op.GT)(x, zero), _bin(Op.LT)(x, zero)
        return (
            _SUB(cast(gt, x.dtype), cast(lt, x.dtype))
            if x.dtype in FLOATS
            else where_(gt, one, where_(lt, _un(Op.NEG)(one), zero))
        )

    return pointwise(ctx, fn, a)


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor, scalars=True)
def masked_fill(ctx: Lowerer, a: Value, mask: Value, value: Any) -> Value:
    if isinstance(value, Value) and value.ndim != 0:
        raise Fallback("masked_fill with a non-scalar value")
    return where(ctx, mask, value, a)


@lowering(
    aten._to_copy.default, aten.clone.default, aten.copy.default, aten.lift_fresh_copy.default
)
def to_copy(ctx: Lowerer, a: Value, *args: Any, **kwargs: Any) -> Value:
    out = ctx.meta
    if out.device != ctx.device or kwargs.get("layout") not in (None, torch.strided):
        raise Fallback("a copy to another device or layout")
    if args and isinstance(args[0], Value):  # aten.copy(self, src): src broadcast to self
        a = args[0]
    src = broadcast(a, ctx.shape(out))
    return Value(src.sizes, out.dtype, lambda idx: cast(src.loader(idx), out.dtype))


# ---- creation ------------------------------------------------------------------------------


def _filled(ctx: Lowerer, value: Any) -> Value:
    out = ctx.meta
    if isinstance(value, Value):
        raise Fallback("fill with a tensor")
    if isinstance(value, Scalar):
        if value.dtype == torch.float64 and not out.dtype.is_floating_point:
            raise Fallback("fill of integers with a float")
        leaf = cast(scalar(value), out.dtype)
        return Value(ctx.shape(out), out.dtype, lambda idx: leaf)
    e = const(_convert(_fits(value, out.dtype), out.dtype), out.dtype)
    return Value(ctx.shape(out), out.dtype, lambda idx: e)


@lowering(aten.full.default, aten.full_like.default, aten.scalar_tensor.default, scalars=True)
def full(ctx: Lowerer, a: Any, value: Any = None, **kwargs: Any) -> Value:
    assert ctx.node is not None
    return _filled(ctx, a if ctx.node.target is aten.scalar_tensor.default else value)


@lowering(aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default)
def zeros(ctx: Lowerer, *args: Any, **kwargs: Any) -> Value:
    return _filled(ctx, 0)


@lowering(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def ones(ctx: Lowerer, *args: Any, **kwargs: Any) -> Value:
    return _filled(ctx, 1)


@lowering(aten.arange.start_step, aten.arange.start, aten.arange.default)
def arange(ctx: Lowerer, *args: Any, **kwargs: Any) -> Value:
    start, step = (0, 1) if len(args) < 2 else (args[0], args[2] if len(args) > 2 else 1)
    out = ctx.meta
    if not all(isinstance(x, int) for x in (start, step)):
        raise Fallback("arange over floats")
    if out.dtype == torch.bool:  # eager has no bool kernel: the aten call raises its error
        raise Fallback("arange of bool")
    return Value(
        ctx.shape(out),
        out.dtype,
        lambda idx: cast(
            Expr(Op.INDEX, torch.int64, (), sympy.Integer(start) + step * idx[0]), out.dtype
        ),
    )


# ---- reductions ----------------------------------------------------------------------------


def _reduce(
    ctx: Lowerer,
    kind: Reduce,
    a: Value,
    dims: Sequence[int] | int | None,
    keepdim: bool,
    acc: torch.dtype,
    out: torch.dtype | None = None,  # the result's dtype (default: the fx node's)
) -> Value:
    from ember.inductor.lower_alone import runs_alone  # (it imports this module)

    if runs_alone(ctx, a):
        raise Fallback("a reduction along memory, alone: eager's kernel is faster (ATEN_ALONE)")
    if isinstance(dims, int):
        dims = [dims]
    dims = sorted({d % max(a.ndim, 1) for d in (dims if dims else range(a.ndim))})
    kept = [d for d in range(a.ndim) if d not in dims]
    ranges = tuple(a.sizes[d] for d in kept)
    reduce_ranges = tuple(a.sizes[d] for d in dims)
    idx: list[sympy.Expr] = [sympy.Integer(0)] * a.ndim
    for j, d in enumerate(kept):
        idx[d] = I[j]
    for j, d in enumerate(dims):
        idx[d] = R[j]
    body = cast(a.loader(idx), acc) if a.ndim else cast(a.loader([]), acc)
    red = ctx.reduction(kind, ranges, reduce_ranges, body, out or ctx.meta.dtype)
    if keepdim and a.ndim:
        sizes = tuple(1 if d in dims else n for d, n in enumerate(a.sizes))

        def keep(ix: Sequence[sympy.Expr]) -> Expr:
            return red.loader([ix[d] for d in kept])

        return Value(sizes, red.dtype, keep)
    return red


def _acc(ctx: Lowerer, a: Value) -> torch.dtype:
    out = ctx.meta.dtype
    return torch.float32 if out in (torch.float16, torch.bfloat16) else out


@lowering(aten.sum.dim_IntList, aten.sum.default)
def sum_(ctx: Lowerer, a: Value, dims: Any = None, keepdim: bool = False, **kw: Any) -> Value:
    return _reduce(ctx, Reduce.SUM, a, dims, keepdim, _acc(ctx, a))


@lowering(aten.prod.dim_int, aten.prod.default)
def prod(ctx: Lowerer, a: Value, dim: Any = None, keepdim: bool = False, **kw: Any) -> Value:
    return _reduce(ctx, Reduce.PROD, a, dim, keepdim, _acc(ctx, a))


@lowering(aten.mean.dim, aten.mean.default)
def mean(ctx: Lowerer, a: Value, dims: Any = None, keepdim: bool = False, **kw: Any) -> Value:
    out_dtype = ctx.meta.dtype
    if out_dtype not in FLOATS:
        raise Fallback("mean of integers")
    total = _reduce(ctx, Reduce.SUM, a, dims, keepdim, _acc(ctx, a))
    n = math.prod(a.sizes) // max(math.prod(total.sizes), 1) if a.sizes else 1
    acc = _acc(ctx, a)
    return Value(
        total.sizes,
        out_dtype,
        lambda idx: cast(_DIV(cast(total.loader(idx), acc), size_const(n, acc)), out_dtype),
    )


@lowering(aten.amax.default, aten.max.dim)
def amax(ctx: Lowerer, a: Value, dims: Any = (), keepdim: bool = False) -> Any:
    if ctx.node is not None and ctx.node.target is aten.max.dim:
        raise Fallback("max.dim returns indices too")
    return _reduce(ctx, Reduce.MAX, a, dims, keepdim, _acc(ctx, a))


@lowering(aten.amin.default)
def amin(ctx: Lowerer, a: Value, dims: Any = (), keepdim: bool = False) -> Value:
    return _reduce(ctx, Reduce.MIN, a, dims, keepdim, _acc(ctx, a))


@lowering(
    aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim, aten.all.dims
)
def any_all(ctx: Lowerer, a: Value, dims: Any = None, keepdim: bool = False) -> Value:
    assert ctx.node is not None
    kind = Reduce.ANY if str(ctx.node.target).startswith("aten.any") else Reduce.ALL
    if ctx.meta.dtype != torch.bool:
        raise Fallback("any/all of uint8")
    return _reduce(ctx, kind, a, dims, keepdim, torch.bool)


# ---- cat, padding, indexing ----------------------------------------------------------------


# sympy's Min/Max compare their arguments (ms a call); every layer clamps the same indices
@functools.lru_cache(maxsize=4096)
def _clamp(e: sympy.Expr, n: int) -> sympy.Expr:
    return sympy.Min(sympy.Max(e, 0), n - 1)


# A fused cat reads every input at every output element (a chain of selects), so past a
# few inputs torch's copy kernel wins (an RNN stacking 32 steps ran 16x the loads).
CAT_FUSE_MAX = 4


@lowering(aten.cat.default)
def cat(ctx: Lowerer, tensors: Sequence[Value], dim: int = 0) -> Value:
    out = ctx.meta
    pieces = [t for t in tensors if math.prod(t.sizes) > 0]
    if not pieces:
        raise Fallback("cat of empty tensors")
    if len(pieces) > CAT_FUSE_MAX:
        raise Fallback(f"cat of {len(pieces)} inputs (more than {CAT_FUSE_MAX})")
    from ember.inductor.lower_alone import runs_alone  # (it imports this module)

    if all(runs_alone(ctx, t) for t in pieces):
        raise Fallback("cat across a transposed input, alone: eager's copy is faster")
    d = dim % out.ndim
    starts = list(__import__("itertools").accumulate([0] + [t.sizes[d] for t in pieces]))

    def loader(idx: Sequence[sympy.Expr]) -> Expr:
        result = None
        for t, lo, hi in reversed(list(zip(pieces, starts, starts[1:], strict=False))):
            at = [*idx[:d], _clamp(idx[d] - lo, hi - lo), *idx[d + 1 :]]
            e = cast(t.loader(at), out.dtype)
            if result is None:
                result = e
            else:
                inside = Expr(Op.LT, torch.bool, (_index(idx[d]), _index(sympy.sympify(hi))))
                result = Expr(Op.WHERE, out.dtype, (inside, e, result))
        assert result is not None
        return result

    return Value(ctx.shape(out), out.dtype, loader)


def _index(e: sympy.Expr) -> Expr:
    return Expr(Op.INDEX, torch.int64, (), e)


@lowering(aten.constant_pad_nd.default)
def constant_pad_nd(ctx: Lowerer, a: Value, pad: Sequence[int], value: Any = 0) -> Value:
    out = ctx.meta
    if any(p < 0 for p in pad):
        raise Fallback("negative padding")
    fill = const(_convert(value, out.dtype), out.dtype)
    if 0 in a.sizes:
        return Value(ctx.shape(out), out.dtype, lambda idx: fill)

    def loader(idx: Sequence[sympy.Expr]) -> Expr:
        at, inside = list(idx), None
        for k in range(len(pad) // 2):
            d = a.ndim - 1 - k
            lo = pad[2 * k]
            at[d] = _clamp(idx[d] - lo, a.sizes[d])
            ok = Expr(
                Op.AND,
                torch.bool,
                (
                    Expr(Op.GE, torch.bool, (_index(idx[d]), _index(sympy.Integer(lo)))),
                    Expr(
                        Op.LT, torch.bool, (_index(idx[d]), _index(sympy.sympify(lo + a.sizes[d])))
                    ),
                ),
            )
            inside = ok if inside is None else Expr(Op.AND, torch.bool, (inside, ok))
        e = a.loader(at)
        return e if inside is None else Expr(Op.WHERE, out.dtype, (inside, e, fill))

    return Value(ctx.shape(out), out.dtype, loader)


# ---- prims that torch's reference decompositions leave behind -------------------------------

prims = torch.ops.prims


@lowering(prims.convert_element_type.default)
def convert_element_type(ctx: Lowerer, a: Value, dtype: torch.dtype) -> Value:
    return Value(a.sizes, dtype, lambda idx: cast(a.loader(idx), dtype))


@lowering(prims.sum.default)
def prims_sum(ctx: Lowerer, a: Value, dims: Sequence[int], **kw: Any) -> Value:
    return _reduce(ctx, Reduce.SUM, a, dims, False, _acc(ctx, a))


@lowering(aten.addmm.default)
def addmm(ctx: Lowerer, bias: Value, a: Value, b: Value, *, beta: Any = 1, alpha: Any = 1) -> Value:
    """``bias + a @ b`` as ``torch.mm`` and an add that fuses into the result's consumers.

    aten's addmm first copies the broadcast bias into the output, then accumulates the
    product into it: a pass over the output that the consumer's kernel (``gelu(x @ w + b)``)
    does for free. Only when every user computes on the result; a view, an extern or a
    graph output reading it would need it stored, and then addmm is as good (Fallback)."""
    node = ctx.node
    assert node is not None
    computes = all(
        u.op == "call_function"
        and u.target in LOWERINGS
        and not getattr(u.target, "is_view", 0)
        and u.target is not aten._unsafe_view.default  # a view, though its schema does not say
        for u in node.users
    )
    whole = KNOBS.get().addmm == "aten"  # max_autotune's other matmul path
    if whole or beta != 1 or alpha != 1 or not computes or not isinstance(bias, Value):
        raise Fallback("addmm kept whole")
    if _feeds_aten_alone(node):
        raise Fallback("addmm kept whole: its consumer runs as its aten kernel")
    if (product := matmul_template(ctx, a, b)) is None:
        product = ctx.extern(node, (a, b), {}, target=aten.mm.default)
    return pointwise(ctx, _ADD, product, bias)


def _feeds_aten_alone(node: torch.fx.Node) -> bool:
    """Every user of ``node`` is an op that runs as its aten kernel when it stands alone
    (:data:`~ember.inductor.lower_alone.ATEN_ALONE`) and whose result is only returned: split,
    the bias add would move into ember's kernel for the op (erf GELU at 0.44x eager's in
    bfloat16); whole, the op stands alone on addmm's result (``F.gelu(torch.addmm(b, x, w))``:
    0.67 -> 1.0x eager in bfloat16)."""
    from ember.inductor.lower_alone import ATEN_ALONE  # (it imports this module)

    return all(
        u.target in ATEN_ALONE
        and ATEN_ALONE[u.target](u)
        and all(r.op == "output" for r in u.users)
        for u in node.users
    )


READS_MEMORY.add(aten.mm.default)


@lowering(aten.mm.default)
def mm(ctx: Lowerer, a: Value, b: Value) -> Value:
    """The extern call (cuBLAS, BLAS), unless max_autotune tries the Triton template."""
    if (product := matmul_template(ctx, a, b)) is None:
        raise Fallback("mm runs as the extern call")
    return product


def matmul_template(ctx: Lowerer, a: Value, b: Value) -> Value | None:
    """``a @ b`` as a sum over the shared dim (``Knobs.matmul == "template"``: the Triton
    printer writes it as a tiled ``tl.dot`` kernel); None for the extern call. Both
    inputs are realized first, so that the kernel reads two buffers it can tile."""
    dtype = ctx.meta.dtype
    sizes = [*a.sizes, *b.sizes]
    if KNOBS.get().matmul != "template" or a.ndim != 2 or b.ndim != 2 or dtype not in FLOATS:
        return None
    if not all(isinstance(n, int) for n in sizes) or a.dtype != b.dtype:
        return None
    a, b = ctx.realized(a), ctx.realized(b)
    acc = torch.float32 if dtype in LOW else dtype
    body = _MUL(cast(a.loader([I[0], R[0]]), acc), cast(b.loader([R[0], I[1]]), acc))
    return ctx.reduction(Reduce.SUM, (a.sizes[0], b.sizes[1]), (a.sizes[1],), body, dtype)


@lowering(prims.amax.default)
def prims_amax(ctx: Lowerer, a: Value, dims: Sequence[int]) -> Value:
    return _reduce(ctx, Reduce.MAX, a, dims, False, _acc(ctx, a))


@lowering(prims.amin.default)
def prims_amin(ctx: Lowerer, a: Value, dims: Sequence[int]) -> Value:
    return _reduce(ctx, Reduce.MIN, a, dims, False, _acc(ctx, a))


@lowering(prims.var.default)
def prims_var(ctx: Lowerer, a: Value, dims: Sequence[int], correction: float, **kw: Any) -> Value:
    """One Welford pass (the sum of squared deviations from a running mean: as stable as two
    passes, unlike a sum of squares); a sum of the same values becomes its mean times n."""
    acc = _acc(ctx, a)
    if acc not in FLOATS:
        raise Fallback("var of integers")
    if a.ndim and not dims:
        raise Fallback("var over no dims")
    n = math.prod(a.sizes[d % a.ndim] for d in dims) if a.ndim else 1
    m2 = _reduce(ctx, Reduce.WELFORD_M2, a, dims, False, acc, out=acc)
    if not isinstance(n, int) and not float(correction).is_integer():
        raise Fallback(f"var with correction {correction} over a symbolic size")
    count = max(n - correction, 0) if isinstance(n, int) else sympy.Max(n - int(correction), 0)
    denom = size_const(count, acc)  # a symbolic one computed in the kernel
    out = ctx.meta.dtype
    return Value(m2.sizes, out, lambda idx: cast(_DIV(m2.loader(idx), denom), out))


for _name, _fn in [
    ("add", _ADD),
    ("sub", _SUB),
    ("mul", _MUL),
    ("maximum", _MAX),
    ("minimum", _MIN),
]:
    lowering(getattr(prims, _name).default, scalars=True)(
        lambda ctx, a, b, _f=_fn: pointwise(ctx, _f, a, b)
    )
for _name, _op in [
    ("exp", Op.EXP),
    ("log", Op.LOG),
    ("sqrt", Op.SQRT),
    ("rsqrt", Op.RSQRT),
    ("tanh", Op.TANH),
    ("erf", Op.ERF),
    ("neg", Op.NEG),
    ("abs", Op.ABS),
]:
    _register_unary(getattr(prims, _name).default, _op, KIND.DEFAULT, _op not in (Op.NEG, Op.ABS))


@lowering(prims.div.default, scalars=True)
def prims_div(ctx: Lowerer, a: Any, b: Any) -> Value:
    if ctx.meta.dtype not in FLOATS:
        raise Fallback("prims.div of integers truncates")
    return pointwise(ctx, _DIV, a, b)


@lowering(prims.where.default, scalars=True)
def prims_where(ctx: Lowerer, cond: Value, a: Any, b: Any) -> Value:
    return where(ctx, cond, a, b)


from ember.inductor import (  # noqa: E402, F401  (register; own modules)
    lower_argmax,
    lower_index,
    lower_resize,
    lower_scatter,
)
