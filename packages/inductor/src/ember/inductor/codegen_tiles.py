"""Column kernels: reductions whose rows are strided while the last outer index is the
contiguous one (sums over the batch in backward graphs, ``x.amax(0)``), computed a strip of
outputs at a time.

Instead of one strided inner loop per output, a column kernel walks the rows once per strip
of neighbouring outputs (up to :data:`STRIP`, a whole row of 1024) and keeps an array of
accumulators across the strip, so it reads each row in sequence and gcc vectorises across
the strip. Sums, products, any/all, max/min (NaN kept in the value), argmax/argmin and
Welford run this way; float32 sums of long columns fold float blocks into double totals.
:class:`TiledLoops` is the part of the C++ kernel writer (``codegen_cpp._KernelWriter``)
that writes them.

>>> import sympy, torch
>>> from ember.inductor.ops import Op, Reduce
>>> from ember.inductor.scheduler import Kernel, Stage, Store, X, Y
>>> load = Expr(Op.LOAD, torch.float32, (), ("x", Y[0] * 64 + X[0], ()))
>>> st = Stage((32,), (Store("out", load, X[0], Reduce.SUM),))
>>> column_kernel(Kernel("k", (64,), (st,)))  # sum over rows of a 32x64 matrix
True
"""

from __future__ import annotations

import abc
import math
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch

from ember.inductor.codegen_welford import WelfordLoops, by_body
from ember.inductor.ir import Expr, Layout, Program, walk
from ember.inductor.ops import WELFORD, Op, Reduce
from ember.inductor.restage import COLUMN
from ember.inductor.scheduler import Kernel, Stage, Store, X, Y

__all__ = ["STRIP", "STRIP_CPP", "TILE", "TILEABLE", "TiledLoops", "column_kernel", "strip_width"]

#: The helper of column kernels on threads (inserted after the prelude where one calls it).
STRIP_CPP = r"""#include <omp.h>
// a column kernel's strip width: its widest ``w``, or narrower (a multiple of ``q``) so that
// each thread has strips of its own when the other outer loops have fewer points than threads
static inline int64_t ember_strip(int64_t n, int64_t outer, int64_t w, int64_t q) {
  const int64_t t = omp_get_max_threads();
  if (outer >= t) return w;
  const int64_t per = (t + outer - 1) / outer;  // strips each outer point needs
  const int64_t v = ((n + per - 1) / per + q - 1) / q * q;
  return v < w ? (v > q ? v : q) : w;
}
"""


class TiledLoops(WelfordLoops):
    """The column-kernel part of a kernel writer (``codegen_cpp._KernelWriter``)."""

    prog: Program
    tile: int  # outputs computed together at most: a strip (:func:`strip_width`)
    quantum: int  # a strip's width is a multiple of this (``Knobs.tile``)
    ranged: bool  # the outer loops run over a range of their points (``codegen_ranges``)
    advance: str  # a ranged kernel's statement ending each outer iteration
    writes: list[str]

    @abc.abstractmethod
    def bound(self, n: Any) -> str:
        """A loop bound (an int or a size expression) as C++."""

    @abc.abstractmethod
    def loop_lines(self, vars_: list[sympy.Symbol], ranges: tuple[Any, ...]) -> list[str]:
        """The first lines of nested loops of ``vars_`` over ``ranges``."""

    @abc.abstractmethod
    def range_head(self, loops: list[tuple[str, str, int]]) -> int:
        """Open a ranged kernel's collapsed outer loop; the depth of its body."""

    @abc.abstractmethod
    def body(self) -> str:
        """The function's source, from its lines."""

    @abc.abstractmethod
    def _note_reads(self, e: Expr) -> None:
        """Record the buffers and numbers ``e`` reads."""

    def write_tiled(self) -> str:
        """A column kernel: reductions over rows, vectorised across a tile of the last outer
        index (which is the contiguous one), instead of one strided inner loop per output."""
        k, depth = self.kernel, 1
        n, xk = len(k.outer), f"x{len(k.outer) - 1}"
        end = self.bound(k.outer[-1])
        if self.ranged:
            rows = [(str(x), self.bound(m), 1) for x, m in zip(X, k.outer[:-1], strict=False)]
            depth = self.range_head([*rows, ("xb", end, self.tile)]) - 1
        else:
            step = self.strip_step(end, depth)
            if self.parallel:
                collapse = f" collapse({n})" if n > 1 else ""
                self.emit(f"#pragma omp parallel for{collapse}{self.threads}", depth)
            for line in self.loop_lines(X[: n - 1], k.outer[:-1]):
                self.emit(line, depth)
                depth += 1
            self.emit(f"for (int64_t xb = 0; xb < {end}; xb += {step}) {{", depth)
        step = str(self.tile) if self.ranged else step
        self.emit(f"const int64_t xe = xb + {step} < {end} ? xb + {step} : {end};", depth + 1)
        for st in k.stages:
            for s in st.stores:
                self._note_reads(s.body)
                if not s.local and s.name not in self.writes:
                    self.writes.append(s.name)
            self.tiled_stage(st, depth + 1, xk)
        if self.advance:
            self.emit(self.advance, depth + 1)
        for d in range(depth, 0, -1):
            self.emit("}", d)
        return self.body()

    def strip_step(self, end: str, depth: int) -> str:
        """The width of a static kernel's strips: its widest, or, on threads, narrower where
        the other outer loops have fewer points than there are threads (``ember_strip``,
        per call: the thread count is torch's, set at run time)."""
        if not self.parallel or self.tile == self.quantum:
            return str(self.tile)
        points = math.prod(self.kernel.outer[:-1])
        call = f"ember_strip({end}, {points}, {self.tile}, {self.quantum})"
        self.emit(f"const int64_t xw = {call};", depth)
        return "xw"

    def tiled_stage(self, st: Stage, depth: int, xk: str) -> None:
        """One stage of a column kernel: a reduction's accumulators over the tile, the loop
        over rows that fills them, then each tile element's result stored."""
        welford = by_body(s for s in st.stores if s.reduce in WELFORD)
        acc = {s.name: f"{s.name}_acc[{xk} - xb]" for s in st.stores}
        for group in welford:  # a tile of Welford lanes, sharing a count
            w, j = f"{group[0].name}_w", f"[{xk} - xb]"
            acc |= {s.name: f"({w}_k{j} + {w}_m{j})" if s.reduce is Reduce.WELFORD_MEAN
                    else f"{w}_s{j}" for s in group}  # fmt: skip
        if st.is_reduction:
            self.tile_accumulators(st, welford, depth, xk)
            self.tile_rows(st, welford, acc, depth, xk)
        for s in (s for s in st.stores if self.folded(st, s)):  # the folded part and the block's
            acc[s.name] = f"({s.name}_tot[{xk} - xb] + {s.name}_acc[{xk} - xb])"
        self.tile_results(st, acc, depth, xk)

    def folded(self, st: Stage, s: Store) -> bool:
        """A float32 sum: accumulated in float over blocks of :data:`FOLD` rows, each block
        then added into a double total. One float accumulator per column drifted from
        eager's cascade sum (7x further from the exact sum over 1024 rows, 20x over 1e5);
        double accumulators all along ran 1.2-1.4x slower (1024x1024, one thread)."""
        body_t, stored = self.p.type(s.body.dtype), self.prog.buffers[s.name].dtype
        rows = math.prod(st.inner)
        if isinstance(rows, int) and rows <= FOLD_ROWS:
            return False
        return s.reduce is Reduce.SUM and body_t == "float" and stored == torch.float32

    def fold(self, st: Stage, depth: int) -> None:
        """After each row: every :data:`FOLD` rows, the float sums added into their totals."""
        sums = [s.name for s in st.stores if self.folded(st, s)]
        if not sums:
            return
        body = " ".join(f"{n}_tot[j] += {n}_acc[j]; {n}_acc[j] = 0;" for n in sums)
        self.emit(f"if (++{sums[0]}_fold == {FOLD}) {{", depth)
        self.emit(f"{sums[0]}_fold = 0;", depth + 1)
        self.emit("#pragma omp simd", depth + 1)
        self.emit(f"for (int64_t j = 0; j < xe - xb; ++j) {{ {body} }}", depth + 1)
        self.emit("}", depth)

    def tile_accumulators(
        self, st: Stage, welford: list[tuple[Store, ...]], depth: int, xk: str
    ) -> None:
        """Declare and initialise a tile of accumulators per reduction (and Welford lanes,
        shifted by each lane's first value)."""
        for s in st.stores:
            if s.reduce in WELFORD:
                continue
            t, tile = self.p.type(s.body.dtype), self.tile
            if s.reduce in ARG:  # the running value beside the index of its first row
                start = "ember_lowest" if s.reduce is Reduce.ARGMAX else "ember_highest"
                self.emit(f"{t} {s.name}_acc_v[{tile}]; int64_t {s.name}_acc[{tile}];", depth)
                init = f"{s.name}_acc_v[j] = {start}<{t}>(); {s.name}_acc[j] = 0;"
            else:
                self.emit(f"{t} {s.name}_acc[{tile}];", depth)
                init = f"{s.name}_acc[j] = {self.p.REDUCE[s.reduce][0].format(T=t)};"  # type: ignore[index]
            if self.folded(st, s):
                self.emit(f"double {s.name}_tot[{tile}];", depth)
                init += f" {s.name}_tot[j] = 0;"
            self.emit(f"for (int64_t j = 0; j < {tile}; ++j) {{ {init} }}", depth)
        sums = [s.name for s in st.stores if self.folded(st, s)]
        if sums:  # rows since the last fold, named per stage (stages share a scope)
            self.emit(f"int64_t {sums[0]}_fold = 0;", depth)
        for group in welford:
            t, w = self.p.type(group[0].body.dtype), f"{group[0].name}_w"
            self.emit(f"{t} {w}_m[{self.tile}] = {{}}; {t} {w}_s[{self.tile}] = {{}};", depth)
            self.emit(f"int64_t {w}_c = 0; {t} {w}_k[{self.tile}] = {{}};", depth)
            if 0 not in st.inner:
                self.emit(f"for (int64_t {xk} = xb; {xk} < xe; ++{xk}) {{", depth)
                self.welford_shift(group[0].body, len(st.inner), f"{w}_k[{xk} - xb]", depth + 1)
                self.emit("}", depth)

    def tile_rows(
        self,
        st: Stage,
        welford: list[tuple[Store, ...]],
        acc: dict[str, str],
        depth: int,
        xk: str,
    ) -> None:
        """The loops over the reduced rows; innermost, a simd loop across the tile."""
        memo: dict[Expr, str] = {}
        lines: list[str] = []
        inner = depth
        flat = self.p.index(sympy.expand(Layout.contiguous(st.inner).index(Y[: len(st.inner)])))
        for line in self.loop_lines(Y[: len(st.inner)], st.inner):
            self.emit(line, inner)
            inner += 1
        for group in welford:
            t, w = self.p.type(group[0].body.dtype), f"{group[0].name}_w"
            self.emit(f"{w}_c += 1;", inner)
            self.emit(f"const {t} {w}_r = {t}(1) / static_cast<{t}>({w}_c);", inner)
        for s in st.stores:
            if s.reduce in WELFORD:
                continue
            value = self.p.expr(s.body, memo, lines)
            combine = TILE_COMBINE.get(s.reduce) or self.p.REDUCE[s.reduce][1]  # type: ignore[arg-type, index]
            vacc = f"{s.name}_acc_v[{xk} - xb]"
            lines.append(combine.format(acc=acc[s.name], v=value, i=flat, vacc=vacc))
        for group in welford:
            t, w = self.p.type(group[0].body.dtype), f"{group[0].name}_w"
            v = self.p.expr(group[0].body, memo, lines)
            m, sq, k = f"{w}_m[{xk} - xb]", f"{w}_s[{xk} - xb]", f"{w}_k[{xk} - xb]"
            lines.append(self.p.WELFORD_STEP.format(v=v, m=m, s=sq, k=k, r=f"{w}_r", T=t))
        tile = f"for (int64_t {xk} = xb; {xk} < xe; ++{xk}) {{"
        if welford:  # a loop of constant length keeps the Welford lanes in registers
            self.emit(f"if (xe - xb == {self.tile}) {{", inner)
            self.emit("#pragma omp simd", inner + 1)
            self.emit(f"for (int64_t j = 0; j < {self.tile}; ++j) {{", inner + 1)
            self.emit(f"const int64_t {xk} = xb + j;", inner + 2)
            for line in lines:
                self.emit(line, inner + 2)
            self.emit("}", inner + 1)
            self.emit("} else {", inner)
            inner += 1
        self.emit("#pragma omp simd", inner)
        self.emit(tile, inner)
        for line in lines:
            self.emit(line, inner + 1)
        rows = depth + len(st.inner)  # the body of the innermost row loop
        for d in range(inner, rows - 1, -1):
            self.emit("}", d)
        self.fold(st, rows)
        for d in range(rows - 1, depth - 1, -1):
            self.emit("}", d)

    def tile_results(self, st: Stage, acc: dict[str, str], depth: int, xk: str) -> None:
        """Each tile element's value (a reduction's accumulator, or the pointwise body) stored,
        cast to its buffer's dtype."""
        for s in st.stores:
            if s.local:
                buf_t = self.p.type(self.prog.buffers[s.name].dtype)
                self.emit(f"{buf_t} {s.name}_l[{self.tile}];", depth)
        self.emit(f"for (int64_t {xk} = xb; {xk} < xe; ++{xk}) {{", depth)
        lines: list[str] = []
        for s in st.stores:
            buf = self.prog.buffers[s.name]
            value = acc[s.name] if st.is_reduction else self.p.expr(s.body, {}, lines)
            from_t = torch.int64 if s.reduce in ARG else s.body.dtype
            if buf.dtype != from_t:
                fmt = self.p.CASTS.get((from_t, buf.dtype), self.p.OPS[Op.CAST])
                value = fmt.format(value, T=self.p.type(buf.dtype))
            where = f"{s.name}_l[{xk} - xb]" if s.local else f"{s.name}[{self.p.index(s.index)}]"
            lines.append(f"{where} = {value};")
        for line in lines:
            self.emit(line, depth + 1)
        self.emit("}", depth)


TILE = 16  # outputs a column kernel computes together (two AVX2 vectors of float)
# the widest strip: each row of a 1024-column matrix read whole, in sequence (a strip of 16
# read 64 bytes a row with a 4 KB jump to the next, and ran at 0.6-0.7x eager's column sum)
STRIP = 1024
# rows a float32 column sum accumulates in float before adding them to its total: 1024
# rows are 1.5e-5 from the exact sum (eager 1.4e-5, one float 9e-5); 16 rows gave 1.0e-5
# and cost more on 512 rows (0.74x eager against 0.80)
FOLD = 64
# columns of at most this many rows sum in one float: its error stays below 0.82 of the
# bench's bound (4x eager's), and folding costs 10-25% on short columns (64-512 rows)
FOLD_ROWS = 256
ARG = frozenset({Reduce.ARGMAX, Reduce.ARGMIN})
TILEABLE = COLUMN  # sums, products, any/all, max/min, argmax/argmin and Welford
# a tile element's combine where it differs from the row kernel's (``CppPrinter.REDUCE``):
# no OpenMP reduction clause runs across the tile, so max/min carry NaN in the value itself
# (a NaN taken once is never replaced: ``v > NaN`` is false), and arg reductions are
# selects (the first row of the max or of the first NaN: rows run in order), which gcc
# vectorises across the tile where it would not vectorise an ``if``
TILE_COMBINE = {
    Reduce.MAX: "{acc} = ({v} > {acc} || {v} != {v}) ? {v} : {acc};",
    Reduce.MIN: "{acc} = ({v} < {acc} || {v} != {v}) ? {v} : {acc};",
    Reduce.ARGMAX: "{{ const bool take = {v} > {vacc} || ({v} != {v} && {vacc} == {vacc}); "
    "{vacc} = take ? {v} : {vacc}; {acc} = take ? {i} : {acc}; }}",
    Reduce.ARGMIN: "{{ const bool take = {v} < {vacc} || ({v} != {v} && {vacc} == {vacc}); "
    "{vacc} = take ? {v} : {vacc}; {acc} = take ? {i} : {acc}; }}",
}


def strip_width(last: Any, quantum: int) -> int:
    """How many outputs a column kernel over a last outer dimension of ``last`` points
    computes together: all of them up to :data:`STRIP`, a multiple of ``quantum``
    (a symbolic size: ``quantum``, as its tiles have run-time tails).

    >>> strip_width(1024, 16), strip_width(129, 16), strip_width(5000, 16)
    (1024, 144, 1024)
    """
    if not isinstance(last, int):
        return quantum
    return max(quantum, min(STRIP, -(-last // quantum) * quantum))


def column_kernel(kernel: Kernel) -> bool:
    """Reductions that read along a strided inner index while the last outer index is the
    contiguous one (sums over the batch in backward graphs)."""
    if not kernel.outer or (isinstance(kernel.outer[-1], int) and kernel.outer[-1] < 8):
        return False  # (a symbolic size: tiles handle any length, tails included)
    xk, column = X[len(kernel.outer) - 1], False
    for st in kernel.stages:
        for s in st.stores:
            if s.reduce is None:
                if st.inner:
                    return False
                continue
            if s.reduce not in TILEABLE or not st.inner:
                return False
            yk = Y[len(st.inner) - 1]
            for e in walk(s.body):
                if e.op is Op.LOAD and yk in e.arg[1].free_symbols:
                    along = e.arg[1].coeff(yk) == 1 and xk in e.arg[1].free_symbols
                    if e.args or along:
                        return False  # the inner loop already runs along memory
                    column |= e.arg[1].coeff(xk) == 1
    return column
