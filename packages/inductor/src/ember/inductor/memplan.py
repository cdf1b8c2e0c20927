"""The memory plan of a :class:`~ember.inductor.scheduler.Schedule`: which buffers never
reach memory, which outputs are written in place over a buffer read for the last time or
into a mutated input's memory, which take a dead buffer's memory, and where each buffer is
freed.

:func:`plan_memory` is the pass; :func:`~ember.inductor.scheduler.schedule` runs it after
grouping. Its rules, each with the workload that asked for it, are in docs/inductor.md
("Memory").

Each kernel below writes its result over the matmul's it reads for the last time, element
by element (``in place:``): five results in three buffers.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from ember.inductor.lowering import lower_graph
>>> from ember.inductor.scheduler import schedule
>>> x, w = torch.randn(4, 8), torch.randn(8, 8)
>>> gm = make_fx(lambda x, w: ((x.exp() @ w).sin() @ w).tanh())(x, w)
>>> print(schedule(lower_graph(gm, [x, w])))
kernel0 over [4]
  stage [8]: buf0[8*x0 + y0] = EXP(x_1[8*x0 + y0])
buf1 = extern aten.mm.default(buf0, w_1)
kernel1 over [4]
  stage [8]: buf2[8*x0 + y0] = SIN(buf1[8*x0 + y0])
buf3 = extern aten.mm.default(buf2, w_1)
kernel2 over [4]
  stage [8]: buf4[8*x0 + y0] = TANH(buf3[8*x0 + y0])
in place: buf2<-buf1, buf4<-buf3
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ember.inductor.ir import Expr, Extern, Layout, Program, Ref, walk
from ember.inductor.ops import Op
from ember.inductor.scheduler import Kernel, Schedule, Stage, buffer_bytes, output_names, reads

__all__ = ["EXTERN_IN_PLACE", "may_alias", "plan_memory", "write_into_inputs"]

SCRATCH_MAX = 8192  # elements of a per-row scratch array (on the stack)


def _kernel_locals(prog: Program, steps: list[Kernel | Extern]) -> tuple[set[str], set[str]]:
    """Buffers that never reach memory: variables (read only in the stage that writes them,
    or per outer point) and per-row scratch arrays (pointwise, read only in their kernel)."""
    readers: dict[str, set[int]] = {}
    stage_of: dict[str, tuple[int, int]] = {}
    for k, step in enumerate(steps):
        stages = step.stages if isinstance(step, Kernel) else ()
        for s, st in enumerate(stages):
            for store in st.stores:
                stage_of[store.name] = (k, s)
                for e in walk(store.body):
                    if e.op is Op.LOAD:
                        readers.setdefault(e.arg[0], set()).add(k * 1000 + s)
        if isinstance(step, Extern):
            for name in reads(step):
                readers.setdefault(name, set()).add(-1)
    out = output_names(prog)
    local, scratch = set(), set()
    for name, (k, s) in stage_of.items():
        kernel = steps[k]
        assert isinstance(kernel, Kernel)
        store = next(x for x in kernel.stages[s].stores if x.name == name)
        who = readers.get(name, set())
        if name in out or -1 in who:
            continue
        if store.reduce is not None or math.prod(kernel.stages[s].inner) == 1:
            ok = all(r // 1000 == k for r in who)
        else:
            ok = who <= {k * 1000 + s}
        if ok:
            local.add(name)
        elif all(r // 1000 == k for r in who) and kernel.outer:
            size = math.prod(kernel.stages[s].inner)  # a symbolic size: not on the stack
            if isinstance(size, int) and size <= SCRATCH_MAX:
                local.add(name)
                scratch.add(name)
    return local, scratch


def plan_memory(
    sched: Schedule,
    updates: dict[int, int] | None = None,
    recomputes: bool = False,
    owned: frozenset[str] = frozenset(),
) -> None:
    """Mark local buffers; let a kernel's output take the memory of a dead buffer of the same
    dtype and layout: one that died before the kernel (kernel outputs, and results of externs
    that return fresh tensors), or one the kernel reads for the last time, element by element
    where it writes (:func:`_in_place`). Graph inputs, constants, outputs and whatever an
    aliasing extern reads or returns keep their memory, except that the new value of a
    mutated input (``updates``: output position -> input position) may be written into the
    input's memory (:func:`write_into_inputs`). ``recomputes``: the printer recomputes a
    value where a later stage of its kernel reads it (Triton's), so no store that a later
    stage reads may go over one of its operands. ``owned``: inputs the wrapper's frees release
    (:func:`schedule`), part of the timeline that decides where memory may be held.

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> from ember.inductor.lowering import lower_graph
    >>> from ember.inductor.scheduler import schedule
    >>> x, w = torch.randn(4, 8), torch.randn(8, 8)
    >>> gm = make_fx(lambda x, w: (x @ w).relu() * 2)(x, w)
    >>> print(schedule(lower_graph(gm, [x, w])))
    buf0 = extern aten.mm.default(x_1, w_1)
    kernel0 over [4]
      stage [8]: buf1[8*x0 + y0] = MUL(MAX(buf0[8*x0 + y0], 0.0), 2.0)
    in place: buf1<-buf0
    """
    prog = sched.program
    sched.locals, sched.scratch = _kernel_locals(prog, sched.steps)
    write_into_inputs(sched, updates or {})
    outputs = output_names(prog)
    last_use: dict[str, int] = {}
    pinned = set(prog.inputs) | set(prog.constants) | outputs
    for k, step in enumerate(sched.steps):
        for name in _step_reads(step):
            last_use[name] = k
        if isinstance(step, Extern) and may_alias(step):
            pinned |= set(step.names) | reads(step)
    for k, step in enumerate(sched.steps):  # extern results nobody reads die where made
        if isinstance(step, Extern):
            last_use.update((n, k) for n in step.names if n not in last_use)
    kept = set(prog.inputs) | set(prog.constants) | outputs | sched.locals
    timeline = _Timeline.of(sched, last_use, outputs, owned)
    # a dry run finds the in-place writes (they take no memory of their own: the timeline
    # counted them twice, and so let memory be held across what looked below the peak),
    # then the real run gives dead buffers' memory to later outputs
    before = dict(sched.inplace), dict(sched.reuse)
    _assign(sched, last_use, kept, pinned, _Timeline([], 0), recomputes)
    timeline.in_place(sched, before[0])
    sched.inplace, sched.reuse, sched.frees = dict(before[0]), dict(before[1]), {}
    _assign(sched, last_use, kept, pinned, timeline, recomputes)


def _assign(
    sched: Schedule,
    last_use: dict[str, int],
    kept: set[str],
    pinned: set[str],
    timeline: _Timeline,
    recomputes: bool,
) -> None:
    """:func:`plan_memory`'s walk over the steps: frees, in-place writes and reuse."""
    prog, outputs = sched.program, output_names(sched.program)
    free: dict[tuple[Any, ...], list[str]] = {}
    died: dict[str, int] = {}  # a free buffer -> the step after which it died
    for k, step in enumerate(sched.steps):
        # every name goes out of the wrapper after its last use; only an unpinned one's
        # memory is free for a later kernel (a pinned one may live on through its aliases)
        gone = [n for n, last in last_use.items() if last == k and n not in kept]
        dead = [n for n in gone if n not in pinned]
        if isinstance(step, Kernel):
            mine = {s.name for st in step.stages for s in st.stores}
            donors = [n for n in dead if n not in mine]
            for st in step.stages:
                for pos in range(len(st.stores)):
                    hold = functools.partial(timeline.hold, died, k)
                    _place(sched, step, st, pos, donors, free, pinned - outputs, hold, recomputes)
        elif (into := _extern_in_place(prog, step, dead)) is not None:
            sched.inplace[step.names[0]] = sched.reuse[step.names[0]] = into
        sched.frees[k] = gone
        taken = set(sched.inplace.values())
        for name in dead:
            if name not in taken:
                buf = prog.buffers[name]
                free.setdefault((buf.dtype, buf.layout), []).append(root := _root(sched, name))
                died[root] = k


@dataclass
class _Timeline:
    """The bytes each step has live with no memory taken from dead buffers, and the peak.

    A kernel output taking a dead buffer's memory (``buf9 = buf4``) saves an allocation but
    keeps that memory from the donor's death to the taker's step: between them it must not
    raise the graph's peak. In hf-llama inference each layer's key and value buffers were
    held for the next layer's, across the MLP's two 256 KiB products, the peak (0.86 MiB
    against torch inductor's 0.75). A backward graph's saved values count until their last
    use: without them its peak seemed to be at the end, where the weight gradients pile up,
    and a layer's buffer was held for the next layer's through the real peak, where the
    first layer's saved values are still live (hf-llama's training step)."""

    live: list[int]
    peak: int

    @staticmethod
    def of(
        sched: Schedule, last_use: dict[str, int], outputs: set[str], owned: frozenset[str]
    ) -> _Timeline:
        prog, steps = sched.program, sched.steps
        hints = _hints(sched)
        live = [0] * len(steps)
        for name in owned & last_use.keys():  # (the rest of the inputs: the same at every step)
            nbytes = buffer_bytes(prog.buffers[name], hints)
            for j in range(last_use[name] + 1):
                live[j] += nbytes
        for k, step in enumerate(steps):
            if isinstance(step, Extern):
                made = [] if may_alias(step) else list(step.names)
            else:
                made = [x.name for st in step.stages for x in st.stores]
                made = [n for n in dict.fromkeys(made) if n not in sched.locals]
            for name in made:
                nbytes = buffer_bytes(prog.buffers[name], hints)
                end = len(steps) - 1 if name in outputs else last_use.get(name, k)
                for j in range(k, end + 1):
                    live[j] += nbytes
        return _Timeline(live, max(live, default=0))

    def in_place(self, sched: Schedule, earlier: dict[str, str]) -> None:
        """Count once each output written in place (``sched.inplace``, less ``earlier``:
        outputs written into inputs, which the timeline never counted twice)."""
        hints = _hints(sched)
        for k, step in enumerate(sched.steps):
            names = (
                step.names
                if isinstance(step, Extern)
                else [x.name for st in step.stages for x in st.stores]
            )
            for name in names:
                if name in sched.inplace and name not in earlier:
                    self.live[k] -= buffer_bytes(sched.program.buffers[name], hints)
        self.peak = max(self.live, default=0)

    def hold(self, died: dict[str, int], k: int, donor: str, nbytes: int) -> bool:
        """Whether ``donor``'s memory may be kept from its death for step ``k``'s output
        (then counted as held): only where that does not raise the peak."""
        if not self.live:
            return False  # (the dry run: no memory is held)
        span = range(died.get(donor, k - 1) + 1, k)
        if any(self.live[j] + nbytes > self.peak for j in span):
            return False
        for j in span:
            self.live[j] += nbytes
        return True


def write_into_inputs(sched: Schedule, updates: dict[int, int]) -> None:
    """Let the kernel computing the new value of a mutated input store it straight into the
    input's memory (``sched.updates``; the wrapper returns the input itself, and
    ``ember.aotgraph``'s runtime skips its copy) where no step sees the difference: the
    value is a kernel's store of the input's dtype and dense layout, returned once and
    never as a view; no step after that kernel reads the input, and inside it every read is
    at the point written, before the write (:func:`_in_place`); the input is not returned,
    nor read by an extern whose result may alias it.

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> from ember.inductor.lowering import lower_graph
    >>> from ember.inductor.scheduler import schedule
    >>> x, g = torch.randn(8), torch.randn(8)
    >>> gm = make_fx(lambda x, g: (x - 0.1 * g,))(x, g)
    >>> print(schedule(lower_graph(gm, [x, g]), updates={0: 0}))
    kernel0 over []
      stage [8]: buf0[y0] = SUB(x_1[y0], MUL(g_1[y0], 0.1))
    into inputs: buf0->x_1
    """
    where: dict[str, tuple[int, Stage, int]] = {}  # store -> (step, stage, position)
    read_at: dict[str, set[int]] = {}  # buffer -> steps reading it
    for k, step in enumerate(sched.steps):
        for name in _step_reads(step):
            read_at.setdefault(name, set()).add(k)
        for st in step.stages if isinstance(step, Kernel) else ():
            where |= {x.name: (k, st, pos) for pos, x in enumerate(st.stores)}
    prog = sched.program
    for k, i in sorted(updates.items()):
        out = prog.outputs[k] if 0 <= k < len(prog.outputs) else None
        inp = prog.inputs[i] if 0 <= i < len(prog.inputs) else ""
        if not isinstance(out, Ref) or out.layout is not None or out.name not in where:
            continue  # not a kernel's store (a view, an input, an extern's result)
        if _may_write(sched, out.name, inp, where[out.name], read_at.get(inp, set())):
            sched.updates[out.name] = sched.reuse[out.name] = inp


def _may_write(
    sched: Schedule, name: str, inp: str, at: tuple[int, Stage, int], read_at: set[int]
) -> bool:
    """Whether store ``name`` (at step, stage, position ``at``) may go into input ``inp``'s
    memory (see :func:`write_into_inputs`); ``read_at``: the steps reading ``inp``."""
    prog, (step, stage, pos) = sched.program, at
    returned = [o.name for o in prog.outputs if isinstance(o, Ref)]
    aliased = {n for x in sched.steps if isinstance(x, Extern) and may_alias(x) for n in reads(x)}
    if returned.count(name) != 1 or name in sched.reuse or name in sched.locals:
        return False  # returned twice (saved for backward too), or placed already
    if inp not in prog.buffers or inp in aliased or inp in returned:
        return False  # a number, or its old value may be seen through another tensor
    if inp in sched.updates.values():
        return False
    mine, theirs = prog.buffers[name], prog.buffers[inp]
    if (mine.dtype, mine.layout) != (theirs.dtype, theirs.layout) or not _dense(mine.layout):
        return False
    kernel = sched.steps[step]
    assert isinstance(kernel, Kernel)
    if any(r > step for r in read_at):
        return False  # read after this kernel: its old value is still needed
    return step not in read_at or _in_place(kernel, stage, pos, inp)


def _dense(lay: Layout) -> bool:
    """Static sizes and strides that cover each element of one block of memory exactly once
    (a write into it reaches no element twice and leaves none out)."""
    dims = [(st, n) for n, st in zip(lay.sizes, lay.strides, strict=True) if n != 1]
    if not all(isinstance(v, int) for d in dims for v in d):
        return False
    step = 1
    for stride, n in sorted(dims):
        if stride != step:
            return False
        step *= n
    return True


def _place(
    sched: Schedule,
    kernel: Kernel,
    stage: Stage,
    pos: int,
    dying: list[str],
    free: dict[tuple[Any, ...], list[str]],
    fixed: set[str],
    hold: Callable[[str, int], bool] = lambda donor, nbytes: True,
    recomputes: bool = False,
) -> None:
    """Give ``stage.stores[pos]`` the memory of a buffer dying in ``kernel`` (in place) or of
    a dead one from ``free``, if one has its dtype and layout (and ``hold(donor, bytes)``
    allows keeping it until now)."""
    name = stage.stores[pos].name
    if name in sched.locals or name in fixed or name in sched.reuse:
        return
    buf = sched.program.buffers[name]
    # not over an operand of a store a later stage reads, where the printer recomputes the
    # store there from its operands (Triton's inlines values across stages)
    later = kernel.stages[kernel.stages.index(stage) + 1 :]
    if recomputes and any(e.arg[0] == name for st in later for e in _loads(st)):
        dying = []
    for donor in dying:
        same = sched.program.buffers[donor]
        if (same.dtype, same.layout) != (buf.dtype, buf.layout) or donor in sched.inplace.values():
            continue
        if _in_place(kernel, stage, pos, donor, earlier_stages=not recomputes):
            sched.inplace[name] = donor
            sched.reuse[name] = _root(sched, donor)
            return
    pool = free.get((buf.dtype, buf.layout))
    if pool and not _reads_in(kernel, pool[-1]):
        if hold(pool[-1], buffer_bytes(buf, _hints(sched))):
            sched.reuse[name] = pool.pop()


def _hints(sched: Schedule) -> dict[Any, int]:
    size_vars = sched.program.size_vars
    return size_vars.hints if size_vars is not None else {}


def _in_place(
    kernel: Kernel, stage: Stage, pos: int, donor: str, earlier_stages: bool = True
) -> bool:
    """``stage.stores[pos]`` may write over ``donor``: every read of ``donor`` in the kernel
    is in this (pointwise) stage, by this store or one before it, or in an earlier pointwise
    stage over the same inner loop (``earlier_stages``), at the index this store writes.
    Each point then reads the element before writing it and no point touches another's, in
    scalar loops, vector loops (a vector is loaded before it is stored) and across threads
    alike (an outer point runs its stages in order). A reduction's result, or a read at a
    shifted or broadcast index (``x[1:] + x[:-1]``), would see elements already overwritten.
    A Llama MLP's backward reads the activation's gradient for the up projection's gradient,
    then, two stages on, writes the gate's over it."""
    if stage.is_reduction:
        return False
    index, at = stage.stores[pos].index, kernel.stages.index(stage)
    for k, st in enumerate(kernel.stages):
        for j, s in enumerate(st.stores):
            for e in walk(s.body):
                if e.op is not Op.LOAD or e.arg[0] != donor:
                    continue
                if e.args or e.arg[1] != index:
                    return False
                before = earlier_stages and k < at and st.inner == stage.inner
                before = before and not st.is_reduction  # (tiled or split: other points)
                if not before and (st is not stage or j > pos):
                    return False
    return True


def _root(sched: Schedule, name: str) -> str:
    while name in sched.reuse:
        name = sched.reuse[name]
    return name


def _reads_in(kernel: Kernel, name: str) -> bool:
    return any(e.arg[0] == name for st in kernel.stages for e in _loads(st))


def _loads(stage: Stage) -> Iterator[Expr]:
    return (e for s in stage.stores for e in walk(s.body) if e.op is Op.LOAD)


def _step_reads(step: Kernel | Extern) -> set[str]:
    if isinstance(step, Extern):
        return reads(step)
    return {
        e.arg[0] for st in step.stages for s in st.stores for e in walk(s.body) if e.op is Op.LOAD
    }


# ops whose result shares its input's memory though their schema does not say so
ALIASING = {"aten::_unsafe_view"}

aten = torch.ops.aten

# functional externs (a copy of ``self`` with some elements written) and their in-place
# twins, with the same arguments: where ``self`` dies at the extern, the wrapper writes it in
# place rather than copying it (embedding's backward, ``zeros(...).index_put(...)``: a copy of
# the weight's size each training step)
EXTERN_IN_PLACE: dict[Any, Any] = {
    aten.index_put.default: aten.index_put_.default,
    aten.index_add.default: aten.index_add_.default,
    aten.scatter_add.default: aten.scatter_add_.default,
    aten.scatter.src: aten.scatter_.src,
    aten.scatter.value: aten.scatter_.value,
}


def _extern_in_place(prog: Program, step: Kernel | Extern, dead: list[str]) -> str | None:
    """The buffer an extern of :data:`EXTERN_IN_PLACE` may write in place: its ``self``,
    whole (no window of it), read for the last time here (``dead``: no input, constant,
    output or aliased buffer), by no other argument of the call, and laid out as the
    result."""
    if not isinstance(step, Extern) or step.target not in EXTERN_IN_PLACE or not step.args:
        return None
    first = step.args[0]
    if not isinstance(first, Ref) or first.layout is not None or len(step.names) != 1:
        return None
    if first.name not in dead or [r.name for r in step.refs()].count(first.name) != 1:
        return None
    mine, out = prog.buffers.get(first.name), prog.buffers.get(step.names[0])
    if mine is None or out is None or (mine.dtype, mine.layout) != (out.dtype, out.layout):
        return None
    return first.name


def may_alias(step: Extern) -> bool:
    """The extern's results may share memory with its arguments (or it mutates them)."""
    schema = getattr(step.target, "_schema", None)
    if schema is None or schema.name in ALIASING:
        return True
    return any(r.alias_info is not None for r in schema.returns) or schema.is_mutable
