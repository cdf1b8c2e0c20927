"""Triton code for a schedule: one Python module per graph, one ``@triton.jit`` kernel per kernel.

The second printer over the same loop IR and schedule as :mod:`ember.inductor.codegen_cpp`.
A kernel whose stages are all pointwise over one inner shape is *flat*: 1-D blocks over its
``outer * inner`` points, the loop variables read off the flat index. Any other kernel is a
*row* kernel: each program takes ``XBLOCK`` outer points and runs the stages one after the
other over 2-D ``[XBLOCK, RBLOCK]`` blocks of their inner points, in one block when the row
is short (persistent, ``PERSISTENT_MAX``) or in a loop of blocks with accumulators
(looped). Ragged edges are masked. Symbolic sizes are int arguments of the kernel and of
its launcher, which computes the grid per call; a row of symbolic length always loops.
Values a kernel keeps to itself are not stored: a reduction's result is a ``[XBLOCK, 1]``
variable, and a pointwise value read by a later stage is recomputed there from its body
(the scheduler only lets a stage read such a value at the point where it was computed).
Half and bfloat16 values compute in float32 and round where the IR casts to them. What the
printer cannot write raises :class:`Unsupported`, and the graph goes to the C++ printer (CPU)
or runs as aten calls (CUDA): never a guess.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from ember.inductor.lowering import lower_graph
>>> from ember.inductor.scheduler import schedule
>>> x = torch.randn(4, 8)
>>> sched = schedule(lower_graph(make_fx(lambda x: x.exp() + 1)(x), [x]))
>>> src, args = module_source(sched, interpret=True)
>>> args
{'kernel0': ['x_1', 'buf0']}
>>> print(src[src.index("def kernel0"):])
def kernel0(x_1, buf0):
    index = tl.program_id(0) * 32 + tl.arange(0, 32)
    mask = index < 32
    y0 = index % 8
    x0 = (index // 8)
    t0 = tl.load(x_1 + (index), mask, other=0)
    t1 = tl.exp(t0)
    t2 = (t1 + tl.full([1], 1.0, tl.float32))
    tl.store(buf0 + (index), t2.to(tl.float32), mask)
<BLANKLINE>
<BLANKLINE>
def launch_kernel0(x_1, buf0):
    kernel0[(1,)](x_1, buf0, num_warps=4)
<BLANKLINE>
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch
from torch.utils import _pytree as pytree

from ember.inductor import (
    philox,
    triton_index32,
    triton_matmul,
    triton_split,
    triton_tiles,
)
from ember.inductor.codegen_cpp import scalar_arg
from ember.inductor.codegen_welford import by_body
from ember.inductor.index_print import IndexSyntax, print_index
from ember.inductor.ir import Expr, Layout, Ref, map_indices, walk
from ember.inductor.knobs import KNOBS, Knobs, knobs
from ember.inductor.ops import WELFORD, Op, Reduce
from ember.inductor.scheduler import Kernel, Schedule, Stage, Store, X, Y
from ember.inductor.symbolic import Unsupported as SizeUnsupported
from ember.inductor.symbolic import hint, is_static, pyexpr
from ember.inductor.triton_prelude import HEADER, HELPERS, INTERPRETER_MATH, LIBDEVICE_IMPORT
from ember.inductor.triton_reduce import COMBINE, FINISH, identity, two_pass, welford_step

__all__ = ["PERSISTENT_MAX", "TritonPrinter", "Unsupported", "module_source"]

PERSISTENT_MAX = 1024  # rows up to this many points run in one block (no loop)
LOOP_BLOCK = 1024  # the block of a looped row
COLUMN_BLOCK = 64  # the block of a looped column (and the rows beside it)
# points per program of a flat kernel, and XBLOCK * RBLOCK of a row kernel at most: the
# defaults of Knobs.block and Knobs.row_elements, which max_autotune varies


class Unsupported(Exception):
    """A kernel the Triton printer cannot write: the graph falls back (C++ on CPU, aten on
    CUDA), with this message recorded.

    >>> str(Unsupported("POW is not printed under Triton's interpreter"))
    "POW is not printed under Triton's interpreter"
    """


TYPES = {
    torch.float32: "tl.float32",
    torch.float64: "tl.float64",
    torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16",
    torch.bool: "tl.int1",
    torch.int8: "tl.int8",
    torch.uint8: "tl.uint8",
    torch.int16: "tl.int16",
    torch.int32: "tl.int32",
    torch.int64: "tl.int64",
}
LOW = (torch.float16, torch.bfloat16)  # computed in float32, rounded where the IR casts

# Ops the CUDA build takes from libdevice; under the interpreter (no extern calls there)
# the module's own float64 helpers stand in
LIBDEVICE = {Op.EXPM1: "expm1", Op.LOG1P: "log1p", Op.TANH: "tanh", Op.POW: "pow"}
INTERPRETED = {Op.EXPM1: "_ember_expm1", Op.LOG1P: "_ember_log1p", Op.TANH: "_ember_tanh"}


class TritonPrinter:
    """Body expressions as Triton (``triton.language`` as ``tl``): one table entry per op.

    >>> from ember.inductor.ir import Buffer, I, Layout, load
    >>> x = Buffer("x", torch.float16, Layout.contiguous((8,)))
    >>> p = TritonPrinter(interpret=True)
    >>> lines = []
    >>> p.expr(Expr(Op.EXP, torch.float16, (load(x, (I[0],)),)), {}, lines)
    't1'
    >>> lines
    ['t0 = tl.load(x + (i0), mask, other=0).to(tl.float32)', 't1 = tl.exp(t0)']
    """

    OPS: dict[Op, str] = {
        Op.NEG: "(-{0})",
        Op.ABS: "tl.abs({0})",
        Op.EXP: "tl.exp({0})",
        Op.LOG: "tl.log({0})",
        Op.SQRT: "tl.sqrt({0})",
        Op.RSQRT: "tl.rsqrt({0})",
        Op.RECIPROCAL: "(1.0 / {0})",
        Op.SIN: "tl.sin({0})",
        Op.COS: "tl.cos({0})",
        Op.SIGMOID: "tl.sigmoid({0})",
        Op.ERF: "tl.erf({0})",
        Op.FLOOR: "tl.floor({0})",
        Op.CEIL: "tl.ceil({0})",
        Op.TRUNC: "tl.where({0} < 0, tl.ceil({0}), tl.floor({0}))",
        Op.NOT: "({0} == 0)",
        Op.ISNAN: "({0} != {0})",
        Op.CAST: "{0}.to({T})",
        Op.ADD: "({0} + {1})",
        Op.SUB: "({0} - {1})",
        Op.MUL: "({0} * {1})",
        Op.DIV: "({0} / {1})",
        # NaN-propagating, as torch.maximum (and ints alike: a != a is false)
        Op.MAX: "tl.where(({0} > {1}) | ({0} != {0}), {0}, {1})",
        Op.MIN: "tl.where(({0} < {1}) | ({0} != {0}), {0}, {1})",
        Op.AND: "({0} & {1})",
        Op.OR: "({0} | {1})",
        Op.XOR: "({0} ^ {1})",
        Op.EQ: "({0} == {1})",
        Op.NE: "({0} != {1})",
        Op.LT: "({0} < {1})",
        Op.LE: "({0} <= {1})",
        Op.GT: "({0} > {1})",
        Op.GE: "({0} >= {1})",
        Op.WHERE: "tl.where({0}, {1}, {2})",
        # Philox4x32-10 of (seed, offset): philox.triton_source, bit for bit the C++ numbers
        Op.RAND: "_ember_rand({0}, {1})",
        Op.RANDN: "_ember_randn({0}, {1})",
    }

    def __init__(self, interpret: bool, shape: str = "[1, 1]") -> None:
        self.interpret, self.shape, self.count = interpret, shape, 0
        self.mask = "mask"  # the mask of the stage being printed
        self.flat: sympy.Expr | None = None  # a flat kernel's point as its loop variables
        self.values: dict[str, str] = {}  # buffer -> the variable holding it (per-row results)
        self.sizes: frozenset[sympy.Symbol] = frozenset()  # size symbols: the same in a block
        self.fixed: frozenset[sympy.Symbol] = frozenset()  # loop variables one a program (tiles)
        self.ops = dict(self.OPS)
        names = INTERPRETED if interpret else {k: f"libdevice.{v}" for k, v in LIBDEVICE.items()}
        self.ops |= {op: f"{fn}({', '.join(f'{{{k}}}' for k in range(_arity(op)))})"
                     for op, fn in names.items()}  # fmt: skip

    def fresh(self) -> str:
        self.count += 1
        return f"t{self.count - 1}"

    def const(self, value: Any, dtype: torch.dtype) -> str:
        """A constant block of ``dtype`` (half precision: its float32 value)."""
        if dtype in LOW:
            value, dtype = torch.tensor(float(value), dtype=dtype).item(), torch.float32
        if dtype == torch.bool:
            lit = "1" if value else "0"
        elif dtype.is_floating_point:
            v = float(value)
            lit = repr(v) if math.isfinite(v) else f'float("{v}")'
        else:
            lit = str(int(value))
        return f"tl.full({self.shape}, {lit}, {TYPES[dtype]})"

    def expr(self, e: Expr, memo: dict[Expr, str], lines: list[str]) -> str:
        """Emit ``e`` (each distinct subexpression once) into ``lines``; return its name."""
        name = memo.get(e)
        if name is not None:
            return name
        if e.op is Op.LOAD and e.arg[0] in self.values:
            return self.values[e.arg[0]]
        args = [self.expr(a, memo, lines) for a in e.args]
        code = self.code(e, args)
        if e.op is Op.CONST:
            return code
        name = self.fresh()
        lines.append(f"{name} = {code}")
        memo[e] = name
        return name

    def index(self, e: sympy.Expr) -> str:
        """An index; in a flat kernel, one that moves with the flat point is printed over
        ``index`` itself (Triton then sees contiguous loads, not a division and a modulo)."""
        if self.flat is not None:
            shift = sympy.expand(e - self.flat)
            if not self.varies(shift):
                return "index" if shift == 0 else f"(index + {tindex(shift)})"
        return tindex(e)

    def varies(self, e: sympy.Expr) -> bool:
        """``e`` moves within a block: it names a loop variable or a loaded index, not only
        size arguments (one number a launch)."""
        return bool(e.free_symbols - self.sizes - self.fixed)

    def rounded(self, value: str, dtype: torch.dtype) -> str:
        """``value`` rounded to half precision ``dtype``, as float32. The interpreter converts
        float32 to bfloat16 by truncation: there, a helper rounds to nearest even."""
        if dtype == torch.bfloat16 and self.interpret:
            return f"_ember_bf16({value})"
        return f"{value}.to({TYPES[dtype]}).to(tl.float32)"

    def stored(self, value: str, dtype: torch.dtype) -> str:
        """``value`` converted to ``dtype`` for a store."""
        if dtype == torch.bfloat16 and self.interpret:
            value = f"_ember_bf16({value})"  # exact in bfloat16 now: no truncation left
        return f"{value}.to({TYPES[dtype]})"

    def pointer(self, name: str, index: sympy.Expr) -> str:
        """``name`` at ``index``: a block of pointers even where the index is one number
        (Triton loads and stores a block of values only through a block of pointers)."""
        if self.varies(index):
            return f"{name} + ({self.index(index)})"
        return f"{name} + {tindex(index)} + tl.zeros({self.shape}, tl.int32)"

    def code(self, e: Expr, args: list[str]) -> str:
        if e.op is Op.CONST:
            return self.const(e.arg, e.dtype)
        if e.op is Op.SCALAR:
            return f"s_{e.arg}"
        if e.op is Op.LOAD:
            src, index, indirect = e.arg
            index = index.xreplace(
                {s: sympy.Symbol(a) for s, a in zip(indirect, args, strict=True)}
            )
            up = ".to(tl.float32)" if e.dtype in LOW else ""
            return f"tl.load({self.pointer(src, index)}, {self.mask}, other=0){up}"
        if e.op is Op.INDEX:
            if not e.arg.free_symbols:
                return self.const(int(e.arg), torch.int64)
            if not self.varies(e.arg):  # a size: one number, made a block
                return f"({tindex(e.arg)} + tl.zeros({self.shape}, tl.int64))"
            return f"({self.index(e.arg)}).to(tl.int64)"
        if e.op is Op.CAST:
            if e.dtype in LOW:  # round to half precision, compute on in float32
                return self.rounded(args[0], e.dtype)
            return self.ops[Op.CAST].format(args[0], T=TYPES[e.dtype])
        fmt = self.ops.get(e.op)
        if fmt is None:
            where = "under Triton's interpreter" if self.interpret else "in Triton"
            raise Unsupported(f"{e.op.name} is not printed {where}")
        return fmt.format(*args)


def _arity(op: Op) -> int:
    return 2 if op is Op.POW else 1


_TRITON_INDEX = IndexSyntax(
    integer=str,
    terms=lambda e: _ordered(e),
    product="{}",
    floor_div="({} // {})",
    mod="({} % {})",
    minimum="tl.minimum({}, {})",
    maximum="tl.maximum({}, {})",
    unsupported=Unsupported,
)


def tindex(e: sympy.Expr) -> str:
    """A non-negative sympy index as Triton integer arithmetic.

    >>> i, j = sympy.symbols("x0 y0", integer=True, nonnegative=True)
    >>> tindex(8 * i + sympy.Mod(j, 4) + sympy.floor(j / 4))
    '(8 * x0 + (y0 % 4) + (y0 // 4))'
    """
    return print_index(e, _TRITON_INDEX)


def _ordered(e: sympy.Expr) -> list[sympy.Expr]:
    """Terms with numbers first in products and last in sums, as people write them."""
    args = list(e.args)
    if isinstance(e, sympy.Mul):
        return sorted(args, key=lambda a: not a.is_Number)
    return sorted(args, key=lambda a: a.is_Number)


# ---- the module (its fixed text: triton_prelude) ----------------------------------------


def module_source(
    sched: Schedule, interpret: bool, per_kernel: Mapping[str, Knobs] | None = None
) -> tuple[str, dict[str, list[str]]]:
    """The Triton module of ``sched`` and each kernel's arguments (as ``codegen_cpp`` gives
    them). Beside each ``@triton.jit`` kernel ``kernelN`` the module has ``launch_kernelN``,
    which the wrapper calls with the tensors: the kernel on its grid (nothing for a kernel
    over no points). ``interpret``: for Triton's interpreter (CPU tensors). ``per_kernel``:
    kernels written under knobs of their own (max_autotune's choice per kernel; their
    ``lowering`` must be the current one's)."""
    parts = [HEADER + ("" if interpret else LIBDEVICE_IMPORT) + HELPERS]
    parts += [INTERPRETER_MATH] if interpret else []
    args: dict[str, list[str]] = {}
    per_kernel = per_kernel or {}
    for step in sched.steps:
        if isinstance(step, Kernel):
            own = per_kernel.get(step.name)
            with knobs(own) if own is not None else contextlib.nullcontext():
                w = _KernelWriter(sched, step, interpret)
                text = w.write()  # a symbolic kernel: a 32-bit twin, chosen at launch
            parts.append(triton_index32.with_narrow(text, w) if w.wide else text)
            args[step.name] = w.args
    if any("_ember_rand" in part for part in parts[1:]):  # (fused_random): the generator
        parts.insert(1, philox.triton_source(interpret))
    if any("torch.empty(" in part for part in parts[1:]):  # a split reduction's scratch
        parts.insert(1, "import torch\n")
    return "\n".join(parts), args


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _decompose(vars_: list[sympy.Symbol], sizes: tuple[Any, ...], flat: str) -> list[str]:
    """Lines setting each of ``vars_`` (row-major over ``sizes``, symbolic ones included)
    from the index ``flat``.

    >>> _decompose(X[:2], (sympy.Symbol("ks0"), sympy.Symbol("ks1")), "xindex")
    ['x1 = xindex % ks1', 'x0 = (xindex // ks1)']
    """
    lines, step = [], sympy.Integer(1)
    for v, n in reversed(list(zip(vars_, sizes, strict=True))):
        at = flat if step == 1 else f"({flat} // {_operand(step)})"
        lines.append(f"{v} = {at}" if v is vars_[0] else f"{v} = {at} % {_operand(n)}")
        step *= n
    return lines


def _t(n: Any) -> str:
    """A size (int or symbolic) as a kernel's integer expression."""
    return tindex(sympy.sympify(n))


def _operand(n: Any) -> str:
    """``_t(n)`` parenthesised unless it is one name or number (an operand of ``//``, ``%``)."""
    text = _t(n)
    return text if sympy.sympify(n).is_Atom else f"({text})"


@dataclass(frozen=True, slots=True)
class _Block:
    """How a row kernel cuts its work: outer points per program, inner points per block."""

    x: int
    r: dict[int, int]  # stage position -> its RBLOCK


class _KernelWriter:
    """The source of one kernel; ``args`` are its buffers and numbers in signature order."""

    def __init__(self, sched: Schedule, kernel: Kernel, interpret: bool) -> None:
        self.prog, self.kernel, self.sched = sched.program, kernel, sched
        self.flat = all(not st.is_reduction for st in kernel.stages) and (
            len({st.inner for st in kernel.stages}) == 1
        )
        self.p = TritonPrinter(interpret, "[1]" if self.flat else "[1, 1]")
        self.lines: list[str] = []
        self.reads: list[str] = []
        self.writes: list[str] = []
        self.scalars: dict[str, torch.dtype] = {}
        self.defs = self._inline_defs()
        self.unread: set[str] = set()  # pointwise values not stored (``_unread``)
        self.top_rb: int | None = None  # RBLOCK of the names rindex, mask, y* outside loops
        self.points: Any = 0  # programs x block: the points (flat) or outer points (rows)
        self.block = 1
        self.warps = 4
        sv = self.prog.size_vars
        self.hints = {} if sv is None else sv.hints  # example sizes: block choices only
        self.p.sizes = frozenset(() if sv is None else sv.sources)
        self.sizes: list[str] = []  # the size symbols the kernel reads: int arguments
        # run-time sizes may pass 32 bits, which no launch checks: 64-bit indices then
        self.wide = False
        for name, buf in self.prog.buffers.items():
            if not is_static(buf.layout.extent):
                self.wide = True
            elif buf.layout.extent >= 2**31:
                raise Unsupported(f"{name}: sizes past 32-bit indices")

    def _inline_defs(self) -> dict[str, Expr]:
        """Pointwise values of this kernel, by buffer: a later read recomputes them (at the
        point they were computed; a stage over one point has its loop variables at 0)."""
        defs = {}
        for st in self.kernel.stages:
            if st.is_reduction:
                continue
            zero = {y: sympy.Integer(0) for y in Y[: len(st.inner)]}
            one = math.prod(st.inner) == 1
            for s in st.stores:
                defs[s.name] = _at(s.body, zero) if one else s.body
        return defs

    def inline(self, e: Expr, memo: dict[int, Expr] | None = None) -> Expr:
        """``e`` with reads of this kernel's pointwise values replaced by their bodies."""
        memo = {} if memo is None else memo
        if id(e) in memo:
            return memo[id(e)]
        if e.op is Op.LOAD and e.arg[0] in self.defs and not e.args:
            out = self.inline(self.defs[e.arg[0]], memo)
        elif e.args:
            out = Expr(e.op, e.dtype, tuple(self.inline(a, memo) for a in e.args), e.arg)
        else:
            out = e
        memo[id(e)] = out
        return out

    def note(self, st: Stage) -> None:
        """Record the buffers and numbers the stage reads and the buffers it writes."""
        for s in st.stores:
            for e in walk(self.inline(s.body)):
                name = e.arg[0] if e.op is Op.LOAD else None
                if name is not None and name not in self.defs and name not in self.reads:
                    if name not in self._reductions():
                        self.reads.append(name)
                elif e.op is Op.SCALAR:
                    self.scalars[e.arg] = e.dtype
            if not s.local and s.name not in self.writes:
                self.writes.append(s.name)

    def _reductions(self) -> set[str]:
        return {s.name for st in self.kernel.stages if st.is_reduction for s in st.stores}

    @property
    def args(self) -> list[str]:
        buffers = self.reads + [w for w in self.writes if w not in self.reads]
        sizes = [scalar_arg(n, torch.int64) for n in self.sizes]
        return buffers + [scalar_arg(n, d) for n, d in self.scalars.items()] + sizes

    def emit(self, line: str, depth: int = 1) -> None:
        self.lines.append("    " * depth + line)

    def write(self) -> str:
        self.unread = self._unread()
        self.check_overwrites()
        for st in self.kernel.stages:
            self.note(st)
        names = [*self.reads, *(w for w in self.writes if w not in self.reads)]
        template = None if self.flat else triton_matmul.match(self.kernel, self.inline)
        tiled = triton_tiles.tile(self) if self.flat else None
        split = None if self.flat or template else triton_split.plan(self)
        if split is not None:  # a whole-tensor reduction: partials, then their combine
            return triton_split.write(self, split, names)
        if template is not None:
            body = triton_matmul.write(self, template)
        elif tiled is not None:  # loads and stores along different dims: 2-D tiles
            body = triton_tiles.write(self, tiled)
        else:
            body = self.write_flat() if self.flat else self.write_rows()
        text = "\n".join(body) + _t(self.points)
        self.sizes = [str(s) for s in sorted(self.p.sizes, key=str)]
        self.sizes = [n for n in self.sizes if re.search(rf"\b{n}\b", text)]
        params = names + [f"s_{n}" for n in self.scalars] + self.sizes
        head = f"\n\n@triton.jit\ndef {self.kernel.name}({', '.join(params)}):"
        return "\n".join([head, *body, *self.launcher(params)]) + "\n"

    def launcher(self, params: list[str]) -> list[str]:
        """``launch_<kernel>``: the kernel on its grid, the grid computed from the sizes
        (symbolic ones from the size arguments, per call); no launch over no points."""
        name, args = self.kernel.name, ", ".join(params)
        call = f"{name}[{{grid}}]({args}, num_warps={self.warps})"
        head = f"\n\ndef launch_{name}({args}):"
        if is_static(self.points):
            n = int(self.points)
            return [head, "    " + (call.format(grid=f"({-(-n // self.block)},)") if n else "pass")]
        grid = f"((_n + {self.block - 1}) // {self.block},)"
        try:
            points = pyexpr(self.points)
        except SizeUnsupported as e:
            raise Unsupported(str(e)) from e
        return [head, f"    _n = {points}", "    if _n > 0:",
                "        " + call.format(grid=grid)]  # fmt: skip

    def pid(self) -> str:
        return "tl.program_id(0).to(tl.int64)" if self.wide else "tl.program_id(0)"

    def write_flat(self) -> list[str]:
        """All stages pointwise over one inner shape: 1-D blocks over every point."""
        k = self.kernel
        inner = k.stages[0].inner
        numel = math.prod(k.outer) * math.prod(inner)
        # a symbolic size: full blocks (masks take the rest), whatever the example's size
        chosen = KNOBS.get()
        most, self.warps = chosen.block, chosen.warps or 4
        block = min(most, _next_pow2(max(numel, 1))) if is_static(numel) else most
        self.points, self.block = numel, block
        self.emit(f"index = {self.pid()} * {block} + tl.arange(0, {block})")
        self.emit(f"mask = index < {_t(numel)}")
        vars_ = [*X[: len(k.outer)], *Y[: len(inner)]]
        for line in _decompose(vars_, (*k.outer, *inner), "index"):
            self.emit(line)
        strides = Layout.contiguous((*k.outer, *inner)).strides
        self.p.flat = sympy.expand(sum(v * s for v, s in zip(vars_, strides, strict=True)))
        memo: dict[Expr, str] = {}
        for st in k.stages:
            self.pointwise(st, memo, 1)
        return self.lines

    def blocks(self) -> _Block:
        """``XBLOCK`` and each stage's ``RBLOCK``: a short row in one block; a long one in
        blocks of ``LOOP_BLOCK``, one row a program (many programs), unless its loads run
        along the outer index (a column sum): then ``COLUMN_BLOCK`` of each, so that a
        block reads whole lines of memory. Outer points fill the rest of the block, up to
        ``Knobs.row_elements``. A row of symbolic length always loops (one block may not hold it
        at another size), in blocks sized for the example's length, at most the long
        ones; the example's sizes choose only block sizes, which masks make right for
        every size."""
        r = {}
        rows = hint(math.prod(self.kernel.outer), self.hints)
        lengths = [math.prod(st.inner) for st in self.kernel.stages]
        looped = any(not is_static(n) or n > PERSISTENT_MAX for n in lengths)
        column = looped and _along_outer(self.kernel)
        for k, n in enumerate(lengths):
            long = COLUMN_BLOCK if column else LOOP_BLOCK
            fit = _next_pow2(max(hint(n, self.hints), 1))
            r[k] = fit if is_static(n) and n <= PERSISTENT_MAX else min(fit, long)
        widest = max(r.values(), default=1)
        one_row = any(hint(n, self.hints) > PERSISTENT_MAX for n in lengths)
        chosen = KNOBS.get()
        x = 1 if one_row and not column else max(1, chosen.row_elements // widest)
        x = min(_next_pow2(max(rows, 1)), x)
        self.warps = chosen.warps or (8 if widest * x >= 2048 else 4)
        return _Block(x, r)

    def write_rows(self) -> list[str]:
        """Stages in order over ``[XBLOCK, RBLOCK]`` blocks of ``XBLOCK`` outer points."""
        k = self.kernel
        b = self.blocks()
        xnumel = math.prod(k.outer)
        self.points, self.block = xnumel, b.x
        self.emit(f"xindex = {self.pid()} * {b.x} + tl.arange(0, {b.x})[:, None]")
        self.emit(f"xmask = xindex < {_t(xnumel)}")
        for line in _decompose(X[: len(k.outer)], k.outer, "xindex"):
            self.emit(line)
        for pos, st in enumerate(k.stages):
            self.stage(st, b.x, b.r[pos])
        return self.lines

    def stage(self, st: Stage, xb: int, rb: int) -> None:
        """One stage: its loop over blocks of the row (none when one block holds the row)."""
        n = math.prod(st.inner)
        looped = not is_static(n) or n > rb
        depth = 1
        if not st.is_reduction and all(self._kept(s) for s in st.stores):
            return  # every value is recomputed where a later stage reads it
        if st.is_reduction:
            self.accumulators(st, xb, rb, looped)
        wide = ".to(tl.int64)" if self.wide else ""
        head = [
            f"rindex = roffset + tl.arange(0, {rb})[None, :]{wide}",
            f"mask = xmask & (rindex < {_t(n)})",
            *_decompose(Y[: len(st.inner)], st.inner, "rindex"),
        ]
        if looped and self.top_rb not in (None, rb):
            # a name live into a loop keeps its type there (Triton's rule): the names an
            # earlier one-block stage set take this loop's block shape first
            for line in head:
                self.emit(line.replace("roffset + ", ""))
        if looped:
            self.emit(f"for roffset in range(0, {_t(n)}, {rb}):")
            depth = 2
        else:
            self.emit("roffset = 0")
        self.top_rb = rb if not looped or self.top_rb is not None else None
        for line in head:
            self.emit(line, depth)
        if st.is_reduction:
            self.combine(st, depth, None if looped else n)
            self.finish(st, looped)
        else:
            self.pointwise(st, {}, depth)

    def pointwise(self, st: Stage, memo: dict[Expr, str], depth: int) -> None:
        lines: list[str] = []
        for s in st.stores:
            if self._kept(s):
                continue  # recomputed where it is read
            value = self.p.expr(self.inline(s.body), memo, lines)
            buf = self.prog.buffers[s.name]
            lines.append(self._store(s, value, buf.dtype, "mask"))
        for line in lines:
            self.emit(line, depth)

    def _rounding(self, value: str, body: torch.dtype, buffer: torch.dtype) -> str:
        """A reduction's result as its buffer's dtype, which later stages read (as the C++
        kernel's local variable of that type): half precision rounds and stays float32."""
        if buffer == body:
            return value
        if buffer in LOW:
            return self.p.rounded(value, buffer)
        return f"{value}.to({TYPES[buffer]})"

    def _kept(self, s: Store) -> bool:
        """A pointwise value that never reaches memory."""
        return s.local or s.name in self.sched.scratch or s.name in self.unread

    def _root(self, name: str) -> str:
        while name in self.sched.reuse:  # stored in the memory of another buffer
            name = self.sched.reuse[name]
        return name

    def _unread(self) -> set[str]:
        """Pointwise values of this kernel nothing reads from memory: no other step, no
        output, and this kernel only through their bodies (``inline``). Not stored (over
        symbolic sizes the scheduler gives softmax's ``exp`` no scratch row but memory)."""
        outs = [r.name for r in pytree.tree_leaves(self.prog.outputs) if isinstance(r, Ref)]
        needed = set(outs)
        for step in self.sched.steps:
            if not isinstance(step, Kernel):
                needed |= {r.name for r in step.refs()}
                continue
            bodies = [s.body for st in step.stages for s in st.stores]
            bodies = [self.inline(b) for b in bodies] if step is self.kernel else bodies
            needed |= {e.arg[0] for b in bodies for e in walk(b) if e.op is Op.LOAD}
        return {n for n in self.defs if n not in needed and self._root(n) not in self.prog.inputs}

    def check_overwrites(self) -> None:
        """Values are recomputed from what they read (``inline``): refuse a kernel whose
        stage stores over memory (in place, reused) that a later stage reads."""
        written: set[str] = set()
        values = self._reductions()
        for st in self.kernel.stages:
            loads = (e for s in st.stores for e in walk(self.inline(s.body)) if e.op is Op.LOAD)
            if written & {self._root(e.arg[0]) for e in loads if e.arg[0] not in values}:
                raise Unsupported(f"{self.kernel.name}: a stage stores over memory read later")
            written |= {self._root(s.name) for s in st.stores if not self._kept(s)}

    def _store(self, s: Store, value: str, dtype: torch.dtype, mask: str) -> str:
        return f"tl.store({self.p.pointer(s.name, s.index)}, {self.p.stored(value, dtype)}, {mask})"

    # ---- reductions ---------------------------------------------------------------------

    def accumulators(self, st: Stage, xb: int, rb: int, looped: bool) -> None:
        shape = f"[{xb}, {rb}]"
        for group in by_body(s for s in st.stores if s.reduce in WELFORD):
            if not looped:
                continue  # one block: two passes in registers (two_pass)
            w = f"{group[0].name}_w"
            for part in ("mean", "m2", "n"):
                self.emit(f"{w}_{part} = tl.zeros({shape}, tl.float32)")
            if group[0].body.dtype == torch.float64:
                self.lines[-3:] = [ln.replace("tl.float32", "tl.float64") for ln in self.lines[-3:]]
        for s in st.stores:
            if s.reduce in WELFORD:
                continue
            t = _compute(s.body.dtype)
            init = identity(s.reduce, s.body.dtype)  # type: ignore[arg-type]
            self.emit(f"{s.name}_acc = tl.full({shape}, {init}, {TYPES[t]})")
            if s.reduce in (Reduce.MAX, Reduce.MIN) and s.body.dtype.is_floating_point:
                self.emit(f"{s.name}_nan = tl.zeros({shape}, tl.int32)")
            if s.reduce in (Reduce.ARGMAX, Reduce.ARGMIN):
                self.emit(f"{s.name}_idx = tl.zeros({shape}, tl.int64)")

    def combine(self, st: Stage, depth: int, whole: int | None) -> None:
        """Fold the block's values into the accumulators (masked points leave them as are).
        ``whole``: the row's length when one block holds it (Welford is then two passes over
        the values in registers: the mean, then the squared deviations from it)."""
        memo: dict[Expr, str] = {}
        lines: list[str] = []
        done: set[Expr] = set()
        for s in st.stores:
            v = self.p.expr(self.inline(s.body), memo, lines)
            acc = f"{s.name}_acc"
            if s.reduce in WELFORD:
                if s.body not in done:
                    done.add(s.body)
                    w = f"{s.name}_w"
                    lines += welford_step(w, v) if whole is None else two_pass(w, v, whole)
                continue
            init = identity(s.reduce, s.body.dtype)  # type: ignore[arg-type]
            lines += [
                line.format(acc=acc, v=v, init=init, n=s.name)
                for line in COMBINE[s.reduce]  # type: ignore[index]
            ]
            if s.reduce in (Reduce.MAX, Reduce.MIN) and s.body.dtype.is_floating_point:
                lines.append(f"{s.name}_nan = {s.name}_nan | (mask & ({v} != {v})).to(tl.int32)")
        for line in lines:
            self.emit(line, depth)

    def finish(self, st: Stage, looped: bool) -> None:
        """Reduce each accumulator across its block to a ``[XBLOCK, 1]`` result."""
        groups = {
            g[0].body: g[0].name for g in by_body(s for s in st.stores if s.reduce in WELFORD)
        }
        for s in st.stores:
            if s.reduce in WELFORD:
                w = f"{groups[s.body]}_w"
                first = next(x for x in st.stores if x.reduce in WELFORD and x.body == s.body)
                if looped and s is first:  # (another kind may reduce the same body)
                    self.emit(
                        f"{w}_mr, {w}_sr, {w}_nr = tl.reduce(({w}_mean, {w}_m2, {w}_n), 1, "
                        "_ember_welford)"
                    )
                value = f"{w}_mr" if s.reduce is Reduce.WELFORD_MEAN else f"{w}_sr"
            else:
                value = FINISH[s.reduce].format(n=s.name)  # type: ignore[index]
                if s.reduce in (Reduce.MAX, Reduce.MIN) and s.body.dtype.is_floating_point:
                    value = f'tl.where(tl.max({s.name}_nan, 1) > 0, float("nan"), {value})'
            buf = self.prog.buffers[s.name]
            value = self._rounding(f"({value})[:, None]", s.body.dtype, buf.dtype)
            self.emit(f"{s.name}_l = {value}")
            self.p.values[s.name] = f"{s.name}_l"
            if not s.local:
                self.emit(self._store(s, f"{s.name}_l", buf.dtype, "xmask"))


def _at(e: Expr, point: dict[sympy.Symbol, sympy.Expr]) -> Expr:
    """``e`` with its indices' loop variables set to ``point``."""
    return map_indices(e, lambda i: i.xreplace(point))


def _along_outer(kernel: Kernel) -> bool:
    """A reduction of the kernel loads along memory with its innermost outer loop and
    across memory with its innermost reduce loop (``x.sum(0)``)."""
    if not kernel.outer:
        return False
    xk = X[len(kernel.outer) - 1]
    for st in kernel.stages:
        if not st.is_reduction or not st.inner:
            continue
        yk = Y[len(st.inner) - 1]
        for s in st.stores:
            for e in walk(s.body):
                if e.op is Op.LOAD and not e.args:
                    index = e.arg[1]
                    if index.coeff(xk) == 1 and index.coeff(yk) != 1:
                        return True
    return False


def _compute(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in LOW else dtype
