"""The Triton matmul template: a kernel that is ``a @ b`` and pointwise work after it.

Under ``Knobs.matmul == "template"`` (max_autotune's other matmul path on a GPU), lowering
writes ``mm`` as a sum over the shared dim, ``out[i, j] = SUM over k of a[i, k] * b[k, j]``,
and the scheduler fuses the consumers of ``out`` (a bias add, an activation, a residual
add) into the same kernel as later stages over the same ``[M, N]`` points. :func:`match`
finds such a kernel: two outer loops, a first stage that sums the product of two loads,
one along each outer loop and both along the reduced one, and only pointwise stages over
no inner points after it. :func:`write` prints it as tiles: each program computes a
``[BM, BN]`` tile of ``out`` in a float32 accumulator with ``tl.dot`` over ``[BM, BK]``
and ``[BK, BN]`` blocks of the inputs, then runs the later stages on the tile, where a
read of ``out`` is the accumulator. A kernel that does not match is printed as any row
kernel (correct, and slow: max_autotune then keeps the extern call).

float32 inputs multiply as ``torch.backends.cuda.matmul.allow_tf32`` says (full precision
by default, as eager's cuBLAS call); half and bfloat16 inputs accumulate in float32.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from ember.inductor.knobs import Knobs, knobs
>>> from ember.inductor.lowering import lower_graph
>>> from ember.inductor.scheduler import schedule
>>> a, w = torch.randn(32, 16), torch.randn(16, 24)
>>> with knobs(Knobs(matmul="template")):
...     sched = schedule(lower_graph(make_fx(lambda a, w: (a @ w).relu())(a, w), [a, w]))
>>> print(sched.steps[0])
kernel0 over [32, 24]
  stage [16]: buf0 = SUM(MUL(a_1[16*x0 + y0], w_1[x1 + 24*y0]))
  stage []: buf1[24*x0 + x1] = MAX(buf0[24*x0 + x1], 0.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch

from ember.inductor.ir import Expr
from ember.inductor.knobs import KNOBS
from ember.inductor.ops import Op, Reduce
from ember.inductor.scheduler import Kernel, Store, X, Y
from ember.inductor.symbolic import is_static

__all__ = ["Matmul", "match", "write"]

BK = 32  # the reduced dim's block


@dataclass(frozen=True, slots=True)
class Matmul:
    """A kernel that :func:`match` found: ``out = a @ b`` over outer loops ``m`` and ``n``
    (``a[off_a + am*m + ak*k]``, ``b[off_b + bk*k + bn*n]``), then pointwise stages."""

    out: Store
    a: str
    b: str
    m: sympy.Symbol
    n: sympy.Symbol
    sizes: tuple[int, int, int]  # M, N, K
    a_index: tuple[int, int, int]  # offset, stride along m, stride along k
    b_index: tuple[int, int, int]  # offset, stride along k, stride along n
    dtype: torch.dtype  # the inputs'


def _load(e: Expr) -> Expr | None:
    """A plain load, under a cast to the accumulator's type if any."""
    if e.op is Op.CAST and e.args:
        e = e.args[0]
    return e if e.op is Op.LOAD and not e.args else None


def _linear(index: sympy.Expr, u: sympy.Symbol, v: sympy.Symbol) -> tuple[int, int, int] | None:
    """``index`` as ``offset + cu*u + cv*v`` with integer coefficients, or None."""
    index = sympy.expand(index)
    if not index.free_symbols <= {u, v}:
        return None
    cu, cv = index.coeff(u, 1), index.coeff(v, 1)
    off = index.subs({u: 0, v: 0})
    if not all(isinstance(c, sympy.Integer) for c in (cu, cv, off)):
        return None
    if sympy.expand(off + cu * u + cv * v - index) != 0:
        return None
    return int(off), int(cu), int(cv)


def match(kernel: Kernel, inline: Any) -> Matmul | None:
    """The template's reading of ``kernel`` (``inline`` recomputes a stage's values from
    their bodies, as the printer does), or None."""
    first, *rest = kernel.stages
    sizes = (*kernel.outer, *first.inner)
    if len(kernel.outer) != 2 or len(first.inner) != 1 or not all(is_static(n) for n in sizes):
        return None
    if len(first.stores) != 1 or first.stores[0].reduce is not Reduce.SUM:
        return None
    if any(st.is_reduction or st.inner for st in rest):
        return None
    out = first.stores[0]
    body = inline(out.body)
    loads = [_load(e) for e in body.args] if body.op is Op.MUL else []
    if len(loads) != 2 or None in loads:
        return None
    x0, x1, k = X[0], X[1], Y[0]
    for la, lb, (m, n) in ((loads[0], loads[1], (x0, x1)), (loads[0], loads[1], (x1, x0))):
        assert la is not None and lb is not None
        ia, ib = _linear(la.arg[1], m, k), _linear(lb.arg[1], k, n)
        if ia is not None and ib is not None and ia[2] and ib[1] and la.dtype == lb.dtype:
            size = dict(zip((x0, x1), kernel.outer, strict=True))
            mnk = (int(size[m]), int(size[n]), int(first.inner[0]))
            return Matmul(out, la.arg[0], lb.arg[0], m, n, mnk, ia, ib, la.dtype)
    return None


def _tiles(mm: Matmul) -> tuple[int, int, int]:
    """``BM, BN, BK``: a square tile of ``Knobs.row_elements`` points (64x64 by default),
    no larger than the matrix (at least 16: ``tl.dot``'s smallest)."""
    side = 1 << (int(math.log2(KNOBS.get().row_elements)) // 2)
    m, n, k = mm.sizes
    fit = [max(16, min(side if j < 2 else BK, 1 << max(d - 1, 0).bit_length()))
           for j, d in enumerate((m, n, k))]  # fmt: skip
    return fit[0], fit[1], fit[2]


def write(w: Any, mm: Matmul) -> list[str]:
    """The kernel's body on writer ``w`` (a ``codegen_triton._KernelWriter``): the tiled
    product, then the later stages on the tile."""
    bm, bn, bk = _tiles(mm)
    m, n, k = mm.sizes
    tiles_n = -(-n // bn)
    w.points, w.block = -(-m // bm) * tiles_n, 1
    w.warps = KNOBS.get().warps or (8 if bm * bn >= 16384 else 4)
    (oa, am, ak), (ob, bk_, bn_) = mm.a_index, mm.b_index
    precision = ""
    if mm.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        precision = ', input_precision="ieee"'  # eager's float32 cuBLAS call: no TF32
    for line in [
        "pid = tl.program_id(0)",
        f"rm = (pid // {tiles_n}) * {bm} + tl.arange(0, {bm})",
        f"rn = (pid % {tiles_n}) * {bn} + tl.arange(0, {bn})",
        f"acc = tl.zeros(({bm}, {bn}), tl.float32)",
        f"for k0 in range(0, {k}, {bk}):",
        f"    rk = k0 + tl.arange(0, {bk})",
        f"    ta = tl.load({mm.a} + ({oa} + rm[:, None] * {am} + rk[None, :] * {ak}),"
        f" (rm[:, None] < {m}) & (rk[None, :] < {k}), other=0)",
        f"    tb = tl.load({mm.b} + ({ob} + rk[:, None] * {bk_} + rn[None, :] * {bn_}),"
        f" (rk[:, None] < {k}) & (rn[None, :] < {n}), other=0)",
        f"    acc += tl.dot(ta, tb{precision})",
        f"{mm.m} = rm[:, None]",
        f"{mm.n} = rn[None, :]",
        f"xmask = ({mm.m} < {m}) & ({mm.n} < {n})",
        "mask = xmask",
    ]:
        w.emit(line)
    out, buf = mm.out, w.prog.buffers[mm.out.name]
    w.emit(f"{out.name}_l = {w._rounding('acc', out.body.dtype, buf.dtype)}")
    w.p.values[out.name] = f"{out.name}_l"
    if not out.local:
        w.emit(w._store(out, f"{out.name}_l", buf.dtype, "xmask"))
    for st in w.kernel.stages[1:]:
        w.pointwise(st, {}, 1)
    return list(w.lines)
