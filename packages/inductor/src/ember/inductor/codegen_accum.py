"""Accumulators of C++ sums: which float sums add in double, and which add each row in
float lanes first.

A float sum over all elements, or in one serial chain, accumulates in double (eager's
cascade sum drifts far less than one float accumulator). A double accumulator per
element converts every value and takes half the vector lanes, so a sum of everything whose
innermost loop is contiguous adds each row in float lanes (``buf0_row``) and only the
row sums in double.

>>> import sympy, torch
>>> from ember.inductor.codegen_cpp import translation_unit
>>> from ember.inductor.ir import Buffer, Expr, Layout, Program
>>> from ember.inductor.ops import Op, Reduce
>>> from ember.inductor.scheduler import Kernel, Schedule, Stage, Store, Y
>>> x = Buffer("x", torch.float32, Layout.contiguous((64, 256)))
>>> s = Buffer("s", torch.float32, Layout.contiguous(()))
>>> body = Expr(Op.LOAD, torch.float32, (), ("x", 256 * Y[0] + Y[1], ()))
>>> st = Stage((64, 256), (Store("s", body, sympy.Integer(0), Reduce.SUM),))
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

__all__ = ["ROW_PARTIAL", "acc_type", "row_partials"]

# longest row added in float lanes before its sum joins the double total: each of 8 or 16
# lanes then adds at most 1024 floats, whose error stays near eager's cascade sum
ROW_PARTIAL = 8192


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
    eager's 47; with row partials 61-71 us (the kernel alone: 50 us), 1 thread."""
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
