"""Accumulators of C++ sums and products: which float ones run in double, and which sums
add each row (or a few rows) in float lanes first.

A float sum over all elements, or in one serial chain, accumulates in double (eager's
cascade sum drifts far less than one float accumulator). A double accumulator per
element converts every value and takes half the vector lanes, so a sum of everything
whose innermost loop is contiguous adds each row in float lanes (``buf0_row``) and only
the row sums in double; over 2-byte floats a float partial spans several rows
(``row_group``), and a float row that 32 divides adds into 32 lanes (``lane_split``).

>>> import sympy, torch
>>> from ember.inductor.codegen_cpp import translation_unit
>>> from ember.inductor.ir import Buffer, Expr, Layout, Program
>>> from ember.inductor.ops import Op, Reduce
>>> from ember.inductor.scheduler import Kernel, Schedule, Stage, Store, Y
>>> x = Buffer("x", torch.float32, Layout.contiguous((64, 250)))
>>> s = Buffer("s", torch.float32, Layout.contiguous(()))
>>> body = Expr(Op.LOAD, torch.float32, (), ("x", 250 * Y[0] + Y[1], ()))
>>> st = Stage((64, 250), (Store("s", body, sympy.Integer(0), Reduce.SUM),))
>>> prog = Program({"x": x, "s": s}, ["x"], [], [])
>>> src = translation_unit(Schedule(prog, [Kernel("k", (), (st,))]))[0]
>>> print("\\n".join(ln for ln in src.splitlines() if "s_acc" in ln or "s_row" in ln))
  double s_acc = 0;
    float s_row = 0;
    #pragma omp simd reduction(+:s_row)
      s_row += t0;
    s_acc += s_row;
  s[0] = s_acc;
"""

from __future__ import annotations

import torch

from ember.inductor.ops import Reduce
from ember.inductor.scheduler import Stage, Store

__all__ = [
    "LANES",
    "ROW_PARTIAL",
    "acc_type",
    "lane_folds",
    "lane_split",
    "row_group",
    "row_partials",
]

# longest row added in float lanes before its sum joins the double total: each of 8 or 16
# lanes then adds at most 1024 floats, whose error stays near eager's cascade sum
ROW_PARTIAL = 8192


# float lanes of a row sum split into independent accumulators (lane_split): four AVX2
# vectors, two AVX-512 ones
LANES = 32

#: float reductions accumulated in double when they run over everything or in one chain
_WIDENED = (Reduce.SUM, Reduce.PROD)


def acc_type(t: str, s: Store, wide: bool) -> str:
    """A reduction's accumulator type: a float sum or product of all elements, or in one
    serial chain (strided rows: no vector lanes share it), in double: eager's cascade sum
    drifts far less than one float accumulator (1e5 rows: 1.3e-3 from the exact sum against
    6e-5), and so does its product (1M factors near 1: 0.77% off the exact product against
    eager's 0.46%; in double, 0.00%).

    >>> from ember.inductor.ir import Expr
    >>> from ember.inductor.ops import Op
    >>> s = Store("s", Expr(Op.CONST, torch.float32, (), 1.0), 0, Reduce.SUM)
    >>> acc_type("float", s, wide=True), acc_type("float", s, wide=False)
    ('double', 'float')
    """
    return "double" if wide and s.reduce in _WIDENED and t == "float" else t


def row_partials(st: Stage, wide: bool, vectorise: bool) -> set[str]:
    """The names of the stage's double-accumulated float sums that add each row (its
    innermost, vectorised loop, at most ``ROW_PARTIAL`` long) in float lanes first: with a
    double accumulator per element ember's sum of 1M floats took 112 us a call against
    eager's 47; with row partials 61-71 us (the kernel alone: 50 us), 1 thread.

    Products keep double all along, although float rows would run at eager's speed (1M
    factors: 45 us in the kernel alone against 88): a float product of factors near 1 rounds
    with a bias (a product landing just above 1 on a tie broken by the tiny cross term
    always rounds down: -7e-10 a multiply), and a partial restarted at 1 every row stays in
    that range. Float rows of 64 factors a lane drifted 2-3e-4 off the exact product of
    1M factors near 1, eager 3e-7 to 2e-5."""
    if not vectorise or len(st.inner) < 2:
        return set()
    last = st.inner[-1]
    if not isinstance(last, int) or last > ROW_PARTIAL:
        return set()
    return {
        s.name
        for s in st.stores
        if s.reduce is Reduce.SUM
        and s.body.dtype == torch.float32
        and acc_type("float", s, wide) == "double"
    }


def row_group(st: Stage, narrow: bool) -> int:
    """How many consecutive rows share one float partial (one ``simd collapse(2)`` loop).

    A loop over 2-byte floats runs 32 lanes (two 16-float accumulators) and gcc ends each
    simd loop with the lanes added one by one, in order: 32 dependent scalar adds a row of
    1024 bfloat16s, which made ember's bfloat16 sum of 1M 64 us against eager's 56 (the
    kernel alone). Summing 8 rows in one loop: 48 us. Float32 rows stay one per loop: one
    16-float chain over 8 rows waits on its own adds (46 -> 54 us), while a chain per row
    overlaps the next row's.

    >>> from ember.inductor.scheduler import Stage
    >>> row_group(Stage((1024, 1024), ()), narrow=True), row_group(Stage((1024, 1024), ()), False)
    (8, 1)
    >>> row_group(Stage((6, 1024), ()), narrow=True)  # a group divides the rows
    2
    """
    if not narrow or len(st.inner) < 2:
        return 1
    rows, last = st.inner[-2], st.inner[-1]
    if not isinstance(rows, int) or not isinstance(last, int):
        return 1
    group = 1
    while rows % (2 * group) == 0 and 2 * group * last <= ROW_PARTIAL:
        group *= 2
    return group


def lane_split(st: Stage, wide: bool, vectorise: bool) -> int:
    """How many float lanes each row sum of ``st`` keeps apart (0: one vector's, as
    ``omp simd reduction`` does): ``LANES`` where every store is a float sum or product along a
    contiguous innermost loop of a static length that ``LANES`` divides, twice or more.

    ``omp simd reduction(+:acc)`` keeps one vector accumulator, and each add waits for the
    one before (4 cycles on AMD's Zen 3; AVX2's 8 lanes): x.mean(-1) of 1024x1024 floats
    took 137 us against eager's 116. Four vectors (``acc_v[32]``, indexed by the lane)
    overlap their adds: 81 us (the kernel alone, 1 thread).

    >>> from ember.inductor.ir import Expr
    >>> from ember.inductor.ops import Op
    >>> body = Expr(Op.CONST, torch.float32, (), 1.0)
    >>> sums = Stage((1024,), (Store("s", body, 0, Reduce.SUM),))
    >>> lane_split(sums, wide=False, vectorise=True), lane_split(sums, wide=True, vectorise=True)
    (32, 0)
    """
    last = st.inner[-1] if st.inner else 0
    if not vectorise or wide or not isinstance(last, int) or last % LANES or last < 2 * LANES:
        return 0
    if all(s.reduce in _LANE_INIT and s.body.dtype == torch.float32 for s in st.stores):
        return LANES
    return 0


# a lane's start and the C++ operator joining lanes, for the reductions lane_split takes
_LANE_INIT = {Reduce.SUM: ("0", "+"), Reduce.PROD: ("1", "*")}


def lane_init(acc: str, lanes: int, reduce: Reduce) -> str:
    """The C++ declaration of ``acc``'s lanes ``acc_v``, each at the reduction's start.

    >>> lane_init("p_acc", 32, Reduce.PROD)
    'float p_acc_v[32]; for (int64_t k = 0; k < 32; ++k) p_acc_v[k] = 1;'
    """
    start = _LANE_INIT[reduce][0]
    if start == "0":
        return f"float {acc}_v[{lanes}] = {{}};"
    return f"float {acc}_v[{lanes}]; for (int64_t k = 0; k < {lanes}; ++k) {acc}_v[k] = {start};"


def lane_folds(acc: str, lanes: int, reduce: Reduce = Reduce.SUM) -> list[str]:
    """C++ lines adding ``acc``'s lanes ``acc_v`` into ``acc``, as ``omp simd reduction``
    does: the vectors onto one, then its 8 (or 16) lanes in order. (Halves onto halves
    written out, gcc added all 32 lanes as scalars: 60 instructions a row, not 20.)

    >>> lane_folds("s_acc", 32)
    ['#pragma omp simd reduction(+:s_acc)', 'for (int64_t k = 0; k < 32; ++k) s_acc += s_acc_v[k];']
    """
    op = _LANE_INIT[reduce][1]
    return [
        f"#pragma omp simd reduction({op}:{acc})",
        f"for (int64_t k = 0; k < {lanes}; ++k) {acc} {op}= {acc}_v[k];",
    ]
