"""The loop IR's one op vocabulary and the one table of what each op means.

Every expression node of the loop IR carries an :class:`Op`. The sets below
classify ops (``op in UNARY``) and :data:`SEMANTICS` maps each computing op to
a reference function over torch tensors. That table is the single statement
of meaning: the reference interpreter (:mod:`ember.inductor.interpret`), the
constant folder (:mod:`ember.inductor.rewrite`) and the tests all use it, and
every code printer must agree with it.

>>> SEMANTICS[Op.ADD](torch.tensor([1.0]), torch.tensor([2.0]))
tensor([3.])
>>> Op.EXP in UNARY, Op.LT in COMPARE
(True, True)
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import torch

from ember.inductor import philox

__all__ = [
    "BINARY",
    "COMPARE",
    "LEAF",
    "RANDOM",
    "REDUCE_INIT",
    "SEMANTICS",
    "UNARY",
    "WELFORD",
    "Op",
    "Reduce",
]


class Op(enum.Enum):
    """Ops of loop-IR expressions; names reappear as table keys and in printouts."""

    # leaves: arg holds the buffer name and index, the constant, or the index expression
    LOAD = enum.auto()
    CONST = enum.auto()
    INDEX = enum.auto()  # the value of a sympy index expression, as int64
    SCALAR = enum.auto()  # a number known at run time only (a float graph input): arg is its name
    # unary
    NEG = enum.auto()
    ABS = enum.auto()
    EXP = enum.auto()
    EXPM1 = enum.auto()
    LOG = enum.auto()
    LOG1P = enum.auto()
    SQRT = enum.auto()
    RSQRT = enum.auto()
    RECIPROCAL = enum.auto()
    SIN = enum.auto()
    COS = enum.auto()
    TANH = enum.auto()
    SIGMOID = enum.auto()
    ERF = enum.auto()
    FLOOR = enum.auto()
    CEIL = enum.auto()
    TRUNC = enum.auto()
    NOT = enum.auto()  # logical not of a bool
    ISNAN = enum.auto()
    CAST = enum.auto()  # to the node's dtype
    # binary
    ADD = enum.auto()
    SUB = enum.auto()
    MUL = enum.auto()
    DIV = enum.auto()  # true division (floating point only)
    POW = enum.auto()
    MAX = enum.auto()  # NaN-propagating, like torch.maximum
    MIN = enum.auto()
    AND = enum.auto()
    OR = enum.auto()
    XOR = enum.auto()
    EQ = enum.auto()
    NE = enum.auto()
    LT = enum.auto()
    LE = enum.auto()
    GT = enum.auto()
    GE = enum.auto()
    # ternary
    WHERE = enum.auto()
    # random numbers of (int64 seed, int64 offset), float32 (see ember.inductor.philox)
    RAND = enum.auto()  # uniform in [0, 1)
    RANDN = enum.auto()  # standard normal


class Reduce(enum.Enum):
    """How a reduction combines its values."""

    SUM = enum.auto()
    PROD = enum.auto()
    MAX = enum.auto()
    MIN = enum.auto()
    ARGMAX = enum.auto()
    ARGMIN = enum.auto()
    ANY = enum.auto()
    ALL = enum.auto()
    # one-pass Welford over the values (a running mean and m2 per accumulator, partial results
    # joined with Chan's parallel formula): the mean, and the sum of squared deviations from
    # it. Two such nodes of the same body in one stage share one pass.
    WELFORD_MEAN = enum.auto()  # 0 over no values
    WELFORD_M2 = enum.auto()


WELFORD = frozenset({Reduce.WELFORD_MEAN, Reduce.WELFORD_M2})
LEAF = frozenset({Op.LOAD, Op.CONST, Op.INDEX, Op.SCALAR})
UNARY = frozenset(
    {Op.NEG, Op.ABS, Op.EXP, Op.EXPM1, Op.LOG, Op.LOG1P, Op.SQRT, Op.RSQRT, Op.RECIPROCAL}
    | {Op.SIN, Op.COS, Op.TANH, Op.SIGMOID, Op.ERF, Op.FLOOR, Op.CEIL, Op.TRUNC, Op.NOT}
    | {Op.ISNAN, Op.CAST}
)
RANDOM = frozenset({Op.RAND, Op.RANDN})
COMPARE = frozenset({Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE})
BINARY = frozenset(
    {Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.POW, Op.MAX, Op.MIN, Op.AND, Op.OR, Op.XOR} | COMPARE
)

Fn = Callable[..., torch.Tensor]

# op -> reference function over tensors (already in the node's computation dtype)
SEMANTICS: dict[Op, Fn] = {
    Op.NEG: torch.neg,
    Op.ABS: torch.abs,
    Op.EXP: torch.exp,
    Op.EXPM1: torch.expm1,
    Op.LOG: torch.log,
    Op.LOG1P: torch.log1p,
    Op.SQRT: torch.sqrt,
    Op.RSQRT: torch.rsqrt,
    Op.RECIPROCAL: torch.reciprocal,
    Op.SIN: torch.sin,
    Op.COS: torch.cos,
    Op.TANH: torch.tanh,
    Op.SIGMOID: torch.sigmoid,
    Op.ERF: torch.erf,
    Op.FLOOR: torch.floor,
    Op.CEIL: torch.ceil,
    Op.TRUNC: torch.trunc,
    Op.NOT: torch.logical_not,
    Op.ISNAN: torch.isnan,
    Op.ADD: torch.add,
    Op.SUB: torch.sub,
    Op.MUL: torch.mul,
    Op.DIV: torch.div,
    Op.POW: torch.pow,
    Op.MAX: torch.maximum,
    Op.MIN: torch.minimum,
    Op.AND: torch.logical_and,
    Op.OR: torch.logical_or,
    Op.XOR: torch.logical_xor,
    Op.EQ: torch.eq,
    Op.NE: torch.ne,
    Op.LT: torch.lt,
    Op.LE: torch.le,
    Op.GT: torch.gt,
    Op.GE: torch.ge,
    Op.WHERE: torch.where,
    Op.RAND: philox.uniform,
    Op.RANDN: philox.normal,
}

# reduction -> (reference function over the last dim, identity element)
REDUCE_INIT: dict[Reduce, tuple[Fn, float | bool | None]] = {
    Reduce.SUM: (lambda t: t.sum(-1), 0),
    Reduce.PROD: (lambda t: t.prod(-1), 1),
    Reduce.MAX: (lambda t: t.amax(-1), float("-inf")),
    Reduce.MIN: (lambda t: t.amin(-1), float("inf")),
    Reduce.ARGMAX: (lambda t: t.argmax(-1), None),
    Reduce.ARGMIN: (lambda t: t.argmin(-1), None),
    Reduce.ANY: (lambda t: t.any(-1), False),
    Reduce.ALL: (lambda t: t.all(-1), True),
    Reduce.WELFORD_MEAN: (lambda t: t.mean(-1) if t.shape[-1] else t.sum(-1), 0),
    Reduce.WELFORD_M2: (lambda t: (t - t.mean(-1, keepdim=True)).square().sum(-1), 0),
}
