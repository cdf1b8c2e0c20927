"""Transposed operands of a tiled C++ kernel, copied to a local tile before the loop that
computes on them.

A pointwise kernel over mixed layouts (``x.t() + y``) runs in 16x16 tiles
(:mod:`ember.inductor.looporder`): its innermost loop ``y0`` runs along memory for the
output and the contiguous operands, and 1024 elements apart for the transposed one. gcc
does not vectorise a loop with such a load (it unrolls the 16 iterations and stays scalar:
every ``exp`` of a SiLU then is scalar, and a max's NaN select a branch). So the kernel
first copies the transposed operand's tile into a local array, reading it along memory
(``x2`` innermost), and the computing loop reads that array along ``y0``: one vector loop.
1M bfloat16 ``maximum(x.t(), y)``: 1.8 ms -> 0.74 ms (kernel alone, 1 thread).

>>> import sympy, torch
>>> from ember.inductor.codegen_cpp import translation_unit
>>> from ember.inductor.ir import Buffer, Expr, Layout, Program
>>> from ember.inductor.ops import Op
>>> from ember.inductor.scheduler import Kernel, Schedule, Stage, Store, X, Y
>>> a = Buffer("a", torch.float32, Layout.contiguous((64, 64)))
>>> out = Buffer("out", torch.float32, Layout.contiguous((64, 64)))
>>> tile = 16 * X[0] + 1024 * X[1] + 64 * X[2] + Y[0]  # tiles of the output, in memory order
>>> body = Expr(Op.LOAD, torch.float32, (), ("a", 16 * X[1] + 1024 * X[0] + X[2] + 64 * Y[0], ()))
>>> st = Stage((16,), (Store("out", Expr(Op.EXP, torch.float32, (body,)), tile),))
>>> prog = Program({"a": a, "out": out}, ["a"], [], [])
>>> src = translation_unit(Schedule(prog, [Kernel("k", (4, 4, 16), (st,))]))[0]
>>> print(src[src.index('extern "C" void k(') :].split("\\n}\\n")[0])
extern "C" void k(const float* __restrict__ a, float* __restrict__ out) {
  for (int64_t x0 = 0; x0 < 4; ++x0) {
    for (int64_t x1 = 0; x1 < 4; ++x1) {
      float a_tile0[16][16];
      for (int64_t y0 = 0; y0 < 16; ++y0) {
        #pragma omp simd
        for (int64_t x2 = 0; x2 < 16; ++x2) {
          a_tile0[x2][y0] = a[(x2 + (16 * x1) + (64 * y0) + (1024 * x0))];
        }
      }
      for (int64_t x2 = 0; x2 < 16; ++x2) {
        #pragma omp simd EMBER_WIDE
        for (int64_t y0 = 0; y0 < 16; ++y0) {
          float t0 = a_tile0[x2][y0];
          float t1 = ember_exp(t0);
          out[(y0 + (16 * x0) + (64 * x2) + (1024 * x1))] = t1;
        }
      }
    }
  }
"""

from __future__ import annotations

import sympy  # type: ignore[import-untyped]

from ember.inductor.ir import Expr, walk
from ember.inductor.ops import Op
from ember.inductor.scheduler import Kernel, X, Y

__all__ = ["TILE_MAX", "transposed_loads"]

TILE_MAX = 32  # tiles up to this side are staged (looporder makes 16x16 ones)


def transposed_loads(kernel: Kernel) -> list[Expr]:
    """The loads of a tiled pointwise ``kernel`` that run across memory along its innermost
    loop ``y0`` and along it in the last outer loop (the tile's other side), in order of
    appearance; empty if the kernel is not such a tile or has none."""
    if len(kernel.stages) != 1 or not kernel.outer:
        return []
    st = kernel.stages[0]
    side = kernel.outer[-1]
    if st.is_reduction or st.inner != (side,) or not isinstance(side, int) or side > TILE_MAX:
        return []
    if any(s.local for s in st.stores):
        return []
    written = {s.name for s in st.stores}
    x_last, found = X[len(kernel.outer) - 1], list[Expr]()
    for s in st.stores:
        for e in walk(s.body):
            if e.op is not Op.LOAD or e in found:
                continue
            name, index, indirect = e.arg
            if not indirect and name not in written and _transposed(index, x_last):
                found.append(e)
    return [] if _narrow_gathers(kernel, found) else found


def _narrow_gathers(kernel: Kernel, staged: list[Expr]) -> bool:
    """Whether a load the staging leaves in the loop clamps ``y0`` (a ``cat``'s other
    input) and is narrower than 32 bits: once the loop vectorises it is a gather, which x86
    has not for 16-bit elements (bf16 ``cat`` of a transposed input, staged: 0.93 -> 0.44-0.76x
    eager; float32 gains, 0.43 -> 1.0)."""
    for s in kernel.stages[0].stores:
        for e in walk(s.body):
            if e.op is not Op.LOAD or e in staged or e.dtype.itemsize >= 4:
                continue
            clamps = e.arg[1].atoms(sympy.Min, sympy.Max, sympy.floor, sympy.Mod)
            if any(Y[0] in c.free_symbols for c in clamps):
                return True
    return False


def _transposed(index: sympy.Expr, x_last: sympy.Symbol) -> bool:
    """Whether ``index`` runs along memory in ``x_last`` (step 1, outside every clamp) and
    not along ``y0``. A clamp of ``y0`` (a ``cat`` of a transposed input: the input's row
    ``min(1023, y0 + 16*x1)``) stays in the copy's index: the copy runs over the same points
    the loop would read, so it reads nothing the loop would not."""
    clamps = index.atoms(sympy.Min, sympy.Max, sympy.floor, sympy.Mod)
    if any(x_last in c.free_symbols for c in clamps) or sympy.diff(index, x_last) != 1:
        return False
    if Y[0] not in index.free_symbols:
        return False
    return bool(clamps) or sympy.diff(index, Y[0]) != 1
