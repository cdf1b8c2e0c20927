"""C++/OpenMP code for a schedule: one translation unit, one ``extern "C"`` function per kernel.

:class:`Printer` turns body expressions into source through tables: ``OPS``
maps each :class:`~ember.inductor.ops.Op` to a format string, ``TYPES`` each
dtype to a type name, ``REDUCE`` each reduction to its identity and combine
step. :class:`CppPrinter` fills them for C++; a Triton printer overrides
entries, not methods. Kernels parallelise their outer loop with OpenMP when
the work is large enough to pay for the threads, keep the innermost loop over
the contiguous index so the compiler vectorises it, and compute half and
bfloat16 in float.

>>> from ember.inductor.ir import I, Buffer, Layout, load
>>> x = Buffer("x", torch.float32, Layout.contiguous((8,)))
>>> e = Expr(Op.EXP, torch.float32, (load(x, (I[0],)),))
>>> p = CppPrinter()
>>> lines, memo = [], {}
>>> p.expr(e.args[0], memo, lines), p.expr(e, memo, lines)
('t0', 't1')
>>> lines
['float t0 = x[i0];', 'float t1 = ember_exp(t0);']
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch

from ember.inductor import philox, wrapper_launch
from ember.inductor.codegen_accum import (
    acc_type,
    lane_folds,
    lane_init,
    lane_split,
    row_group,
    row_partials,
)
from ember.inductor.codegen_ranges import SHARE_CPP, Loop, count, dispatcher, range_nest
from ember.inductor.codegen_tiles import STRIP_CPP, TiledLoops, column_kernel, strip_width
from ember.inductor.codegen_transpose import transposed_loads
from ember.inductor.codegen_welford import by_body
from ember.inductor.cpp_prelude import PRELUDE
from ember.inductor.cpp_printer import CppPrinter, Printer, cindex, ordered_bound
from ember.inductor.ir import Expr, Layout, walk
from ember.inductor.knobs import KNOBS, PARALLEL_MIN_WORK
from ember.inductor.loops import replace_indices, split_inner, stage_indices, without_unit_loops
from ember.inductor.ops import WELFORD, Op, Reduce
from ember.inductor.piecewise import pieces
from ember.inductor.scheduler import Kernel, Schedule, Stage, Store, X, Y
from ember.inductor.symbolic import hint

__all__ = ["PARALLEL_MIN_WORK", "CppPrinter", "Printer", "scalar_arg", "translation_unit"]


def _loops(vars_: list[sympy.Symbol], ranges: tuple[Any, ...]) -> list[str]:
    return [
        f"for (int64_t {v} = 0; v_lt; ++{v}) {{".replace("v_lt", f"{v} < {_bound(n)}")
        for v, n in zip(vars_, ranges, strict=True)
    ]


def _into(combine: str, name: str, part: str, lane: sympy.Symbol | None) -> str:
    """``combine``, which joins a value to ``{name}_acc``, joining it to ``{name}{part}``
    instead (a row's float partial ``_row``), or with ``lane``, the innermost loop's
    variable, to that lane of it (``_v[y - y_o]``, ``lane_split``)."""
    target = f"{name}{part}" if lane is None else f"{name}{part}_v[{lane} - {lane}_o]"
    return combine.replace(f"{name}_acc", target)


def _blocks(y: sympy.Symbol, size: Any, step: int, suffix: str) -> tuple[str, str]:
    """Loop heads for ``y`` in blocks of ``step``: one over the blocks (``y`` + ``suffix``),
    one over ``y`` in a block."""
    o = f"{y}{suffix}"
    return (
        f"for (int64_t {o} = 0; {o} < {size}; {o} += {step}) {{",
        f"for (int64_t {y} = {o}; {y} < {o} + {step}; ++{y}) {{",
    )


def _kind(s: Store) -> Reduce:
    assert s.reduce is not None, s
    return s.reduce


def _bound(n: Any) -> str:
    """A loop bound: an int, or a size expression over the kernel's size arguments."""
    return str(n) if isinstance(n, int) else cindex(sympy.sympify(n))


class _KernelWriter(TiledLoops):
    """The source of one kernel; ``args`` are its buffers in signature order."""

    def __init__(
        self, sched: Schedule, kernel: Kernel, printer: CppPrinter, parallel: bool | None = None
    ) -> None:
        self.prog, self.kernel, self.p = sched.program, kernel, printer
        self.locals, self.scratch = sched.locals, sched.scratch
        self.lines: list[str] = []
        hints = sched.program.size_vars.hints if sched.program.size_vars is not None else {}
        self.outer_work = hint(math.prod(kernel.outer), hints)  # example sizes: heuristics only
        work = self.outer_work * sum(hint(math.prod(st.inner), hints) for st in kernel.stages)
        chosen = KNOBS.get()
        self.parallel, self.quantum = work >= chosen.parallel_min_work, chosen.tile
        self.threads = chosen.num_threads  # the num_threads clause of parallel loops
        total = math.prod(kernel.outer) * sum(math.prod(st.inner) for st in kernel.stages)
        # symbolic sizes: parallel or not is decided per call. With outer loops the body runs
        # over a range of them (``ranged``, see ``codegen_ranges``); without, a serial and a
        # parallel version (``parallel``: this version's choice, see ``_kernel_source``)
        self.work = None if isinstance(total, int) else sympy.expand(total)
        self.ranged = self.work is not None and bool(kernel.outer)
        last = kernel.outer[-1] if kernel.outer and not self.ranged else None
        self.tile = strip_width(last, chosen.tile)  # (a ranged kernel: tiles of the knob's)
        if self.ranged:
            self.parallel = False  # the dispatcher's region, not the body's loops
        elif self.work is not None and parallel is not None:
            self.parallel = parallel
        elif self.work is not None:  # (an OpenMP ``if`` clause)
            self.parallel = True
            self.threads += f" if({cindex(self.work)} >= {chosen.parallel_min_work})"
        self.advance, self.n = "", ""  # a ranged kernel's odometer step and outer points
        self.reads: list[str] = []
        self.writes: list[str] = []
        self.scalars: dict[str, torch.dtype] = {}  # run-time numbers the kernel reads
        self.tiled = column_kernel(kernel)
        self.staged: dict[Expr, str] = {}  # loads read from a local tile (stage_tiles)
        sv = sched.program.size_vars
        self.size_symbols = sorted(sv.sources, key=str) if sv is not None else []
        self.sizes: list[str] = []  # the size symbols the kernel reads, as int64 arguments
        mine = {s.name for st in kernel.stages for s in st.stores}
        # outputs written over a buffer the kernel reads, and that buffer: one memory
        self.shared = {n for o, d in sched.inplace.items() if o in mine for n in (o, d)}

    def emit(self, line: str, depth: int) -> None:
        self.lines.append("  " * depth + line)

    def write(self) -> str:
        return self.write_tiled() if self.tiled else self.write_loops()

    def write_loops(self) -> str:
        k = self.kernel
        depth = 1
        if self.ranged:
            depth = self.range_head(
                [(str(x), _bound(n), 1) for x, n in zip(X, k.outer, strict=False)]
            )
        elif k.outer:
            staged = transposed_loads(k) if not self.tiled else []
            loops = _loops(X[: len(k.outer)], k.outer)
            shared = len(k.outer) - (1 if staged else 0)  # a staged tile's side: per thread
            if self.parallel and shared:
                collapse = f" collapse({shared})" if shared > 1 else ""
                self.emit(f"#pragma omp parallel for{collapse}{self.threads}", depth)
            for line in loops[:shared]:
                self.emit(line, depth)
                depth += 1
            if staged:
                self.stage_tiles(staged, k.outer[-1], depth)
                self.emit(loops[-1], depth)
                depth += 1
        for st in k.stages:
            for s in st.stores:
                if s.name in self.scratch:  # private to the thread running this outer point
                    dtype = self.prog.buffers[s.name].dtype
                    self.emit(f"{self.p.type(dtype)} {s.name}_s[{math.prod(st.inner)}];", depth)
        for st in k.stages:
            self.stage(st, depth)
        if self.advance:
            self.emit(self.advance, depth)
        for d in range(depth - 1, 0, -1):
            self.emit("}", d)
        return self.body()

    def bound(self, n: Any) -> str:
        return _bound(n)

    def stage_tiles(self, loads: list[Expr], side: int, depth: int) -> None:
        """Copy the tile of each transposed load into a local array along memory; the
        stage then reads the array along its innermost loop (:mod:`codegen_transpose`)."""
        x, y = X[len(self.kernel.outer) - 1], Y[0]
        for k, e in enumerate(loads):
            name, index, _ = e.arg
            local = f"{name}_tile{k}"
            self.emit(f"{self.p.type(e.dtype)} {local}[{side}][{side}];", depth)
            load = self.p.LOADS.get(e.dtype, "{0}").format(f"{name}[{self.p.index(index)}]")
            self.emit(_loops([y], (side,))[0], depth)
            self.emit("#pragma omp simd", depth + 1)
            self.emit(_loops([x], (side,))[0], depth + 1)
            self.emit(f"{local}[{x}][{y}] = {load};", depth + 2)
            self.emit("}", depth + 1)
            self.emit("}", depth)
            self.staged[e] = f"{local}[{x}][{y}]"

    def loop_lines(self, vars_: list[sympy.Symbol], ranges: tuple[Any, ...]) -> list[str]:
        return _loops(vars_, ranges)

    def range_head(self, loops: list[Loop]) -> int:
        """Open the collapsed loop over ``[lo, hi)`` of a ranged kernel's outer ``loops``;
        the depth of its body (``self.advance`` ends each iteration)."""
        self.emit("if (lo >= hi) return;  // (and no division by a size of 0)", 1)
        head, loop, self.advance = range_nest(loops)
        for line in [*head, loop]:
            self.emit(line, 1)
        self.n = " * ".join(count(loop) for loop in loops)
        return 2

    def body(self) -> str:
        """The function: its signature (size arguments: the symbols its lines name) and body."""
        text = "\n".join(self.lines)
        work = cindex(self.work) if self.ranged else ""  # the dispatcher reads it
        names = [str(s) for s in self.size_symbols]
        self.sizes = [n for n in names if re.search(rf"\b{n}\b", text + work)]
        if not self.ranged:
            return self.signature() + text + "\n}\n"
        body = f"{self.kernel.name}_r"
        ranged = self.signature(f"static void __attribute__((noinline)) {body}", "lo", "hi")
        names = [*self.buffer_args, *map(self.p.SCALAR.format, self.scalars), *self.sizes]
        limit = KNOBS.get().parallel_min_work
        whole = dispatcher(
            self.signature().rstrip("\n"), body, names, self.n, work, limit, self.threads
        )
        return f"{ranged}{text}\n}}\n\n{whole}"

    def signature(self, head: str = "", *extra: str) -> str:
        """The function's first line: ``extern "C" void`` and the kernel's name unless ``head``
        names it otherwise; ``extra`` are more ``int64_t`` parameters."""
        params = []
        for name in self.buffer_args:
            buf = self.prog.buffers[name]
            const = "const " if name not in self.writes else ""
            element = self.p.MEMORY_TYPES.get(buf.dtype, self.p.type(buf.dtype))
            restrict = "" if name in self.shared else "__restrict__ "
            params.append(f"{const}{element}* {restrict}{name}")
        for name, dtype in self.scalars.items():
            params.append(f"const {self.p.type(dtype)} {self.p.SCALAR.format(name)}")
        params += [f"const int64_t {name}" for name in (*self.sizes, *extra)]
        head = head or f'extern "C" void {self.kernel.name}'
        return f"{head}({', '.join(params)}) {{\n"

    @property
    def buffer_args(self) -> list[str]:
        return self.reads + [w for w in self.writes if w not in self.reads]

    @property
    def args(self) -> list[str]:
        """The kernel's arguments as the wrapper passes them: buffers, then numbers."""
        sizes = [scalar_arg(n, torch.int64) for n in self.sizes]
        return self.buffer_args + [scalar_arg(n, d) for n, d in self.scalars.items()] + sizes

    def _note_reads(self, e: Expr) -> None:
        for n in walk(e):
            if n.op is Op.LOAD and n.arg[0] not in self.locals and n.arg[0] not in self.reads:
                self.reads.append(n.arg[0])
            elif n.op is Op.SCALAR:
                self.scalars[n.arg] = n.dtype

    def stage(self, st: Stage, depth: int) -> None:
        for s in st.stores:
            self._note_reads(s.body)
            if not s.local and s.name not in self.writes:
                self.writes.append(s.name)
        if st.is_reduction:
            self.reduction(st, depth)
        else:
            self.pointwise(st, depth)

    def pointwise(self, st: Stage, depth: int, whole: bool = True) -> None:
        if st.inner and math.prod(st.inner) == 1:  # per outer point, like a reduction's result
            st = without_unit_loops(st)
        cut = whole and self._pieces(st)
        if cut:  # a cat or pad: each piece of the innermost loop copies one input
            for lo, piece in cut:
                self.emit(f"{{  // {Y[len(piece.inner) - 1]} from {lo}", depth)
                self.pointwise(piece, depth + 1, whole=False)
                self.emit("}", depth)
            return
        parallel = not self.kernel.outer and self.parallel and bool(st.inner)
        nest = split_inner(st, dict(zip(X, self.kernel.outer, strict=False)))
        vars_, ranges = (nest.vars, nest.ranges) if nest else (Y[: len(st.inner)], st.inner)
        st = self.fixed_clamps(nest.stage if nest else st, vars_, depth)
        memo: dict[Expr, str] = {}
        for line in self.hoist(st, vars_, ranges, memo):
            self.emit(line, depth)
        for k, line in enumerate(_loops(vars_, ranges)):
            # Iterations are independent (a stage reads what it writes only at the point it
            # writes), so say so: inside an OpenMP region gcc no longer sees __restrict__
            # and would give up on the alias checks of many-pointer loops.
            # An innermost loop inside another one is always marked simd: gcc 12 otherwise
            # unrolls a short one fully and vectorises the loop around it, and that
            # miscompiles a select fed by a stride-2 load (relu's gradient of x[:, ::2];
            # docs/correctness.md). Forcing the inner loop keeps gcc off that path.
            enclosed = len(ranges) > 1 or bool(self.kernel.outer)
            simd = k == len(ranges) - 1 and (enclosed or _contiguous(st, vars_[-1]))
            outer = parallel and k == 0
            wide = self.wide(st, ranges[-1]) if simd and _calls(st, self.p.WIDE_OPS) else ""
            pragma = ("parallel for" if outer else "") + (" simd" + wide if simd else "")
            pragma += self.threads if outer else ""  # clauses after the directive names
            if pragma:
                self.emit(f"#pragma omp {pragma.strip()}", depth)
            self.emit(line, depth)
            depth += 1
        for y, value in (nest.defs if nest else {}).items():  # for scratch-array indices
            self.emit(f"const int64_t {y} = {self.p.index(value)};", depth)
        lines: list[str] = []
        for e, tile in self.staged.items():  # a statement: a select's operand is read always
            memo[e] = self.p.fresh()
            lines.append(f"{self.p.type(e.dtype)} {memo[e]} = {tile};")
        for s in st.stores:
            value = self.p.expr(s.body, memo, lines)
            buf = self.prog.buffers[s.name]
            if s.name in self.scratch:
                lines.append(f"{s.name}_s[{_inner_flat(st.inner)}] = {value};")
            elif s.local:
                lines.append(f"{self.p.type(buf.dtype)} {s.name}_l = {value};")
            else:
                lines.append(f"{s.name}[{self.p.index(s.index)}] = {value};")
            # later stores of this stage read the value without going through memory
            load_e = Expr(Op.LOAD, buf.dtype, (), (s.name, s.index, ()))
            memo[load_e] = value
        for line in lines:
            self.emit(line, depth)
        for d in range(depth - 1, depth - 1 - len(ranges), -1):
            self.emit("}", d)

    def wide(self, st: Stage, inner: Any) -> str:
        """The simd clause of a loop over ``inner`` points calling vector math: 32 lanes where it
        moves 2-byte floats over at least 64 points, else 16."""
        short = isinstance(inner, int) and inner < 64
        return self.p.WIDE_HALF if self.half(st) and not short else self.p.WIDE

    def half(self, st: Stage) -> bool:
        """Whether the stage reads or writes 2-byte floats (gcc's loop then has 32 lanes)."""
        names = [s.name for s in st.stores]
        names += [e.arg[0] for s in st.stores for e in walk(s.body) if e.op is Op.LOAD]
        dtypes = {self.prog.buffers[n].dtype for n in names if n in self.prog.buffers}
        return bool(dtypes & {torch.bfloat16, torch.float16})

    @property
    def streaming(self) -> bool:
        """Whether the kernel only streams 4- and 8-byte values through cheap math along
        contiguous memory: no reduction, no tiles, no gather, no call. Such loops run faster
        on 256-bit vectors than on AVX-512's (see ``STREAM_PUSH``)."""
        k = self.kernel
        if self.tiled or (k.outer and transposed_loads(k)):
            return False
        for st in k.stages:
            if st.is_reduction or not st.inner or not _contiguous(st):
                return False
            exprs = [e for s in st.stores for e in walk(s.body)]
            names = [s.name for s in st.stores] + [e.arg[0] for e in exprs if e.op is Op.LOAD]
            sizes = {self.prog.buffers[n].dtype.itemsize for n in names if n in self.prog.buffers}
            if min(sizes, default=4) < 4 or any(e.op not in _STREAM_OPS for e in exprs):
                return False
            if sum(e.op not in _MOVES for e in exprs) > len(st.stores):  # one op a value
                return False
        return True

    def _pieces(self, st: Stage) -> list[tuple[int, Stage]] | None:
        """The stage cut into pieces (:mod:`ember.inductor.piecewise`), where nothing else
        reads its loop variables: not for values kept in scratch arrays or locals."""
        if any(s.local or s.name in self.scratch for s in st.stores):
            return None
        bounds = dict(zip(X, self.kernel.outer, strict=False))
        nest = split_inner(st, bounds)
        if nest is not None:  # cut where the digits' comparisons change: a slice per head
            rename = dict(zip(nest.vars, Y, strict=False))
            flat = replace_indices(nest.stage, lambda i: i.xreplace(rename))
            st = Stage(nest.ranges, flat.stores)
        return pieces(st, bounds)

    def fixed_clamps(self, st: Stage, loops: Sequence[sympy.Symbol], depth: int) -> Stage:
        """``st`` with each ``Min``/``Max``/``floor``/``Mod`` of its indices that the stage's
        loops do not vary computed once before them, into a named ``int64_t``. In the loop,
        ``x[y0 + 1024*std::min<int64_t>(1023, std::max<int64_t>(0, x0 - 1))]`` (a pad's
        row) is a gather to gcc; ``x[y0 + 1024*t3]`` a contiguous load: 1.58 ms against
        0.22 for a 1024x1024 pad."""
        inner = set(loops)
        found: dict[sympy.Expr, sympy.Symbol] = {}
        for index in stage_indices(st):
            for atom in index.atoms(sympy.Min, sympy.Max, sympy.floor, sympy.Mod):
                if not atom.free_symbols & inner and atom not in found:
                    found[atom] = sympy.Symbol(self.p.fresh(), integer=True)
        if not found or not inner:
            return st
        for atom, name in found.items():
            self.emit(f"const int64_t {name} = {self.p.index(atom)};", depth)
        return replace_indices(st, lambda i: i.xreplace(found))

    def hoist(
        self, st: Stage, loops: list[sympy.Symbol], ranges: tuple[int, ...], memo: dict[Expr, str]
    ) -> list[str]:
        """Lines computing, before the stage's loops, every value that does not vary in them
        (per-row loads such as a layer norm's mean, casts of numbers). gcc hoists most such
        code itself, but not a load that feeds only one side of a select: it keeps that load
        conditional, as a masked load of one address, which it cannot vectorise. The bound
        of a ``max``/``min`` by a number is named here too, hidden from gcc's constant
        folding (``cpp_printer.ordered_bound``)."""
        if not loops or 0 in ranges:
            return []
        varying, lines = set(loops), list[str]()
        fixed: dict[int, bool] = {}
        for s in st.stores:
            for e in walk(s.body):  # operands before users
                if e.op is Op.LOAD:
                    still = not (e.arg[1].free_symbols & varying)
                elif e.op is Op.INDEX:
                    still = not (e.arg.free_symbols & varying)
                else:
                    still = e.op in (Op.CONST, Op.SCALAR) or bool(e.args)
                fixed[id(e)] = still and all(fixed[id(a)] for a in e.args)
                if fixed[id(e)] and e.op is not Op.CONST:
                    self.p.expr(e, memo, lines)
                bound = ordered_bound(e)
                if bound is not None and bound not in memo:  # a variable to gcc: maxps
                    memo[bound] = name = self.p.fresh()
                    value = self.p.const(bound.arg, bound.dtype)
                    kind = self.p.type(bound.dtype)
                    lines.append(f"const {kind} {name} = ember_opaque({value});")
        return lines

    def reduction(self, st: Stage, depth: int) -> None:
        for group in by_body(s for s in st.stores if s.reduce in WELFORD):
            self.welford(dataclasses.replace(st, stores=group), depth)
        rest = tuple(s for s in st.stores if s.reduce not in WELFORD)
        if not rest:
            return
        st = self.fixed_clamps(dataclasses.replace(st, stores=rest), Y[: len(st.inner)], depth)
        inits, combines = [], []
        memo: dict[Expr, str] = {}
        for line in self.hoist(st, Y[: len(st.inner)], st.inner, memo):
            self.emit(line, depth)
        lines: list[str] = []
        flat = self.p.index(sympy.expand(Layout.contiguous(st.inner).index(Y[: len(st.inner)])))
        whole = not self.kernel.outer  # one result from all the kernel's elements
        wide = whole or not _contiguous(st)  # a float sum in one chain: in double (acc_type)
        for s in st.stores:
            acc_t = acc_type(self.p.type(s.body.dtype), s, wide)
            init, combine = self.p.REDUCE[s.reduce]  # type: ignore[index]
            acc = f"{s.name}_acc"
            if s.reduce in (Reduce.ARGMAX, Reduce.ARGMIN):
                start = "ember_lowest" if s.reduce is Reduce.ARGMAX else "ember_highest"
                inits.append(f"{acc_t} {acc}_v = {start}<{acc_t}>(); int64_t {acc} = 0;")
            else:
                inits.append(f"{acc_t} {acc} = {init.format(T=acc_t)};")
            if s.reduce in (Reduce.MAX, Reduce.MIN):
                inits.append(f"int {acc}_nan = 0;")  # an int: gcc 12 vectorises no bool ||
            value = self.p.expr(s.body, memo, lines)
            combines.append(combine.format(acc=acc, v=value, i=flat))
        for line in inits:
            self.emit(line, depth)
        omp = [self.p.OMP_REDUCE.get(s.reduce) for s in st.stores]  # type: ignore[arg-type]
        clause = " ".join(
            o.format(acc=f"{s.name}_acc") for o, s in zip(omp, st.stores, strict=True) if o
        )
        vectorise = bool(st.inner) and all(omp)
        rows = row_partials(st, wide, vectorise) if whole else set()
        shared = row_group(st, self.half(st)) if rows else 1  # rows sharing one partial
        alone = not whole or (len(rows) == len(st.stores) and shared == 1)  # lanes: accs or rows
        split = lane_split(st, wide and not rows, vectorise) if alone else 0
        lane = Y[len(st.inner) - 1] if split else None
        combines = [  # rows: into a float partial, then the double total (codegen_accum)
            _into(c, s.name, "_row" if s.name in rows else "_acc", lane)
            for c, s in zip(combines, st.stores, strict=True)
        ]
        self.lanes(st.stores if split and not rows else (), split, depth, fold=False)
        simd_clause = " ".join(
            o.format(acc=f"{s.name}_row" if s.name in rows else f"{s.name}_acc")
            for o, s in zip(omp, st.stores, strict=True)
            if o
        )
        clauses = (clause, "" if split else simd_clause) if vectorise else None
        partials = [s for s in st.stores if s.name in rows]
        self.reduce_loops(st, lines + combines, clauses, (partials, shared), whole, depth, split)
        self.lanes(st.stores if split and not rows else (), split, depth, fold=True)
        for s in st.stores:
            if s.reduce in (Reduce.MAX, Reduce.MIN):
                nan = f"std::numeric_limits<{self.p.type(s.body.dtype)}>::quiet_NaN()"
                self.emit(f"if ({s.name}_acc_nan) {s.name}_acc = {nan};", depth)
            self.result(s, f"{s.name}_acc", depth)

    def lanes(self, stores: Sequence[Store], split: int, depth: int, fold: bool) -> None:
        """Declare each store's ``split`` lanes ``_acc_v`` (``lane_split``), or after the
        loops (``fold``), join them into its ``_acc``."""
        for s in stores:
            acc = f"{s.name}_acc"
            for line in (
                lane_folds(acc, split, _kind(s)) if fold else [lane_init(acc, split, _kind(s))]
            ):
                self.emit(line, depth)

    def reduce_loops(
        self,
        st: Stage,
        body: list[str],
        clauses: tuple[str, str] | None,
        rows: tuple[list[Store], int],
        whole: bool,
        depth: int,
        split: int = 0,
    ) -> None:
        """The loops of a reduction stage around ``body``: threads share the outer loops
        of a reduction to one value, lanes the innermost (contiguous) one (``clauses``: the
        omp reduction clauses of the threads and of the lanes; None: no vector lanes).
        ``rows``: the sums whose row adds up in a float ``_row`` before joining ``_acc``,
        and how many rows share one ``_row`` (``row_group``: one simd loop collapsed over
        them, its outer loop stepping by the group). ``split``: the innermost loop runs in
        blocks of that many lanes, each adding into its own ``_acc_v`` (``lane_split``)."""
        parallel = clauses is not None and whole and self.parallel
        partials, group = rows
        n = len(st.inner)
        first = n - 2 if group > 1 else n - 1  # the loop the float partials start before
        inner_depth, row_depth = depth, depth
        for k, line in enumerate(_loops(Y[:n], st.inner)):
            if parallel and clauses is not None and k == 0:
                collapse = f" collapse({n - 1})" if n > 2 else ""
                simd = " simd" if n == 1 else ""
                omp = f"#pragma omp parallel for{simd}{collapse}{self.threads} {clauses[0]}"
                self.emit(omp, depth)
            if k == first and group > 1:  # the rows of a group, then one loop over them
                step, line = _blocks(Y[k], st.inner[k], group, "_g")
                self.emit(step, inner_depth)
                inner_depth += 1
            if k == first:
                row_depth = inner_depth
                for s in partials:
                    init = self.p.REDUCE[s.reduce][0]  # type: ignore[index]
                    lanes = f" float {s.name}_row_v[{split}] = {{}};" if split else ""
                    self.emit(f"float {s.name}_row = {init};{lanes}", inner_depth)
            if split and k == n - 1:  # blocks of lanes; the body still reads y
                block, line = _blocks(Y[k], st.inner[k], split, "_o")
                self.emit(block, inner_depth)
                inner_depth += 1
            if clauses is not None and k == first and not (parallel and n == 1):
                collapse = " collapse(2)" if group > 1 else ""
                self.emit(f"#pragma omp simd{collapse} {clauses[1]}".rstrip(), inner_depth)
            self.emit(line, inner_depth)
            inner_depth += 1
        for line in body:
            self.emit(line, inner_depth)
        for d in range(inner_depth - 1, depth - 1, -1):
            self.emit("}", d)
            if d == row_depth:
                for s in partials:
                    for line in lane_folds(f"{s.name}_row", split) if split else ():
                        self.emit(line, d)
                    join = self.p.REDUCE[s.reduce][1]  # type: ignore[index]
                    self.emit(join.format(acc=f"{s.name}_acc", v=f"{s.name}_row"), d)

    def result(self, s: Store, value: str, depth: int) -> None:
        """Store a reduction's ``value`` (of the body's dtype) as the buffer's dtype."""
        buf = self.prog.buffers[s.name]
        if buf.dtype != s.body.dtype:
            fmt = self.p.CASTS.get((s.body.dtype, buf.dtype), self.p.OPS[Op.CAST])
            value = fmt.format(value, T=self.p.type(buf.dtype))
        if s.local:
            self.emit(f"{self.p.type(buf.dtype)} {s.name}_l = {value};", depth)
        else:
            self.emit(f"{s.name}[{self.p.index(s.index)}] = {value};", depth)


def translation_unit(
    sched: Schedule, printer: CppPrinter | None = None
) -> tuple[str, dict[str, list[str]]]:
    """The C++ source of every kernel of ``sched`` and each kernel's buffer arguments."""
    p = printer or CppPrinter()
    parts, args = [PRELUDE], {}
    seen: dict[str, str] = {}  # kernel text with names made positional -> first kernel's name
    for step in sched.steps:
        if isinstance(step, Kernel):
            src, args[step.name] = _kernel_source(sched, step, p)
            first = seen.setdefault(_canonical(src, step.name), step.name)
            if first == step.name:
                parts.append(src)
            else:  # the same loop over other buffers (an unrolled RNN step): one body
                signature = src[src.index('extern "C"') :].split(" {\n", 1)[0]
                parts.append(f'{signature} __attribute__((alias("{first}")));\n')
    if any("ember_rand" in part for part in parts[1:]):
        parts.insert(1, philox.CPP)
    if any("ember_share(" in part for part in parts[1:]):
        parts.insert(1, SHARE_CPP)
    if any("ember_strip(" in part for part in parts[1:]):
        parts.insert(1, STRIP_CPP)
    if args:  # each kernel's entry point taking its arguments as one array (wrapper_launch)
        parts += [wrapper_launch.PACKED_CPP, wrapper_launch.packed_entries(list(args))]
    return "\n".join(parts), args


def _kernel_source(sched: Schedule, kernel: Kernel, p: CppPrinter) -> tuple[str, list[str]]:
    """A kernel's source and arguments. Over symbolic sizes with outer loops: one body over
    a range of them (``codegen_ranges``). Without: a serial and a parallel version, and the
    ``extern "C"`` function choosing one per call by the work it has, as a static kernel is
    chosen once (an OpenMP region that ``if(...)`` turns off still costs about 1 us a call,
    and its outlined loops ran up to 1.3x slower than plain ones)."""
    w = _KernelWriter(sched, kernel, p)
    src, args = _versions(sched, kernel, p, w)
    return (f"{STREAM_PUSH}{src}{STREAM_POP}" if w.streaming else src), args


# A streaming kernel (``_KernelWriter.streaming``) is compiled preferring 256-bit vectors, as
# gcc's tuning for Intel's AVX-512 chips does everywhere; for AMD's (znver4, this machine) it
# takes 512 bits. Measured on 1M float32 (bench_ops, 1 thread): a*b 182 -> 165 us, neg 0.84 ->
# 0.92x eager, maximum 0.84 -> 0.92x; the whole file at 256 bits lost instead: reductions
# (sum_last 0.89 -> 0.56x) and transposed tiles (where, t: 4.07 -> 2.20x) need the 512 bits.
# (The prelude's target pragma, not an attribute: the signatures stay as this file reads them.)
# Only kernels of one of these ops a value: sign on bfloat16 lost (2.34 -> 1.63x eager), and
# so did calls (powf: pos ** 1.5, 1.84 -> 1.33x), loads along other strides (a*b with one
# transposed: 4.97 -> 2.76x) and two ops (clamp: 0.89 -> 0.73-0.77x in four runs).
STREAM_PUSH, STREAM_POP = "EMBER_STREAM_BEGIN\n", "EMBER_STREAM_END\n"
_STREAM_OPS = frozenset(
    {Op.LOAD, Op.CONST, Op.SCALAR, Op.NEG, Op.ABS, Op.CAST, Op.ADD, Op.SUB, Op.MUL, Op.DIV,
     Op.MAX, Op.MIN, Op.AND, Op.OR, Op.XOR, Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE,
     Op.WHERE, Op.NOT, Op.FLOOR, Op.CEIL, Op.TRUNC}
)  # fmt: skip
_MOVES = frozenset({Op.LOAD, Op.CONST, Op.SCALAR, Op.CAST})


def _versions(
    sched: Schedule, kernel: Kernel, p: CppPrinter, w: _KernelWriter
) -> tuple[str, list[str]]:
    if w.work is None or w.ranged:
        return _resolve_locals(w.write(), sched, kernel), w.args
    versions = [_KernelWriter(sched, kernel, p, parallel=choice) for choice in (False, True)]
    texts = [_resolve_locals(v.write(), sched, kernel) for v in versions]
    serial = versions[0]
    if versions[1].args != serial.args or {str(s) for s in w.work.free_symbols} - set(serial.sizes):
        return _resolve_locals(w.write(), sched, kernel), w.args  # (an if clause)
    head = f'extern "C" void {kernel.name}('
    bodies = [
        t.replace(head, f"static void {kernel.name}_{k}(", 1)
        for t, k in zip(texts, "sp", strict=True)
    ]
    names = [*serial.buffer_args, *(p.SCALAR.format(n) for n in serial.scalars), *serial.sizes]
    call = f"({', '.join(names)});"
    limit = KNOBS.get().parallel_min_work
    choose = (
        f"{serial.signature()}  if ({cindex(w.work)} >= {limit}) {kernel.name}_p{call}\n"
        f"  else {kernel.name}_s{call}\n}}\n"
    )
    return "\n".join([*bodies, choose]), serial.args


def scalar_arg(name: str, dtype: torch.dtype) -> str:
    """A number argument in a kernel's argument list (buffers are plain names):
    ``truediv:float64``, so the wrapper passes it by value with the right C type."""
    return f"{name}:{str(dtype).removeprefix('torch.')}"


def _canonical(src: str, name: str) -> str:
    r"""``src`` with its kernel's name, its parameters and its buffer and temporary names
    numbered by first appearance (with the suffixes of the locals made from them:
    ``buf5_acc``, ``primals_3_l``), so two kernels differing only in the buffers they touch
    compare equal: a transformer's layers, whose kernels read ``primals_10`` in one layer
    and ``primals_34`` in the next. The parameters are numbered by position (the signature
    comes first), and their types, the loop bounds and every constant stay in the text, so
    kernels over other shapes or dtypes never compare equal.

    >>> a = 'extern "C" void kernel3(const float* primals_7, float* buf9) {\n  float t4_l;'
    >>> b = 'extern "C" void kernel8(const float* primals_19, float* buf30) {\n  float t12_l;'
    >>> _canonical(a, "kernel3") == _canonical(b, "kernel8")
    True
    >>> _canonical(a, "kernel3") == _canonical(b.replace("float*", "double*"), "kernel8")
    False
    """
    params = {
        p.split()[-1].lstrip("*&")
        for header in re.findall(r'^(?:extern "C"|static)[^\n]*\(([^()]*)\) \{$', src, re.M)
        for p in header.split(",")
        if p.strip()
    }
    words = "|".join(re.escape(w) for w in sorted(params, key=len, reverse=True))
    numbers: dict[str, str] = {}

    def rename(m: re.Match[str]) -> str:
        return numbers.setdefault(m.group(0), f"v#{len(numbers)}")

    pattern = rf"\b(?:{words + '|' if words else ''}(?:buf|t)\d+)(?=\b|_)"
    return re.sub(pattern, rename, re.sub(rf"\b{name}(?=\b|_[rsp]\b)", "KERNEL", src))


def _resolve_locals(src: str, sched: Schedule, kernel: Kernel) -> str:
    """Reads of a local buffer become reads of its variable."""
    if column_kernel(kernel):
        xk = f"x{len(kernel.outer) - 1}"
        for st in kernel.stages:
            for s in st.stores:
                if s.local:
                    src = re.sub(rf"\b{s.name}\[[^\]]*\]", f"{s.name}_l[{xk} - xb]", src)
        return src
    for st in kernel.stages:
        for s in st.stores:
            if s.name in sched.scratch:
                src = re.sub(rf"\b{s.name}\[[^\]]*\]", f"{s.name}_s[{_inner_flat(st.inner)}]", src)
            elif s.local:
                src = re.sub(rf"\b{s.name}\[[^\]]*\]", f"{s.name}_l", src)
    return src


def _calls(st: Stage, ops: frozenset[Op]) -> bool:
    """Whether a store of the stage computes one of ``ops``."""
    return any(e.op in ops for s in st.stores for e in walk(s.body))


def _contiguous(st: Stage, yk: sympy.Symbol | None = None) -> bool:
    """Every access of the stage moves by one element along its innermost loop ``yk`` (or not
    at all): vector loads and stores, so worth forcing. Gathers are left to gcc's cost model."""
    yk = Y[len(st.inner) - 1] if yk is None else yk
    indices = [s.index for s in st.stores]
    for s in st.stores:
        for e in walk(s.body):
            if e.op is Op.LOAD:
                if e.args:  # an indirect load is a gather
                    return False
                indices.append(e.arg[1])
            elif e.op is Op.INDEX:
                indices.append(e.arg)
    for index in indices:
        if yk in index.free_symbols and (index.coeff(yk) != 1 or yk in (index - yk).free_symbols):
            return False
    return True


def _inner_flat(inner: tuple[int, ...]) -> str:
    return cindex(sympy.expand(Layout.contiguous(inner).index(Y[: len(inner)])))
