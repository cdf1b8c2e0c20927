"""The C++ printer of body expressions (:class:`CppPrinter`) and the table-driven
:class:`Printer` it fills: ``OPS`` maps each :class:`~ember.inductor.ops.Op` to a format
string, ``TYPES`` each dtype to a type name, ``CASTS`` conversions, ``REDUCE`` each
reduction to its identity and combine step; a Triton printer overrides entries, not
methods. Half and bfloat16 compute in float; bfloat16 is raw bits in a ``uint16_t``.

>>> p = CppPrinter()
>>> p.OPS[Op.MAX], p.type(torch.bfloat16), p.index(sympy.Symbol("i") * 4 + 1)
('ember_max({0}, {1})', 'uint16_t', '(1 + (4 * i))')
"""

from __future__ import annotations

import abc
import functools
import math
from typing import Any, ClassVar

import sympy  # type: ignore[import-untyped]
import torch

from ember.inductor.index_print import IndexSyntax, print_index
from ember.inductor.ir import Expr
from ember.inductor.ops import Op, Reduce

__all__ = ["CppPrinter", "Printer", "bf16_exact", "cindex", "ordered_bound"]


class Printer(abc.ABC):
    """A code printer driven by tables; subclasses override table entries."""

    OPS: ClassVar[dict[Op, str]] = {}
    TYPES: ClassVar[dict[torch.dtype, str]] = {}
    MEMORY_TYPES: ClassVar[dict[torch.dtype, str]] = {}  # element types in memory, if different
    LOADS: ClassVar[dict[torch.dtype, str]] = {}  # dtype -> format of a load from memory
    CASTS: ClassVar[dict[tuple[torch.dtype, torch.dtype], str]] = {}  # (from, to) -> format
    REDUCE: ClassVar[dict[Reduce, tuple[str, str]]] = {}  # kind -> (identity, combine)
    WELFORD_STEP: ClassVar[str] = ""  # update mean {m}, m2 {s} by {v} shifted by {k}
    SCALAR: ClassVar[str] = "{0}"  # how a kernel names its run-time number argument

    def __init__(self) -> None:
        self.count = 0

    def bit_op(self, e: Expr) -> tuple[Expr, str] | None:
        """``e`` as a format applied to the bits of one operand, where that is exact; None
        if not (the default: no such ops)."""
        return None

    def op_format(self, e: Expr) -> str:
        """The format string of ``e``'s op (``OPS``, unless a printer knows better)."""
        return self.OPS[e.op]

    def fresh(self) -> str:
        self.count += 1
        return f"t{self.count - 1}"

    def type(self, dtype: torch.dtype) -> str:
        return self.TYPES[dtype]

    @abc.abstractmethod
    def const(self, value: Any, dtype: torch.dtype) -> str:
        """A literal of ``dtype``."""

    @abc.abstractmethod
    def index(self, e: sympy.Expr) -> str:
        """A sympy index expression in the target language."""

    def expr(self, e: Expr, memo: dict[Expr, str], lines: list[str]) -> str:
        """Emit ``e`` (each distinct subexpression once) into ``lines``; return its name."""
        name = memo.get(e)
        if name is not None:
            return name
        bits = self.bit_op(e)
        if bits is not None:  # an exact op on the stored bits: no conversion either way
            code = bits[1].format(self.expr(bits[0], memo, lines))
            memo[e] = name = self.fresh()
            lines.append(f"{self.type(e.dtype)} {name} = {code};")
            return name
        args = [self.expr(a, memo, lines) for a in e.args]
        if e.op is Op.CONST:
            return self.const(e.arg, e.dtype)
        if e.op is Op.SCALAR:
            return self.SCALAR.format(e.arg)
        if e.op is Op.LOAD:
            src, index, indirect = e.arg
            index = index.xreplace(
                {s: sympy.Symbol(a) for s, a in zip(indirect, args, strict=True)}
            )
            code = self.LOADS.get(e.dtype, "{0}").format(f"{src}[{self.index(index)}]")
        elif e.op is Op.INDEX:
            code = self.index(e.arg)
        elif e.op is Op.CAST:
            fmt = self.CASTS.get((e.args[0].dtype, e.dtype), self.OPS[Op.CAST])
            code = fmt.format(*args, T=self.type(e.dtype))
        else:
            code = self.op_format(e).format(*args, T=self.type(e.dtype))
        name = self.fresh()
        lines.append(f"{self.type(e.dtype)} {name} = {code};")
        memo[e] = name
        return name


def _float(value: float, suffix: str) -> str:
    if math.isnan(value):
        return "NAN"
    if math.isinf(value):
        return "INFINITY" if value > 0 else "-INFINITY"
    return f"{value!r}{suffix}"


_OTHER = (
    torch.float64,
    torch.float16,
    torch.bool,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
)


class CppPrinter(Printer):
    """C++17 with OpenMP; only ``<cmath>``, ``<cstdint>`` and ``<limits>``."""

    OPS = {
        Op.NEG: "(-{0})",
        Op.ABS: "std::abs({0})",
        Op.EXP: "ember_exp({0})",
        Op.EXPM1: "ember_expm1({0})",
        Op.LOG: "std::log({0})",
        Op.LOG1P: "std::log1p({0})",
        Op.SQRT: "std::sqrt({0})",
        Op.RSQRT: "({T}(1) / std::sqrt({0}))",
        Op.RECIPROCAL: "({T}(1) / {0})",
        Op.SIN: "ember_sin({0})",
        Op.COS: "ember_cos({0})",
        Op.TANH: "ember_tanh({0})",
        Op.SIGMOID: "ember_sigmoid({0})",
        Op.ERF: "ember_erf({0})",
        Op.FLOOR: "std::floor({0})",
        Op.CEIL: "std::ceil({0})",
        Op.TRUNC: "std::trunc({0})",
        Op.NOT: "(!{0})",
        Op.ISNAN: "({0} != {0})",
        Op.RAND: "ember_rand({0}, {1})",
        Op.RANDN: "ember_randn({0}, {1})",
        Op.CAST: "static_cast<{T}>({0})",
        Op.ADD: "({0} + {1})",
        Op.SUB: "({0} - {1})",
        Op.MUL: "({0} * {1})",
        Op.DIV: "({0} / {1})",
        Op.POW: "std::pow({0}, {1})",
        Op.MAX: "ember_max({0}, {1})",
        Op.MIN: "ember_min({0}, {1})",
        Op.AND: "({0} && {1})",
        Op.OR: "({0} || {1})",
        Op.XOR: "({0} != {1})",
        Op.EQ: "({0} == {1})",
        Op.NE: "({0} != {1})",
        Op.LT: "({0} < {1})",
        Op.LE: "({0} <= {1})",
        Op.GT: "({0} > {1})",
        Op.GE: "({0} >= {1})",
        Op.WHERE: "({0} ? {1} : {2})",
    }
    SCALAR = "s_{0}"  # apart from every C++ name (an fx node may be called ``exp``)
    # a simd clause for loops calling vector math: the prelude makes it simdlen(16) where
    # AVX-512 is, as gcc's cost model keeps 8 lanes (exp over 1M floats 0.47 -> 0.40 ms)
    WIDE = " EMBER_WIDE"
    # the same for loops moving 2-byte floats: with 16 lanes gcc keeps the floats in two
    # 256-bit halves (bf16 exp over 1M: 599 us, 461 with 32 lanes; eager 484)
    WIDE_HALF = " EMBER_WIDE_HALF"
    WIDE_OPS = frozenset({Op.EXP, Op.EXPM1, Op.TANH, Op.SIGMOID, Op.ERF, Op.SIN, Op.COS})
    # bool lives in memory as uint8_t: gcc vectorises byte loads, not bool loads
    MEMORY_TYPES = {torch.bool: "uint8_t"}
    LOADS = {torch.bool: "({0} != 0)"}
    TYPES = {
        torch.float32: "float",
        torch.float64: "double",
        torch.float16: "_Float16",
        torch.bfloat16: "uint16_t",
        torch.bool: "bool",
        torch.int8: "int8_t",
        torch.uint8: "uint8_t",
        torch.int16: "int16_t",
        torch.int32: "int32_t",
        torch.int64: "int64_t",
    }
    # bf16 is raw bits in a uint16_t: every cast goes through float
    CASTS = {
        (torch.bfloat16, torch.float32): "ember_bf16_to_float({0})",
        (torch.float32, torch.bfloat16): "ember_float_to_bf16({0})",
        **{(torch.bfloat16, d): "static_cast<{T}>(ember_bf16_to_float({0}))" for d in _OTHER},
        **{(d, torch.bfloat16): "ember_float_to_bf16(static_cast<float>({0}))" for d in _OTHER},
        # a select, not a conversion of bool: gcc then vectorises loops that mix the mask
        # with 64-bit lanes (a dropout mask from int64 random counters)
        **{(torch.bool, d): "({0} ? {T}(1) : {T}(0))" for d in _OTHER if d != torch.bool},
        (torch.bool, torch.float32): "({0} ? 1.0f : 0.0f)",
    }
    # bfloat16 -> float -> neg/abs -> bfloat16 changes the sign bit only: the conversions
    # (shift, rounding, NaN select) made bf16 neg 2.7x slower than eager's 48 us for 1M
    BF16_SIGN = {Op.NEG: "uint16_t({0} ^ 0x8000u)", Op.ABS: "uint16_t({0} & 0x7fffu)"}
    REDUCE = {
        Reduce.SUM: ("0", "{acc} += {v};"),
        Reduce.PROD: ("1", "{acc} *= {v};"),
        # max/min track NaN in a flag, so the loop stays a plain (vectorisable) max/min
        Reduce.MAX: (
            "ember_lowest<{T}>()",
            "{acc} = {v} > {acc} ? {v} : {acc}; {acc}_nan |= ({v} != {v});",
        ),
        Reduce.MIN: (
            "ember_highest<{T}>()",
            "{acc} = {v} < {acc} ? {v} : {acc}; {acc}_nan |= ({v} != {v});",
        ),
        Reduce.ANY: ("false", "{acc} = {acc} || {v};"),
        Reduce.ALL: ("true", "{acc} = {acc} && {v};"),
        Reduce.ARGMAX: (
            "0",
            "if ({v} > {acc}_v || ({v} != {v} && {acc}_v == {acc}_v)) "
            "{{ {acc}_v = {v}; {acc} = {i}; }}",
        ),
        Reduce.ARGMIN: (
            "0",
            "if ({v} < {acc}_v || ({v} != {v} && {acc}_v == {acc}_v)) "
            "{{ {acc}_v = {v}; {acc} = {i}; }}",
        ),
    }
    # one point of a Welford lane: count already advanced, ``{r}`` its reciprocal
    WELFORD_STEP = (
        "{{ const {T} wv = {v} - {k}, wd = wv - {m}; {m} += wd * {r}; {s} += wd * (wv - {m}); }}"
    )
    OMP_REDUCE = {
        Reduce.SUM: "reduction(+:{acc})",
        Reduce.PROD: "reduction(*:{acc})",
        Reduce.ANY: "reduction(||:{acc})",
        Reduce.ALL: "reduction(&&:{acc})",
        Reduce.MAX: "reduction(max:{acc}) reduction(|:{acc}_nan)",
        Reduce.MIN: "reduction(min:{acc}) reduction(|:{acc}_nan)",
    }

    # max/min of a value and a number that is not NaN: one vmaxps/vminps when the number is
    # a variable to gcc (see ordered_bound); the NaN test on the number falls away
    ORDERED = {Op.MAX: "({1} > {0} ? {1} : {0})", Op.MIN: "({1} < {0} ? {1} : {0})"}

    def op_format(self, e: Expr) -> str:
        return self.ORDERED[e.op] if ordered_bound(e) is not None else self.OPS[e.op]

    def bit_op(self, e: Expr) -> tuple[Expr, str] | None:
        """bfloat16 ``neg``/``abs`` on the sign bit, for a value rounded to bfloat16 just
        after: ``CAST(bf16, NEG(CAST(f32, x)))`` is ``x ^ 0x8000``. A float that bfloat16
        holds exactly (:func:`bf16_exact`: ``relu``, ``clamp``, ``max`` or a select of
        bfloat16 values) becomes bfloat16 by dropping its low 16 bits."""
        if e.op is not Op.CAST or e.dtype != torch.bfloat16:
            return None
        (op,) = e.args
        fmt = self.BF16_SIGN.get(op.op)
        if fmt is not None and op.args[0].op is Op.CAST:
            (x,) = op.args[0].args
            if x.dtype == torch.bfloat16:
                return (x, fmt)
        if op.dtype == torch.float32 and bf16_exact(op):
            return (op, "ember_bf16_bits({0})")
        return None

    def const(self, value: Any, dtype: torch.dtype) -> str:
        if dtype == torch.bool:
            return "true" if value else "false"
        if dtype == torch.float32:
            return _float(float(value), "f")
        if dtype == torch.bfloat16:  # raw bits in a uint16_t: a cast of 1.0 would be 0x0001
            bits = int(torch.tensor(float(value), dtype=dtype).view(torch.int16).item()) & 0xFFFF
            return f"static_cast<uint16_t>({bits:#06x})"
        if dtype.is_floating_point:
            return f"static_cast<{self.type(dtype)}>({_float(float(value), '')})"
        return f"static_cast<{self.type(dtype)}>({int(value)}LL)"

    def index(self, e: sympy.Expr) -> str:
        return cindex(e)


def ordered_bound(e: Expr) -> Expr | None:
    """The number ``e`` bounds a value by, when ``e`` is a float ``max``/``min`` whose second
    operand is a constant other than NaN (``relu``, ``clamp``, ``hardtanh``); else None.

    The C++ printer writes such a max as ``c > x ? c : x``, which is x86's ``maxps(c, x)``
    to the letter (a NaN ``x`` comes through), and the code generator names ``c`` before the
    loop through ``ember_opaque``: gcc folds the select of a literal into compares and
    blends instead (clamp: 8 vector ops per 8 floats, not 2; 1M floats 240 us, eager 150).

    >>> from ember.inductor.ir import const
    >>> x = Expr(Op.LOAD, torch.float32, (), ("x", 0, ()))
    >>> ordered_bound(Expr(Op.MAX, torch.float32, (x, const(0.0, torch.float32)))).arg
    0.0
    >>> ordered_bound(Expr(Op.MAX, torch.float32, (x, const(math.nan, torch.float32))))
    """
    if e.op not in (Op.MAX, Op.MIN) or e.dtype not in (torch.float32, torch.float64):
        return None
    bound = e.args[1]
    if bound.op is not Op.CONST or math.isnan(float(bound.arg)):
        return None
    return bound


# ops that map values bfloat16 holds to values it holds: a pick of an operand, its sign
# bit changed, or rounded to an integer (8 significant bits hold every integer below 2^8,
# and every bfloat16 from 2^7 up is an integer already)
_KEEPS_BF16 = frozenset({Op.MAX, Op.MIN, Op.NEG, Op.ABS, Op.FLOOR, Op.CEIL, Op.TRUNC})
# types whose every value bfloat16 holds exactly (8 significant bits)
_NARROW = frozenset({torch.bfloat16, torch.int8, torch.uint8, torch.bool})


@functools.lru_cache(maxsize=4096)
def bf16_exact(e: Expr) -> bool:
    """Whether float ``e`` is always a value bfloat16 holds exactly (NaN included): read
    from bfloat16 or a narrow integer, a constant bfloat16 holds, or made from such values
    by ``max``, ``min``, ``neg``, ``abs``, a select, ``floor``, ``ceil`` or ``trunc``. Its
    rounding to bfloat16 is then exact: the bits' top half, no rounding step nor NaN test.
    gcc threaded those into ``clamp``'s selects (1M bfloat16 ``clamp``: 0.56x eager -> 1.1x).

    >>> x = Expr(Op.CAST, torch.float32, (Expr(Op.LOAD, torch.bfloat16, (), ("x", 0, ())),))
    >>> from ember.inductor.ir import const
    >>> half, third = const(-0.5, torch.float32), const(1 / 3, torch.float32)
    >>> def big(a): return Expr(Op.MAX, torch.float32, (x, a))
    >>> bf16_exact(big(half)), bf16_exact(big(third))
    (True, False)
    """
    if e.op is Op.CAST:
        return e.args[0].dtype in _NARROW
    if e.op is Op.CONST:
        value = float(e.arg)
        return math.isnan(value) or float(torch.tensor(value, dtype=torch.bfloat16)) == value
    if e.op is Op.WHERE:
        return bf16_exact(e.args[1]) and bf16_exact(e.args[2])
    return e.op in _KEEPS_BF16 and all(bf16_exact(a) for a in e.args)


_CPP_INDEX = IndexSyntax(
    integer=lambda n: f"{n}LL" if abs(n) > 2**31 - 1 else str(n),
    terms=lambda e: e.args,
    product="({})",
    floor_div="(({}) / {})",
    mod="(({}) % {})",
    minimum="std::min<int64_t>({}, {})",
    maximum="std::max<int64_t>({}, {})",
    unsupported=ValueError,
)


def cindex(e: sympy.Expr) -> str:
    """A non-negative sympy index as C++ int64 arithmetic."""
    return print_index(e, _CPP_INDEX)
