"""2-D tiles for pointwise Triton kernels whose loads and stores run along different dims.

A flat kernel (:mod:`ember.inductor.codegen_triton`) gives each program a run of
consecutive output points: its stores are coalesced, but a load that walks memory along
another loop variable (``x + y.t()``, a transpose copy, ``x.permute(0, 2, 1).contiguous()``)
then reads one element per line of memory. Such a kernel is *tiled* instead: each program
takes a ``[YBLOCK, XBLOCK]`` tile of two loop variables, the store's unit-stride one along
``XBLOCK`` (``tl.arange(0, XBLOCK)[None, :]``) and the load's along ``YBLOCK``
(``[:, None]``), so that both the read and the write run along lines of memory (on a GPU
Triton moves the tile between the two layouts through shared memory). Every other loop
variable is one number per program, read off the program id. Ragged edges are masked in
both directions; symbolic sizes reach the mask and the grid as for flat kernels.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from ember.inductor.codegen_triton import module_source
>>> from ember.inductor.lowering import lower_graph
>>> from ember.inductor.scheduler import schedule
>>> x, y = torch.randn(40, 50), torch.randn(50, 40)
>>> sched = schedule(lower_graph(make_fx(lambda x, y: x + y.t())(x, y), [x, y]))
>>> src, _ = module_source(sched, interpret=True)
>>> print(src[src.index("def kernel0"):src.index("def launch")].strip())
def kernel0(x_1, y_1, buf0):
    pid = tl.program_id(0)
    y0 = (pid % 2) * 32 + tl.arange(0, 32)[None, :]
    x0 = ((pid // 2) % 2) * 32 + tl.arange(0, 32)[:, None]
    mask = (x0 < 40) & (y0 < 50)
    t0 = tl.load(x_1 + ((y0 + 50 * x0)), mask, other=0)
    t1 = tl.load(y_1 + ((x0 + 40 * y0)), mask, other=0)
    t2 = (t0 + t1)
    tl.store(buf0 + ((y0 + 50 * x0)), t2.to(tl.float32), mask)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import sympy  # type: ignore[import-untyped]

from ember.inductor.ir import Expr
from ember.inductor.knobs import KNOBS
from ember.inductor.ops import Op
from ember.inductor.scheduler import X, Y
from ember.inductor.symbolic import hint, is_static

__all__ = ["TILE_SIDE", "Tile", "tile", "write"]

TILE_SIDE = 32  # the most points of a tile along each of its two variables


@dataclass(frozen=True, slots=True)
class Tile:
    """The two loop variables a tiled kernel's program spans: ``x`` (the store's unit-stride
    variable, ``XBLOCK`` wide) and ``y`` (a load's, ``YBLOCK`` high), by position."""

    x: int
    y: int


def _unit(index: sympy.Expr, vars_: list[sympy.Symbol], long: set[sympy.Symbol]) -> Any:
    """The last variable of ``long`` along which ``index`` moves by one, or None."""
    e = sympy.expand(index)
    units = [v for v in vars_ if v in long and e.coeff(v) == 1]
    return units[-1] if units else None


def tile(w: Any) -> Tile | None:
    """The tile of writer ``w``'s flat kernel whose stores run along one variable and a
    load along another (moving across memory along the store's: a transposed read); None
    otherwise. The loads are those of the stored values, the kernel's own values inlined."""
    kernel, hints = w.kernel, w.hints
    bodies = [w.inline(s.body) for st in kernel.stages for s in st.stores if not w._kept(s)]
    inner = kernel.stages[0].inner
    vars_ = [*X[: len(kernel.outer)], *Y[: len(inner)]]
    sizes = dict(zip(vars_, (*kernel.outer, *inner), strict=True))
    long = {v for v in vars_ if not is_static(sizes[v]) or int(sizes[v]) > 1}
    stored = [s for st in kernel.stages for s in st.stores if not s.local]
    if not stored:
        return None
    along = _unit(stored[0].index, vars_, long)
    if along is None:
        return None
    for body in bodies:
        for e in _walk(body):
            if e.op is not Op.LOAD or e.args:  # (an indirect load: its own index)
                continue
            index = sympy.expand(e.arg[1])
            other = _unit(index, vars_, long)
            if other is not None and other != along and index.coeff(along) != 0:
                if hint(sizes[other], hints) > 1 and hint(sizes[along], hints) > 1:
                    return Tile(vars_.index(along), vars_.index(other))
    return None


def _walk(e: Expr) -> list[Expr]:
    seen, out, todo = set(), [], [e]
    while todo:
        n = todo.pop()
        if id(n) not in seen:
            seen.add(id(n))
            out.append(n)
            todo.extend(n.args)
    return out


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _fit(n: Any) -> int:
    """A tile side for ``n`` points: ``n`` rounded up to a power of 2; a symbolic size gets
    the widest (masks take the rest at every size, as flat kernels' blocks)."""
    return _pow2(max(int(n), 1)) if is_static(n) else TILE_SIDE


def _count(n: Any, block: int) -> Any:
    """Blocks of ``block`` over ``n`` points (symbolic: a sympy expression)."""
    if is_static(n):
        return -(-int(n) // block)
    return sympy.floor((n + block - 1) / block)


def write(w: Any, t: Tile) -> list[str]:
    """The kernel's body on writer ``w`` (a ``codegen_triton._KernelWriter``): the tile's
    two variables as ``[1, XBLOCK]`` and ``[YBLOCK, 1]`` ranges, the others one number a
    program (to the printer: values the same across the block, like sizes)."""
    from ember.inductor.codegen_triton import _decompose, _operand, _t

    k = w.kernel
    inner = k.stages[0].inner
    vars_ = [*X[: len(k.outer)], *Y[: len(inner)]]
    sizes = [*k.outer, *inner]
    most = KNOBS.get().block
    xb = min(TILE_SIDE, _fit(sizes[t.x]))
    yb = min(TILE_SIDE, max(1, most // xb), _fit(sizes[t.y]))
    xs, ys = _count(sizes[t.x], xb), _count(sizes[t.y], yb)
    rest = [j for j in range(len(vars_)) if j not in (t.x, t.y)]
    w.points = xs * ys * math.prod(sizes[j] for j in rest)
    w.block, w.warps = 1, KNOBS.get().warps or 4
    w.p.shape, w.p.flat = "[1, 1]", None
    w.p.fixed = frozenset(vars_[j] for j in rest)  # one number a program
    w.emit(f"pid = {w.pid()}")
    w.emit(f"{vars_[t.x]} = (pid % {_operand(xs)}) * {xb} + tl.arange(0, {xb})[None, :]")
    w.emit(
        f"{vars_[t.y]} = ((pid // {_operand(xs)}) % {_operand(ys)}) * {yb}"
        f" + tl.arange(0, {yb})[:, None]"
    )
    w.emit(f"mask = ({vars_[t.y]} < {_t(sizes[t.y])}) & ({vars_[t.x]} < {_t(sizes[t.x])})")
    if rest:
        w.emit(f"rest = pid // {_operand(xs * ys)}")
        for line in _decompose([vars_[j] for j in rest], tuple(sizes[j] for j in rest), "rest"):
            w.emit(line)
    memo: dict[Expr, str] = {}
    for st in k.stages:
        w.pointwise(st, memo, 1)
    return list(w.lines)
