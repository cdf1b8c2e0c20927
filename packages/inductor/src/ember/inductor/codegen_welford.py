"""The Welford loops of a C++ kernel: variance and mean of a stage's values in one pass.

A pass keeps ``WELFORD_LANES`` running (mean, m2) pairs along the innermost loop. The
lanes of a block of points share a count, so its reciprocal is one division a block and
the update is plain arithmetic that gcc vectorises; the ``n % lanes`` points left at the
end of each row have lanes (and a count) of their own. Values are shifted by the first
one, which keeps float32 means near 0 where their small steps are resolved. Lanes, and
the chunks a pass over a whole tensor is cut into for threads, are joined with Chan et
al.'s formula (``ember_welford_combine`` in the prelude), in a fixed order.

>>> import sympy, torch
>>> from ember.inductor.codegen_cpp import translation_unit
>>> from ember.inductor.ir import Buffer, Expr, Layout, Program
>>> from ember.inductor.ops import Op, Reduce
>>> from ember.inductor.scheduler import Kernel, Schedule, Stage, Store, Y
>>> x = Buffer("x", torch.float32, Layout.contiguous((40,)))
>>> m2 = Buffer("m2", torch.float32, Layout.contiguous(()))
>>> body = Expr(Op.LOAD, torch.float32, (), ("x", Y[0], ()))
>>> st = Stage((40,), (Store("m2", body, sympy.Integer(0), Reduce.WELFORD_M2),))
>>> prog = Program({"x": x, "m2": m2}, ["x"], [], [])
>>> src = translation_unit(Schedule(prog, [Kernel("k", (), (st,))]))[0]
>>> print("\\n".join(ln[:78] for ln in src.splitlines() if "yb" in ln or "m2_w_m2" in ln))
  for (int64_t yb = 0; yb < 32; yb += 16) {
      const int64_t y0 = yb + yl;
    const int64_t yb = 32;
      const int64_t y0 = yb + yl;
  float m2_w_mean = 0; float m2_w_m2 = 0; int64_t m2_w_n = 0;
  for (int64_t yl = 0; yl < 16; ++yl) ember_welford_combine(m2_w_mean, m2_w_m2
  for (int64_t yl = 0; yl < 8; ++yl) ember_welford_combine(m2_w_mean, m2_w_m2,
  m2[0] = m2_w_m2;
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import sympy  # type: ignore[import-untyped]

from ember.inductor.ir import Expr
from ember.inductor.ops import Reduce
from ember.inductor.scheduler import Kernel, Stage, Store, Y

if TYPE_CHECKING:
    from ember.inductor.codegen_cpp import CppPrinter

__all__ = ["WELFORD_CHUNKS", "WELFORD_LANES", "WelfordLoops", "by_body"]

WELFORD_LANES = 16  # running (mean, m2) pairs along a Welford pass's innermost loop
WELFORD_CHUNKS = 64  # pieces a Welford pass with no outer loop is cut into for threads


class WelfordLoops(abc.ABC):
    """The Welford part of a kernel writer (``codegen_cpp._KernelWriter``)."""

    p: CppPrinter
    kernel: Kernel
    parallel: bool
    threads: str  # the num_threads clause of parallel loops (empty: OpenMP's default)

    @abc.abstractmethod
    def emit(self, line: str, depth: int) -> None:
        """Append ``line`` at indentation ``depth``."""

    @abc.abstractmethod
    def hoist(
        self, st: Stage, loops: list[sympy.Symbol], ranges: tuple[int, ...], memo: dict[Expr, str]
    ) -> list[str]:
        """Lines computing the values of ``st`` that do not vary in its loops."""

    @abc.abstractmethod
    def result(self, s: Store, value: str, depth: int) -> None:
        """Store a reduction's ``value`` as its buffer's dtype."""

    def welford(self, st: Stage, depth: int) -> None:
        """One pass for the Welford stores of ``st`` (all of one body): the mean and m2 of the
        values, joined over threads when the kernel has no outer loop to parallelise."""
        t, w = self.p.type(st.stores[0].body.dtype), f"{st.stores[0].name}_w"
        inner = st.inner or (1,)  # over no loops: one value
        if 0 in inner:
            self.emit(f"{t} {w}_mean = 0; {t} {w}_m2 = 0; const {t} {w}_k = 0;", depth)
        else:
            self.emit(f"{t} {w}_k;", depth)
            self.welford_shift(st.stores[0].body, len(st.inner), f"{w}_k", depth)
            if self.kernel.outer or not self.parallel or not isinstance(inner[-1], int):
                self.welford_pass(st, inner, w, depth)
            else:
                self.welford_threads(st, inner, w, depth)
        for s in st.stores:
            mean = s.reduce is Reduce.WELFORD_MEAN
            self.result(s, f"({w}_k + {w}_mean)" if mean else f"{w}_m2", depth)

    def welford_shift(self, body: Expr, loops: int, k: str, depth: int) -> None:
        """Set ``k`` to the pass's first value, by which it shifts all of them: the running
        mean then stays near 0, where float32 resolves the small steps it takes (not near
        1e4, where its increments fall below one unit in the last place). A value that is
        not finite shifts by 0 (inf - inf would make NaN of a mean that is inf)."""
        self.emit("{", depth)
        if loops:  # the inner variables at the first point (scratch reads name them too)
            self.emit(f"const int64_t {', '.join(f'{y} = 0' for y in Y[:loops])};", depth + 1)
        lines: list[str] = []
        v = self.p.expr(body, {}, lines)
        for line in [*lines, f"{k} = std::isfinite({v}) ? {v} : 0;"]:
            self.emit(line, depth + 1)
        self.emit("}", depth)

    def welford_threads(self, st: Stage, inner: tuple[int, ...], w: str, depth: int) -> None:
        """Cut the pass into chunks (of the first loop, or of the blocks of a lone loop), run
        them on OpenMP threads, and join their partial results in chunk order (the result
        does not depend on the thread count)."""
        t = self.p.type(st.stores[0].body.dtype)
        lanes = min(WELFORD_LANES, inner[-1])
        cut = inner[0] if len(inner) > 1 else inner[-1] // lanes
        chunks = max(1, min(WELFORD_CHUNKS, cut))
        self.emit(f"{t} {w}_pm[{chunks}]; {t} {w}_ps[{chunks}]; int64_t {w}_pn[{chunks}];", depth)
        self.emit(f"#pragma omp parallel for{self.threads}", depth)
        self.emit(f"for (int64_t wc = 0; wc < {chunks}; ++wc) {{", depth)
        lo, hi = f"wc * {cut} / {chunks}", f"(wc + 1) * {cut} / {chunks}"
        if len(inner) > 1:
            self.welford_pass(st, inner, w, depth + 1, (lo, hi))
        else:
            blocks = (f"({lo}) * {lanes}", f"({hi}) * {lanes}")
            self.welford_pass(st, inner, w, depth + 1, blocks, f"wc == {chunks - 1}")
        self.emit(f"{w}_pm[wc] = {w}_mean; {w}_ps[wc] = {w}_m2; {w}_pn[wc] = {w}_n;", depth + 1)
        self.emit("}", depth)
        self.emit(f"{t} {w}_mean = 0; {t} {w}_m2 = 0; int64_t {w}_n = 0;", depth)
        self.emit(
            f"for (int64_t wc = 0; wc < {chunks}; ++wc) "
            f"ember_welford_combine({w}_mean, {w}_m2, {w}_n, {w}_pm[wc], {w}_ps[wc], {w}_pn[wc]);",
            depth,
        )

    def welford_pass(
        self,
        st: Stage,
        inner: tuple[int, ...],
        w: str,
        depth: int,
        span: tuple[str, str] | None = None,
        tail_if: str | None = None,
    ) -> None:
        """Declare ``{w}_mean``, ``{w}_m2``, ``{w}_n``: the Welford pass over ``inner``.
        ``WELFORD_LANES`` running (mean, m2) pairs move along the innermost loop in blocks;
        the lanes of a block share a count and its reciprocal (one division a block), so
        the update is plain vector arithmetic. The last ``n % lanes`` points of each row
        have lanes of their own (with their own count). Lanes join with Chan's formula.
        ``span``: the bounds of the first loop (of the blocks, if only one loop), else all;
        ``tail_if``: a condition for running the tail (once, not per chunk of blocks)."""
        t = self.p.type(st.stores[0].body.dtype)
        n, k = inner[-1], len(inner) - 1
        parts, full = _lanes(n, self.p.index)  # (prefix, array size, lanes used) per part
        memo: dict[Expr, str] = {}
        for line in self.hoist(st, Y[: len(inner)], inner, memo):
            self.emit(line, depth)
        for p, size, _ in parts:
            self.emit(f"{t} {w}_{p}m[{size}] = {{}}; {t} {w}_{p}s[{size}] = {{}};", depth)
            self.emit(f"int64_t {w}_{p}c = 0;", depth)
        rows = [
            f"for (int64_t {y} = 0; {y} < {self.p.index(sympy.sympify(n))}; ++{y}) {{"
            for y, n in zip(Y[:k], inner[:k], strict=True)
        ]
        if span is not None and k:
            rows[0] = f"for (int64_t y0 = {span[0]}; y0 < {span[1]}; ++y0) {{"
        for d, line in enumerate(rows):
            self.emit(line, depth + d)
        d = depth + k
        lo, hi = span if span is not None and not k else ("0", full)
        self.emit(f"for (int64_t yb = {lo}; yb < {hi}; yb += {parts[0][1]}) {{", d)
        self.welford_block(st, w, "", parts[0][2], d + 1, dict(memo))
        self.emit("}", d)
        if len(parts) > 1:
            self.emit(f"if ({tail_if}) {{" if tail_if else "{", d)
            self.emit(f"const int64_t yb = {full};", d + 1)
            self.welford_block(st, w, "t", parts[1][2], d + 1, dict(memo))
            self.emit("}", d)
        for d in range(depth + k - 1, depth - 1, -1):
            self.emit("}", d)
        self.emit(f"{t} {w}_mean = 0; {t} {w}_m2 = 0; int64_t {w}_n = 0;", depth)
        for p, _, used in parts:
            self.emit(
                f"for (int64_t yl = 0; yl < {used}; ++yl) "
                f"ember_welford_combine({w}_mean, {w}_m2, {w}_n, {w}_{p}m[yl], {w}_{p}s[yl], "
                f"{w}_{p}c);",
                depth,
            )

    def welford_block(
        self, st: Stage, w: str, p: str, lanes: int | str, depth: int, memo: dict[Expr, str]
    ) -> None:
        """One Welford step of ``lanes`` lanes at points ``yb + yl`` of the innermost loop."""
        t = self.p.type(st.stores[0].body.dtype)
        k = max(len(st.inner) - 1, 0)
        self.emit(f"{w}_{p}c += 1;", depth)
        self.emit(f"const {t} {w}_{p}r = {t}(1) / static_cast<{t}>({w}_{p}c);", depth)
        self.emit("#pragma omp simd", depth)
        self.emit(f"for (int64_t yl = 0; yl < {lanes}; ++yl) {{", depth)
        lines = [f"const int64_t y{k} = yb + yl;"] if st.inner else []
        v = self.p.expr(st.stores[0].body, memo, lines)
        m, s = f"{w}_{p}m[yl]", f"{w}_{p}s[yl]"
        lines.append(self.p.WELFORD_STEP.format(v=v, m=m, s=s, k=f"{w}_k", r=f"{w}_{p}r", T=t))
        for line in lines:
            self.emit(line, depth + 1)
        self.emit("}", depth)


def _lanes(n: Any, index: Any) -> tuple[list[tuple[str, int, int | str]], str]:
    """The lane parts of a Welford pass over ``n`` points (prefix, array size, lanes in use)
    and where the tail starts. A symbolic ``n`` has a tail of ``n % lanes`` lanes, counted
    at run time (0 included), in arrays of the full width.

    >>> _lanes(20, str)
    ([('', 16, 16), ('t', 4, 4)], '16')
    >>> _lanes(sympy.Symbol("ks0"), str)
    ([('', 16, 16), ('t', 16, '(ks0 % 16)')], '(ks0 - ks0 % 16)')
    """
    if isinstance(n, int):
        lanes = min(WELFORD_LANES, n)
        rem = n % lanes
        parts: list[tuple[str, int, int | str]] = [("", lanes, lanes)]
        return parts + ([("t", rem, rem)] if rem else []), str(n - rem)
    c = index(n)
    tail = f"({c} % {WELFORD_LANES})"
    return [("", WELFORD_LANES, WELFORD_LANES), ("t", WELFORD_LANES, tail)], f"({c} - {tail[1:-1]})"


def by_body(stores: Iterable[Store]) -> list[tuple[Store, ...]]:
    """``stores`` grouped by body, in order of first appearance (one pass a group)."""
    groups: dict[Expr, list[Store]] = {}
    for s in stores:
        groups.setdefault(s.body, []).append(s)
    return [tuple(g) for g in groups.values()]
