"""Group loop-IR nodes into kernels; :mod:`~ember.inductor.memplan` then plans their memory.

A :class:`Kernel` runs a parallel loop nest over ``outer`` and, inside each
outer point, its :class:`Stage` s one after another; a stage is one inner
loop over ``inner`` that computes several pointwise nodes (vertical and
horizontal fusion) or one or more independent reductions. Nodes join the
open kernel while their ranges start with its ``outer`` and every value they
read from it was computed at the same point (same outer point, and same
inner point unless the value is per outer point). Bodies are rewritten from
the node's loop variables (``i``, ``r``) to the kernel's (``x`` outer, ``y``
inner). A buffer read only inside the stage that writes it, at the point it
was written, never reaches memory.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from ember.inductor.lowering import lower_graph
>>> def f(x):
...     m = x.amax(-1, keepdim=True)
...     e = (x - m).exp()
...     return e / e.sum(-1, keepdim=True)
>>> gm = make_fx(f)(torch.randn(4, 8))
>>> print(schedule(lower_graph(gm, [torch.randn(4, 8)])))
kernel0 over [4]
  stage [8]: buf0 = MAX(x_1[8*x0 + y0])
  stage [8]: buf1 = EXP(SUB(x_1[8*x0 + y0], buf0[x0]))
  stage [8]: buf2 = SUM(buf1[8*x0 + y0])
  stage [8]: buf3[8*x0 + y0] = DIV(buf1[8*x0 + y0], buf2[x0])
locals: buf0, buf2
scratch: buf1
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch

from ember.inductor import check
from ember.inductor.demand import demand_order
from ember.inductor.indexing import simplify_index
from ember.inductor.ir import (
    Expr,
    Extern,
    I,
    Layout,
    Node,
    Pointwise,
    Program,
    R,
    Reduction,
    Ref,
    Scalar,
    map_indices,
    scalars,
    walk,
)
from ember.inductor.looporder import pick_order, reordered
from ember.inductor.ops import Op, Reduce
from ember.inductor.reshape import reshape_index
from ember.inductor.restage import restage
from ember.inductor.symbolic import hint

__all__ = ["Kernel", "Schedule", "Stage", "Store", "X", "Y", "eliminate_dead", "schedule"]

X = [sympy.Symbol(f"x{k}", integer=True, nonnegative=True) for k in range(16)]  # outer loops
Y = [sympy.Symbol(f"y{k}", integer=True, nonnegative=True) for k in range(16)]  # inner loops


@dataclass(frozen=True, slots=True)
class Store:
    """One value a stage computes: ``name[index] = body`` (reduced over the stage if ``reduce``)."""

    name: str
    body: Expr
    index: sympy.Expr  # flat store index in x/y variables
    reduce: Reduce | None = None
    local: bool = False  # never written to memory: read only in its kernel

    def __str__(self) -> str:
        where = "" if self.reduce else f"[{self.index}]"
        value = f"{self.reduce.name}({self.body})" if self.reduce else str(self.body)
        return f"{self.name}{'' if self.local else where} = {value}"


@dataclass(frozen=True, slots=True)
class Stage:
    """One inner loop over ``inner`` computing ``stores`` at each point."""

    inner: tuple[int, ...]
    stores: tuple[Store, ...]

    @property
    def is_reduction(self) -> bool:
        return self.stores[0].reduce is not None


@dataclass(frozen=True, slots=True)
class Kernel:
    """A parallel loop nest over ``outer`` running ``stages`` in order at each outer point."""

    name: str
    outer: tuple[int, ...]
    stages: tuple[Stage, ...]

    def __str__(self) -> str:
        lines = [f"{self.name} over {list(self.outer)}"]
        for st in self.stages:
            lines += [f"  stage {list(st.inner)}: {s}" for s in st.stores]
        return "\n".join(lines)


@dataclass
class Schedule:
    """Kernels and extern calls in order, and the memory plan for their buffers."""

    program: Program
    steps: list[Kernel | Extern]
    locals: set[str] = field(default_factory=set)  # buffers that never reach memory
    scratch: set[str] = field(default_factory=set)  # locals kept in a per-row array
    reuse: dict[str, str] = field(
        default_factory=dict
    )  # buffer -> dead buffer whose memory it takes
    # buffer -> the buffer of the same layout its own stage reads for the last time, element
    # by element before writing it: the kernel writes over it (``reuse`` names the storage)
    inplace: dict[str, str] = field(default_factory=dict)
    frees: dict[int, list[str]] = field(default_factory=dict)  # step -> buffers dead after it
    # output buffer -> the graph input whose memory it is written into: the new value of a
    # mutated input (``ember.aotgraph.hints``), returned as the input tensor itself
    updates: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        out = [str(s) for s in self.steps]
        if self.locals - self.scratch:
            out.append(f"locals: {', '.join(sorted(self.locals - self.scratch, key=_order))}")
        if self.scratch:
            out.append(f"scratch: {', '.join(sorted(self.scratch, key=_order))}")
        moved = {a: b for a, b in self.reuse.items() if a not in self.inplace | self.updates}
        if moved:
            out.append("reuse: " + ", ".join(f"{a}<-{b}" for a, b in moved.items()))
        if self.inplace:
            out.append("in place: " + ", ".join(f"{a}<-{b}" for a, b in self.inplace.items()))
        if self.updates:
            out.append("into inputs: " + ", ".join(f"{a}->{b}" for a, b in self.updates.items()))
        return "\n".join(out)


def _order(name: str) -> tuple[int, str]:
    digits = "".join(c for c in name if c.isdigit())
    return (int(digits) if digits else -1, name)


def reads(node: Node) -> set[str]:
    """Buffers a node reads."""
    if isinstance(node, Extern):
        return {r.name for r in node.refs()}
    return {e.arg[0] for e in walk(node.body) if e.op is Op.LOAD}


def writes(node: Node) -> tuple[str, ...]:
    return node.names if isinstance(node, Extern) else (node.name,)


def output_names(prog: Program) -> set[str]:
    return {o.name for o in prog.outputs if isinstance(o, Ref)}


def eliminate_dead(prog: Program) -> Program:
    """Drop nodes whose results nobody reads (externs that mutate or draw random numbers
    are kept: a dropped draw would shift every later draw from torch's generator)."""
    live = output_names(prog)
    kept: list[Node] = []
    for node in reversed(prog.nodes):
        if any(n in live for n in writes(node)) or _impure(node):
            kept.append(node)
            live |= reads(node)
    kept.reverse()
    used = set(prog.inputs) | set(prog.constants) | {n for node in kept for n in writes(node)}
    buffers = {k: v for k, v in prog.buffers.items() if k in used}
    ops = _live_scalar_ops(prog, kept)
    numbers = set(prog.inputs) | {op.out.name for op in ops}
    kept_scalars = {k: v for k, v in prog.scalars.items() if k in numbers}
    return dataclasses.replace(
        prog, nodes=kept, buffers=buffers, scalars=kept_scalars, scalar_ops=ops
    )


def scalar_reads(node: Node) -> set[str]:
    """Run-time numbers a node reads."""
    if isinstance(node, Extern):
        return {s.name for s in scalars((node.args, node.kwargs))}
    return {e.arg for e in walk(node.body) if e.op is Op.SCALAR}


def _live_scalar_ops(prog: Program, nodes: list[Node]) -> list[Any]:
    live = {o.name for o in prog.outputs if isinstance(o, Scalar)}
    for node in nodes:
        live |= scalar_reads(node)
    kept = []
    for op in reversed(prog.scalar_ops):
        if op.out.name in live:
            kept.append(op)
            live |= {s.name for s in scalars(op.args)}
    kept.reverse()
    return kept


def _mutates(node: Node) -> bool:
    schema = getattr(getattr(node, "target", None), "_schema", None)
    return bool(schema is not None and schema.is_mutable)


def _impure(node: Node) -> bool:
    """Whether a node must run even when nobody reads its result."""
    tags = getattr(getattr(node, "target", None), "tags", ())
    return _mutates(node) or torch.Tag.nondeterministic_seeded in tags


# ---- grouping -----------------------------------------------------------------------------


def _outer_dims(node: Pointwise | Reduction, outer: tuple[int, ...]) -> int | None:
    """How many of the node's leading loops run as the outer loops of a kernel over ``outer``
    (None: it cannot run there). They may cut the same rows differently: a [256, 512] node
    runs in a kernel over [4, 64] (``i0 = 64*x0 + x1``), a [4, 64, 512] one over [256]."""
    if isinstance(node, Reduction):
        return len(node.ranges) if _same_rows(node.ranges, outer) else None
    if node.ranges[: len(outer)] == outer:
        return len(outer)
    for k in range(len(node.ranges) + 1):
        if _same_rows(node.ranges[:k], outer):
            return k
    return None


def _same_rows(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """``a`` and ``b`` number the same points, one's loops splitting the other's."""
    ca, cb = set(itertools.accumulate(a, operator.mul)), set(itertools.accumulate(b, operator.mul))
    if 0 in a or 0 in b:
        return a == b
    return math.prod(a) == math.prod(b) and (ca - {1} <= cb or cb - {1} <= ca)


def _fresh_outer(node: Pointwise | Reduction) -> tuple[int, ...]:
    """The outer loops of a kernel that ``node`` starts: all but its innermost loop."""
    if isinstance(node, Reduction):
        return node.ranges
    return node.ranges[:-1] if len(node.ranges) > 1 else ()


def _store(node: Pointwise | Reduction, out: Layout, k: int, outer: tuple[int, ...]) -> Store:
    """``node`` (writing through ``out``) in kernel variables: its first ``k`` loops outer,
    the rest inner."""
    inner = node.ranges[k:] if isinstance(node, Pointwise) else node.reduce_ranges
    same = node.ranges[:k] == outer
    rows = X[:k] if same else _reindex(outer, node.ranges[:k])
    sub = dict(zip(I[:k], rows, strict=True))
    sub |= {I[k + j]: Y[j] for j in range(len(inner))} if isinstance(node, Pointwise) else {}
    sub |= {R[j]: Y[j] for j in range(len(inner))} if isinstance(node, Reduction) else {}
    body = _subst(node.body, sub)
    if isinstance(node, Pointwise):
        index = out.index([sub[i] for i in I[: len(node.ranges)]])
    else:
        index = out.index(rows)
    index = sympy.expand(index)
    if not same:  # floor/Mod of the kernel's variables, where the rows were cut differently
        bounds = dict(zip(X, outer, strict=False)) | dict(zip(Y, inner, strict=False))
        body, index = _subst(body, {}, bounds), simplify_index(index, bounds)
    return Store(node.name, body, index, getattr(node, "kind", None))


def _reindex(outer: tuple[int, ...], sizes: tuple[int, ...]) -> list[sympy.Expr]:
    """The point of ``sizes`` (row-major) that is point ``X`` of ``outer``: loops matched in
    groups of equal size products (:func:`reshape_index`), so a node over ``[ks1*ks0]`` in a
    kernel over ``[ks0, ks1]`` reads ``ks1*x0 + x1``, the index the kernel's other nodes use,
    with no floor or Mod left to simplify under symbolic bounds."""
    return reshape_index(X[: len(outer)], outer, sizes)


def _subst(
    e: Expr, sub: dict[sympy.Symbol, sympy.Expr], bounds: dict[sympy.Symbol, int] | None = None
) -> Expr:
    """``e`` with its indices' variables replaced (and simplified within ``bounds``)."""

    def fix(index: sympy.Expr) -> sympy.Expr:
        index = index.xreplace(sub)
        return index if bounds is None else simplify_index(sympy.expand(index), bounds)

    return map_indices(e, fix)


@dataclass
class _Open:
    """The kernel being built: its outer ranges and stages so far."""

    outer: tuple[int, ...]
    stages: list[Stage]
    written: dict[str, tuple[Store, tuple[int, ...]]]  # buffer -> (its store, its stage's inner)
    step: int = 0  # its position among the schedule's steps


def _fits(open_: _Open, store: Store, inner: tuple[int, ...]) -> bool:
    """Every value ``store`` reads from the open kernel was computed at the point it reads."""
    for e in walk(store.body):
        if e.op is not Op.LOAD or e.arg[0] not in open_.written:
            continue
        src, src_inner = open_.written[e.arg[0]]
        if e.args:
            return False  # an indirect read of a value of this kernel
        per_outer = src.reduce is not None or math.prod(src_inner) == 1
        if per_outer:
            if e.arg[1] != src.index:
                return False
        elif e.arg[1] != src.index or src_inner != inner:
            return False
    return True


def _add(open_: _Open, store: Store, inner: tuple[int, ...]) -> None:
    open_.written[store.name] = (store, inner)
    last = open_.stages[-1] if open_.stages else None
    if last is not None and last.inner == inner:
        reads_last = {e.arg[0] for e in walk(store.body) if e.op is Op.LOAD} & {
            s.name for s in last.stores
        }
        pointwise = store.reduce is None and not last.is_reduction
        independent = store.reduce is not None and last.is_reduction and not reads_last
        if pointwise or independent:  # one loop computes both
            open_.stages[-1] = dataclasses.replace(last, stores=(*last.stores, store))
            return
    open_.stages.append(Stage(inner, (store,)))


def group(prog: Program) -> list[Kernel | Extern]:
    """Fuse nodes into kernels (externs end the open kernel). A node joins the open kernel,
    or, when it reads nothing the open kernel computes, the earlier kernel that computed its
    inputs (it then reads them while they are in cache, or in registers: the GELU derivative
    a forward graph saves for backward, computed beside the GELU instead of after the
    whole forward). Otherwise it starts a kernel."""
    steps: list[_Open | Extern] = []
    made: dict[str, int] = {}  # buffer -> the step computing it
    open_: _Open | None = None
    for node in prog.nodes:
        if isinstance(node, Extern):
            open_ = None
            steps.append(node)
            made |= {n: len(steps) - 1 for n in node.names}
            continue
        # loops in memory order (looporder.py): a change of the node's loop variables
        node, out = reordered(prog, node, pick_order(prog, node))
        reads_open = open_ is not None and bool(reads(node) & open_.written.keys())
        late = None if reads_open else _late_host(node, steps, made)
        hosts = (k for k in (late, open_) if k is not None and _join(node, out, k))
        host = next(hosts, None)
        if host is None and not reads_open:
            siblings = _siblings(prog, node, steps, made, open_)
            host = next((k for k in siblings if _join(node, out, k)), None)
        if host is None:
            open_ = host = _Open(_fresh_outer(node), [], {}, len(steps))
            steps.append(open_)
            joined = _join(node, out, open_)
            assert joined
        made[node.name] = host.step
    kernels: list[Kernel | Extern] = []
    for step in steps:
        if isinstance(step, Extern):
            kernels.append(step)
        elif step.stages:
            name = f"kernel{sum(isinstance(s, Kernel) for s in kernels)}"
            kernels.append(Kernel(name, step.outer, tuple(step.stages)))
    return kernels


def _join(node: Pointwise | Reduction, out: Layout, kernel: _Open) -> bool:
    """Add ``node`` (writing through ``out``) to ``kernel`` if it can run there."""
    k = _outer_dims(node, kernel.outer)
    if k is None:
        return False
    store, inner = _store(node, out, k, kernel.outer), _inner(node, k)
    if not _fits(kernel, store, inner) or not _same_kind(kernel, store, inner):
        return False
    _add(kernel, store, inner)
    return True


def _same_kind(kernel: _Open, store: Store, inner: tuple[int, ...]) -> bool:
    """A column reduction (its inner loop strided, the kernel's last outer loop contiguous:
    a norm's weight gradient, summed over the tokens) shares a kernel only with other column
    reductions, which run in strips across the columns (``codegen_tiles``). Joined to a row
    kernel whose outer loop merely has the same length (128 tokens, 128 channels), each
    column was summed alone down a strided loop: 50-65 us for a Llama norm's backward, where
    the strips take a third of that."""
    if not inner:
        return True  # per outer point: fits either kind
    n = len(kernel.outer)
    col = _column(store, n, len(inner))
    return all(
        col == _column(s, n, len(st.inner)) for st in kernel.stages if st.inner for s in st.stores
    )


def _column(store: Store, n_outer: int, n_inner: int) -> bool:
    """``store`` reduces along a strided inner loop, reading the last outer loop contiguously."""
    if store.reduce is None or not n_outer or not n_inner:
        return False
    xk, yk, column = X[n_outer - 1], Y[n_inner - 1], False
    for e in walk(store.body):
        if e.op is Op.LOAD and yk in e.arg[1].free_symbols:
            if e.args or (e.arg[1].coeff(yk) == 1 and xk in e.arg[1].free_symbols):
                return False  # (a per-row value, the same for every column, does not count)
            column |= e.arg[1].coeff(xk) == 1
    return column


def _late_host(
    node: Pointwise | Reduction, steps: list[_Open | Extern], made: dict[str, int]
) -> _Open | None:
    """The kernel that computed the last of ``node``'s inputs, if no extern since mutates."""
    last = max((made[b] for b in reads(node) if b in made), default=None)
    if last is None or not isinstance(steps[last], _Open):
        return None
    if any(isinstance(s, Extern) and _mutates(s) for s in steps[last + 1 :]):
        return None
    host = steps[last]
    return host if isinstance(host, _Open) else None


def _siblings(
    prog: Program,
    node: Pointwise | Reduction,
    steps: list[_Open | Extern],
    made: dict[str, int],
    open_: _Open | None,
) -> Iterator[_Open]:
    """Earlier kernels, after the step that made the last of ``node``'s inputs, that read
    inputs of it at least as large as its result: ``node`` may run there, before the externs
    between (sibling fusion). A Llama MLP's backward computes the up projection's gradient,
    two matmuls, then the gate's gradient from the same three values; run beside the first,
    the second lets the three die before the matmuls (and reads them while they are in
    cache). A result larger than what it shares would only be made early (an attention mask
    :mod:`~ember.inductor.fills` makes anew for a later layer). None past a mutating extern."""
    inputs = reads(node)
    last = max((made[b] for b in inputs if b in made), default=-1)
    later = steps[last + 1 :]
    if _impure(node) or any(isinstance(s, Extern) and _mutates(s) for s in later):
        return
    hints = prog.size_vars.hints if prog.size_vars is not None else {}
    size = hint(math.prod(node.ranges), hints)
    for step in later:
        if isinstance(step, _Open) and step is not open_:
            shared = [prog.buffers[b] for b in inputs & _kernel_reads(step) if b in prog.buffers]
            if sum(buffer_bytes(b, hints) // b.dtype.itemsize for b in shared) >= size:
                yield step


def _kernel_reads(kernel: _Open) -> set[str]:
    return {
        e.arg[0]
        for stage in kernel.stages
        for store in stage.stores
        for e in walk(store.body)
        if e.op is Op.LOAD
    }


def _inner(node: Pointwise | Reduction, k: int) -> tuple[int, ...]:
    return node.ranges[k:] if isinstance(node, Pointwise) else node.reduce_ranges


def buffer_bytes(buf: Any, hints: dict[Any, int]) -> int:
    """A buffer's bytes at the example sizes (an extern's result may have torch's SymInts)."""
    extent = buf.layout.extent
    if isinstance(extent, torch.SymInt):
        extent = extent.node.expr
    return hint(extent * buf.dtype.itemsize, hints)


def schedule(
    prog: Program,
    updates: dict[int, int] | None = None,
    printer: str = "cpp",
    owned: frozenset[str] = frozenset(),
) -> Schedule:
    """Group ``prog`` into kernels and plan its memory; ``updates`` (output position -> input
    position) names outputs that are new values of inputs, which may be written in place;
    ``printer``: the code printer that will take the schedule (``"cpp"`` or ``"triton"``);
    ``owned``: inputs whose memory is freed at their last use (a boxed backward's saved
    values), which the memory plan counts as live until then."""
    prog = restage(prog)  # reductions across memory read a copy along their reduce loop
    if updates:  # a state update (optimizer step): each value's loop next to its readers'
        prog = demand_order(prog)
    if check.enabled():
        check.check(prog)
    sched = Schedule(prog, group(prog))
    from ember.inductor.memplan import plan_memory  # (memplan builds on this module's types)

    plan_memory(sched, updates, recomputes=printer == "triton", owned=owned)
    sched.steps = [_mark_locals(s, sched.locals) for s in sched.steps]
    return sched


def _mark_locals(step: Kernel | Extern, local: set[str]) -> Kernel | Extern:
    if isinstance(step, Extern):
        return step
    stages = tuple(
        dataclasses.replace(
            st, stores=tuple(dataclasses.replace(s, local=s.name in local) for s in st.stores)
        )
        for st in step.stages
    )
    return dataclasses.replace(step, stages=stages)
