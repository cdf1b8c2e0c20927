"""A whole-tensor reduction split across programs: partial results, then a combine kernel.

A row kernel with no outer loop (``x.sum()``, ``x.var_mean()``, ``x.argmax()``) would
run in one program, one block after another over the whole tensor. When its reductions
are long (at least ``SPLIT_MIN`` points in the example) and of kinds whose partial results
combine (sum, max, min, argmax, argmin, Welford), the kernel is printed as two:
``kernelN_part`` runs ``parts`` programs, each looping over its own ``chunk`` of the points
and storing its partial results (a sum; a max with its NaN; an argmax's value and index; a
Welford (mean, m2, n)) to small scratch tensors; ``kernelN`` is one program that loads the
partials and combines them (an argmax keeps the first largest, NaN first; Welford partials are
joined in closed form), then runs the kernel's later stages (a
mean's division) on the results. The launcher computes ``chunk`` and ``parts`` from the
run-time size (at most ``MAX_PARTS`` programs, whole ``LOOP_BLOCK`` blocks each) and
allocates the scratch on the inputs' device. A reduction that reads another's result (a
two-pass variance) is not split.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from ember.inductor.codegen_triton import module_source
>>> from ember.inductor.lowering import lower_graph
>>> from ember.inductor.scheduler import schedule
>>> x = torch.randn(100, 300)
>>> sched = schedule(lower_graph(make_fx(lambda x: x.sum())(x), [x]))
>>> src, _ = module_source(sched, interpret=True)
>>> print(src[src.index("def launch_kernel0"):].strip())
def launch_kernel0(x_1, buf0):
    _n = 30000
    _chunk = max(1024, -(-(-(-_n // 64)) // 1024) * 1024)
    _parts = max(1, -(-_n // _chunk))
    buf0_p = torch.empty((_parts,), dtype=torch.float32, device=x_1.device)
    kernel0_part[(_parts,)](x_1, buf0, buf0_p, _chunk, num_warps=4)
    kernel0[(1,)](x_1, buf0, buf0_p, _parts, num_warps=4)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch

from ember.inductor.ir import walk
from ember.inductor.ops import WELFORD, Op, Reduce
from ember.inductor.scheduler import Stage, Store, Y
from ember.inductor.symbolic import Unsupported as SizeUnsupported
from ember.inductor.symbolic import hint, is_static, pyexpr
from ember.inductor.triton_reduce import FINISH, identity

__all__ = ["MAX_PARTS", "SPLIT_MIN", "Split", "plan", "write"]

SPLIT_MIN = 4096  # points of a whole reduction from which it is split across programs
MAX_PARTS = 64  # programs of the first kernel at most (the combine loads them in one block)
BLOCK = 1024  # points a program's loop takes at a time (codegen_triton.LOOP_BLOCK)
FAR = 2**62  # the index of a missing argmax partial: any real one comes first on a tie
SPLITTABLE = {Reduce.SUM, Reduce.MAX, Reduce.MIN, Reduce.ARGMAX, Reduce.ARGMIN, *WELFORD}


@dataclass(frozen=True, slots=True)
class Split:
    """The kernel's reduction stages (each over ``n`` points) and its other stages (over one
    point each, reading the reductions' results), which run after all of them."""

    reductions: tuple[Stage, ...]
    after: tuple[Stage, ...]
    n: Any


def plan(w: Any) -> Split | None:
    """The split of writer ``w``'s kernel, or None (it keeps one program)."""
    k = w.kernel
    if k.outer and not (is_static(math.prod(k.outer)) and math.prod(k.outer) == 1):
        return None
    red = [st for st in k.stages if st.is_reduction]
    after = [st for st in k.stages if not st.is_reduction]
    if not red or any(_points(st) != 1 for st in after):
        return None  # reductions, and stages over one point (on their results)
    n = math.prod(red[0].inner)
    if any(sympy.sympify(math.prod(st.inner) - n) != 0 for st in red):
        return None
    if hint(n, w.hints) < SPLIT_MIN or any(
        s.reduce not in SPLITTABLE for st in red for s in st.stores
    ):
        return None
    results = w._reductions()
    for st in red:  # a partial must not need another reduction's whole result
        loads = (e for s in st.stores for e in walk(w.inline(s.body)) if e.op is Op.LOAD)
        if any(e.arg[0] in results for e in loads):
            return None
    return Split(tuple(red), tuple(after), n)


def _points(st: Stage) -> Any:
    n = math.prod(st.inner)
    return int(n) if is_static(n) else None


def _partials(w: Any, sp: Split) -> list[tuple[str, torch.dtype]]:
    """The scratch tensors, one entry a program: (name, dtype)."""
    from ember.inductor.codegen_triton import _compute

    out: list[tuple[str, torch.dtype]] = []
    for st in sp.reductions:
        for s in st.stores:
            t = _compute(s.body.dtype)
            if s.reduce in WELFORD:
                if _first_welford(st, s):
                    wt = torch.float64 if s.body.dtype == torch.float64 else torch.float32
                    out += [(f"{s.name}_pm", wt), (f"{s.name}_ps", wt), (f"{s.name}_pn", wt)]
            elif s.reduce in (Reduce.ARGMAX, Reduce.ARGMIN):
                out += [(f"{s.name}_p", t), (f"{s.name}_pi", torch.int64)]
            else:
                out.append((f"{s.name}_p", t))
    return out


def _first_welford(st: Stage, s: Store) -> bool:
    return next(x for x in st.stores if x.reduce in WELFORD and x.body == s.body) is s


def _welford_of(st: Stage, s: Store) -> str:
    return next(x for x in st.stores if x.reduce in WELFORD and x.body == s.body).name


def _part_kernel(w: Any, sp: Split) -> list[str]:
    """Each program: its chunk of every reduction, partial results stored at ``pid``."""
    from ember.inductor.codegen_triton import _t

    w.lines = []
    w.emit(f"pid = {w.pid()}")
    for st in sp.reductions:
        w.accumulators(st, 1, BLOCK, True)
        w.emit(f"for roffset in range(0, chunk, {BLOCK}):")
        w.emit(f"rindex = pid * chunk + roffset + tl.arange(0, {BLOCK})[None, :]", 2)
        w.emit(f"mask = rindex < {_t(sp.n)}", 2)
        for line in _decompose(st):
            w.emit(line, 2)
        w.combine(st, 2, None)
        for s in st.stores:
            at = "pid + tl.zeros([1], tl.int32)"
            if s.reduce in WELFORD:
                if _first_welford(st, s):
                    v = f"{s.name}_w"
                    for line in _join(f"{v}_mean", f"{v}_m2", f"{v}_n", v):
                        w.emit(line)
                    for part, got in (("pm", "m"), ("ps", "s"), ("pn", "c")):
                        w.emit(f"tl.store({s.name}_{part} + {at}, {v}_{got})")
            elif s.reduce in (Reduce.ARGMAX, Reduce.ARGMIN):
                floating = s.body.dtype.is_floating_point
                for line in _first(s.reduce, f"{s.name}_acc", f"{s.name}_idx", s.name, floating):
                    w.emit(line)
                w.emit(f"tl.store({s.name}_p + {at}, {s.name}_v)")
                w.emit(f"tl.store({s.name}_pi + {at}, {s.name}_i)")
            else:
                value = FINISH[s.reduce].format(n=s.name)  # type: ignore[index]
                if s.reduce in (Reduce.MAX, Reduce.MIN) and s.body.dtype.is_floating_point:
                    value = f'tl.where(tl.max({s.name}_nan, 1) > 0, float("nan"), {value})'
                w.emit(f"tl.store({s.name}_p + {at}, {value})")
    return list(w.lines)


def _decompose(st: Stage) -> list[str]:
    from ember.inductor.codegen_triton import _decompose as decompose

    return decompose(Y[: len(st.inner)], st.inner, "rindex")


# kind -> the combine of the loaded partials {v} into a [1] value
COMBINE_PARTS: dict[Reduce, str] = {
    Reduce.SUM: "tl.sum({v}, 1)",
    Reduce.MAX: "tl.max({v}, 1)",
    Reduce.MIN: "tl.min({v}, 1)",
}


def _first(kind: Reduce, v: str, i: str, out: str, floating: bool) -> list[str]:
    """Lines setting ``{out}_v`` and ``{out}_i``: the largest (ARGMAX; else smallest) of the
    values ``v`` along axis 1, NaN first, and the least of the indices ``i`` that hold it.
    Built-in reductions only (under the interpreter ``tl.reduce`` with a combine function
    runs element by element in Python: 40x slower over 49 programs)."""
    best = "tl.max" if kind is Reduce.ARGMAX else "tl.min"
    lines = [f"{out}_v = {best}({v}, 1)"]
    hit = f"({v} == {out}_v[:, None])"
    if floating:
        lines += [
            f"{out}_nan = tl.max(({v} != {v}).to(tl.int32), 1) > 0",
            f'{out}_v = tl.where({out}_nan, float("nan"), {out}_v)',
        ]
        hit = f"({hit} | (({v} != {v}) & {out}_nan[:, None]))"
    return [*lines, f"{out}_i = tl.min(tl.where({hit}, {i}, {FAR}), 1)"]


def _join(m: str, s: str, c: str, out: str) -> list[str]:
    """Lines setting ``{out}_m``, ``{out}_s``, ``{out}_c``: the Welford (mean, m2, count)
    of the lanes (mean ``m``, m2 ``s``, count ``c``) along axis 1, joined in closed form:
    ``c = sum c_k``, ``m = sum c_k m_k / c``, ``s = sum s_k + c_k (m_k - m)**2``."""
    return [
        f"{out}_c = tl.sum({c}, 1)",
        f"{out}_m = tl.sum({c} * {m}, 1) / tl.where({out}_c == 0, 1.0, {out}_c)",
        f"{out}_d = {m} - {out}_m[:, None]",
        f"{out}_s = tl.sum({s} + {c} * {out}_d * {out}_d, 1)",
    ]


def _combine_kernel(w: Any, sp: Split) -> list[str]:
    """One program: the partials combined into each reduction's result (stored unless
    local), then the stages after the reductions."""
    w.lines = []
    w.emit(f"p = tl.arange(0, {MAX_PARTS})[None, :]")
    w.emit("pmask = p < parts")
    w.emit("xmask = tl.full([1, 1], 1, tl.int1)")
    for st in sp.reductions:
        for s in st.stores:
            _combine_store(w, st, s)
    for st in sp.after:
        w.stage(st, 1, 1)
    return list(w.lines)


def _combine_store(w: Any, st: Stage, s: Store) -> None:
    from ember.inductor.codegen_triton import _compute

    t = _compute(s.body.dtype)
    if s.reduce in WELFORD:
        g = _welford_of(st, s)
        if _first_welford(st, s):
            for part in ("pm", "ps", "pn"):
                w.emit(f"{g}_{part}v = tl.load({g}_{part} + p, pmask, other=0)")
            for line in _join(f"{g}_pmv", f"{g}_psv", f"{g}_pnv", f"{g}_j"):
                w.emit(line)
        value = f"{g}_j_m" if s.reduce is Reduce.WELFORD_MEAN else f"{g}_j_s"
    else:
        init = identity(s.reduce, t)  # type: ignore[arg-type]
        w.emit(f"{s.name}_pv = tl.load({s.name}_p + p, pmask, other={init})")
        if s.reduce in (Reduce.ARGMAX, Reduce.ARGMIN):
            w.emit(f"{s.name}_piv = tl.load({s.name}_pi + p, pmask, other={FAR})")
            pv, piv, out = f"{s.name}_pv", f"{s.name}_piv", f"{s.name}_c"
            for line in _first(s.reduce, pv, piv, out, t.is_floating_point):
                w.emit(line)
            value = f"{out}_i"
        else:
            value = COMBINE_PARTS[s.reduce].format(v=f"{s.name}_pv")  # type: ignore[index]
            if s.reduce in (Reduce.MAX, Reduce.MIN) and t.is_floating_point:
                nan = f"tl.max(({s.name}_pv != {s.name}_pv).to(tl.int32), 1) > 0"
                value = f'tl.where({nan}, float("nan"), {value})'
    buf = w.prog.buffers[s.name]
    w.emit(f"{s.name}_l = {w._rounding(f'({value})[:, None]', s.body.dtype, buf.dtype)}")
    w.p.values[s.name] = f"{s.name}_l"
    if not s.local:
        w.emit(w._store(s, f"{s.name}_l", buf.dtype, "xmask"))


def write(w: Any, sp: Split, names: list[str]) -> str:
    """Both kernels of writer ``w``'s kernel and its launcher, as module text."""
    name = w.kernel.name
    part = _part_kernel(w, sp)
    combine = _combine_kernel(w, sp)
    text = "\n".join(part + combine) + str(sp.n)
    w.sizes = [str(s) for s in sorted(w.p.sizes, key=str)]
    w.sizes = [v for v in w.sizes if re.search(rf"\b{v}\b", text)]
    params = names + [f"s_{v}" for v in w.scalars] + w.sizes
    scratch = _partials(w, sp)
    extra = [p for p, _ in scratch]
    head = "\n\n@triton.jit\ndef {}({}):"
    try:
        n = pyexpr(sp.n)
    except SizeUnsupported as e:
        from ember.inductor.codegen_triton import Unsupported

        raise Unsupported(str(e)) from e
    device = names[0]  # a tensor of the kernel: the scratch goes to its device
    args = ", ".join(params)
    launcher = [
        f"\n\ndef launch_{name}({args}):",
        f"    _n = {n}",
        f"    _chunk = max({BLOCK}, -(-(-(-_n // {MAX_PARTS})) // {BLOCK}) * {BLOCK})",
        "    _parts = max(1, -(-_n // _chunk))",
        *(
            f"    {p} = torch.empty((_parts,), dtype={t}, device={device}.device)"
            for p, t in scratch
        ),
        f"    {name}_part[(_parts,)]({', '.join([*params, *extra, '_chunk'])}, num_warps=4)",
        f"    {name}[(1,)]({', '.join([*params, *extra, '_parts'])}, num_warps=4)",
    ]
    return "\n".join([
        head.format(f"{name}_part", ", ".join([*params, *extra, "chunk"])), *part,
        head.format(name, ", ".join([*params, *extra, "parts"])), *combine,
        *launcher,
    ]) + "\n"  # fmt: skip
