"""The Python that runs a schedule: allocate buffers, call kernels and extern ops in order.

The wrapper is generated source, so a call does only the work the schedule
needs: no interpretation, no dictionary lookups. Everything it uses (kernel
functions, aten ops, constants) is bound as a global of the generated
function.

>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from ember.inductor.lowering import lower_graph
>>> from ember.inductor.scheduler import schedule
>>> gm = make_fx(lambda x, y: (x + y).relu())(torch.randn(4), torch.randn(4))
>>> sched = schedule(lower_graph(gm, [torch.randn(4), torch.randn(4)]))
>>> print(wrapper_source(sched, {"kernel0": ["x_1", "y_1", "buf0"]})[0])
def call(x_1, y_1):
    if _strides_differ((x_1, y_1), ((1,), (1,))):
        x_1, y_1 = _restride_all((x_1, y_1), ((4,), (4,)), ((1,), (1,)))
    buf0 = _empty((4,), (1,), dtype=_float32)
    _launch(kernel0, (x_1, y_1, buf0))
    return (buf0,)

The inputs' strides are checked and each C++ kernel is launched in one call for all of
its tensors (:mod:`ember.inductor.wrapper_launch`).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch

from ember.inductor.ir import Extern, Layout, Ref, Scalar, ScalarOp
from ember.inductor.memplan import EXTERN_IN_PLACE, may_alias
from ember.inductor.scheduler import Kernel, Schedule
from ember.inductor.symbolic import FloatSize, hint, is_static, pyexpr, pytuple

# The runtime half (binding the source to the kernels, and what the source calls) lives in
# wrapper_bind, which imports neither sympy nor the scheduler: a graph read back from the
# graph cache or a portable pack runs with that module alone. Re-exported here.
from ember.inductor.wrapper_bind import (  # noqa: F401 (the names wrapper tests and callers use)
    FAST_CALLS,
    _check_index,
    _check_span,
    _on_device,
    _restride,
    bind,
)

__all__ = ["bind", "wrapper_source"]


class _Source:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.consts: dict[str, Any] = {}

    def const(self, value: Any) -> str:
        if (
            value is None
            or isinstance(value, bool | int)
            or (isinstance(value, float) and value == value and abs(value) != float("inf"))
        ):
            return repr(value)
        for name, v in self.consts.items():
            if v is value:
                return name
        name = f"_c{len(self.consts)}"
        self.consts[name] = value
        return name


def _ref(sched: Schedule, ref: Ref, computed: set[str]) -> str:
    if ref.layout is None:
        return ref.name
    lay = ref.layout
    dims = _permutation(sched.program.buffers[ref.name].layout, lay)
    if dims is not None:  # a transpose costs 1.7 us, as_strided with its offset 2.7 us
        last_two = [*range(len(dims) - 2), len(dims) - 1, len(dims) - 2]
        return f"{ref.name}.mT" if dims == last_two else f"{ref.name}.permute{tuple(dims)}"
    offset = pyexpr(lay.offset)
    base = offset if ref.name in computed else f"{ref.name}.storage_offset() + {offset}"
    return f"_as_strided({ref.name}, {pytuple(lay.sizes)}, {pytuple(lay.strides)}, {base})"


def _permutation(base: Layout, view: Layout) -> list[int] | None:
    """``dims`` with ``view == base.permute(dims)``, if there are such."""
    if view.offset != base.offset or len(view.sizes) != len(base.sizes) or len(view.sizes) < 2:
        return None
    dims: list[int] = []
    for pair in zip(view.sizes, view.strides, strict=True):
        free = [
            d
            for d, p in enumerate(zip(base.sizes, base.strides, strict=True))
            if p == pair and d not in dims
        ]
        if not free:
            return None
        dims.append(free[0])
    return dims


def _arg(src: _Source, sched: Schedule, tree: Any, computed: set[str]) -> str:
    if isinstance(tree, Ref):
        return _ref(sched, tree, computed)
    if isinstance(tree, list | tuple):
        inner = ", ".join(_arg(src, sched, t, computed) for t in tree)
        return (
            f"[{inner}]" if isinstance(tree, list) else f"({inner}{',' if len(tree) == 1 else ''})"
        )
    return _size_or_const(src, tree)


def _size_or_const(src: _Source, leaf: Any) -> str:
    """A number leaf: a run-time number, a symbolic size (from the call's size variables,
    ``float()`` of one), or a constant."""
    if isinstance(leaf, Scalar):
        return leaf.name
    if isinstance(leaf, sympy.Basic):
        return pyexpr(leaf)
    if isinstance(leaf, FloatSize):
        return f"float({pyexpr(leaf.size)})"
    return src.const(leaf)


def wrapper_source(
    sched: Schedule, kernel_args: dict[str, list[str]], tensors: bool = False, boxed: bool = False
) -> tuple[str, dict[str, Any]]:
    """The source of ``call(*inputs)`` and the globals it needs (besides kernels).
    ``tensors``: kernels take tensors (Triton launchers), not data pointers (C++).
    ``boxed``: the body is ``call_boxed(args)``, which empties the list ``args`` and deletes
    each input after its last use (a backward graph's saved activations are then freed as
    it goes: :data:`ember.aotgraph.compiler_hook.CALLED_BOXED`); ``call`` boxes its inputs."""
    prog, src = sched.program, _Source()
    kernel_reads = _kernel_reads(sched, kernel_args)
    if boxed:
        unpack = "".join(f"{n}, " for n in prog.inputs)
        src.lines += ["def call_boxed(_args):", f"    {unpack}= _args", "    _args.clear()"]
    else:
        src.lines.append(f"def call({', '.join(prog.inputs)}):")
    src.consts.update(prog.constants)
    if prog.size_vars is not None:  # the size symbols, read off this call's inputs
        src.lines += _bind_sizes(prog)
    src.lines += _input_checks(prog, [n for n in prog.inputs if n in kernel_reads])
    for op in prog.scalar_ops:
        src.lines.append(f"    {op.out.name} = {_number(src, op)}")
    for c in prog.index_checks:
        size, wraps = pyexpr(c.size), ", True" if c.wraps else ""
        if c.span is not None:
            lo, hi = (pyexpr(e) for e in c.span)
            call, what = "_check_span", f"{lo}, {hi}"
        else:
            call, what = "_check_index", c.name
        src.lines.append(f"    {call}({what}, {size}, {c.error!r}, {c.message!r}{wraps})")
    pooled = _pooled(sched)
    key = _pool_key(sched, pooled)
    src.lines += _take_lines(pooled, key)
    computed: set[str] = set(pooled)
    # extern results a kernel reads, or whose memory a kernel's output takes, in the layout
    # the kernels were generated for
    restride = kernel_reads | set(sched.reuse.values())
    drops = _drops(sched, set(pooled) | set(prog.inputs) | set(prog.constants))
    for k, step in enumerate(sched.steps):
        if isinstance(step, Kernel):
            _kernel_call(src, sched, step, kernel_args[step.name], computed, tensors)
        else:
            _extern_call(src, sched, step, restride, computed)
        dead = drops.get(k, [])
        if dead:
            src.lines.append(f"    del {', '.join(dead)}")
    outs = [_arg(src, sched, o, computed) for o in prog.outputs]
    if key:
        src.lines.append("    if _bufs[0] is not None: _pool.append(_bufs)")
    elif pooled:
        src.lines.append("    _pool.append(_bufs)")
    src.lines.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    if boxed:
        src.lines = _drop_inputs(src.lines, prog.inputs)
        src.lines += ["", "def call(*_args):", "    return call_boxed(list(_args))"]
    if key:
        src.lines += ["", *_alloc_sized(src, sched, pooled, key)]
    elif pooled:
        src.lines += ["", "def _alloc():", f"    return ({', '.join(_alloc(src, sched, pooled))},)"]
    return "\n".join(src.lines), src.consts


def _drop_inputs(lines: list[str], inputs: Sequence[str]) -> list[str]:
    """``lines`` (a boxed wrapper's body) with ``del name`` after the last line naming each
    input, where that line is a statement of the body itself (not inside a block, not the
    return): the list the inputs came in is emptied, so this drops the last reference."""
    drops: dict[int, list[str]] = {}
    for name in inputs:
        pattern = re.compile(rf"\b{re.escape(name)}\b")
        last = max((k for k, line in enumerate(lines) if pattern.search(line)), default=None)
        if last is None or last + 1 >= len(lines):
            continue
        line, after = lines[last], lines[last + 1]
        top = line.startswith("    ") and not line.startswith("     ")
        if top and not line.rstrip().endswith(":") and not after.startswith("     "):
            if not line.lstrip().startswith("return"):
                drops.setdefault(last, []).append(name)
    out: list[str] = []
    for k, line in enumerate(lines):
        out.append(line)
        if k in drops:
            out.append(f"    del {', '.join(drops[k])}")
    return out


def _input_checks(prog: Any, names: list[str]) -> list[str]:
    """Lines checking that the inputs ``names`` have the strides the kernels were generated
    for, and copying those that have not into that layout. Two or more: one call for all
    (:mod:`ember.inductor.wrapper_launch`), not a ``stride()`` per input."""
    names = [n for n in names if n in prog.buffers]
    layouts = [prog.buffers[n].layout for n in names]
    if len(names) < 2:
        return [
            f"    if {n}.stride() != {pytuple(lay.strides)}: "
            f"{n} = _restride({n}, {pytuple(lay.sizes)}, {pytuple(lay.strides)})"
            for n, lay in zip(names, layouts, strict=True)
        ]
    tensors = f"({', '.join(names)})"
    strides = f"({', '.join(pytuple(lay.strides) for lay in layouts)})"
    sizes = f"({', '.join(pytuple(lay.sizes) for lay in layouts)})"
    return [
        f"    if _strides_differ({tensors}, {strides}):",
        f"        {tensors[1:-1]} = _restride_all({tensors}, {sizes}, {strides})",
    ]


def _kernel_reads(sched: Schedule, kernel_args: dict[str, list[str]]) -> set[str]:
    """Inputs and extern results whose strides the wrapper checks against the layout the
    kernels were generated for (and copies into it when they differ)."""
    prog = sched.program
    kernel_reads = {n for s in sched.steps if isinstance(s, Kernel) for n in kernel_args[s.name]}
    # inputs the kernels write into (``updates``): a copy, if other strides; the caller then
    # copies the value back as it does for any other output
    kernel_reads |= set(sched.updates.values())
    if prog.size_vars is not None:
        # symbolic sizes: values are realized compact, not with eager's strides, so an extern
        # result may not have the strides its fake value shows; every input and extern result
        # is checked against the layout the kernels and windows (as_strided) assume
        kernel_reads |= {n for n in prog.inputs if not _static_input(prog, n)}
        kernel_reads |= {n for s in sched.steps if isinstance(s, Extern) for n in s.names}
    return kernel_reads


def _take_lines(pooled: list[str], key: str) -> list[str]:
    """The wrapper's lines taking the pooled buffers: a set from the pool, or a fresh one
    (a set of another size, ``key``, is dropped: the pool holds one per thread at most)."""
    if key:
        return [
            f"    _key = {key}",
            "    _bufs = _take(_pool)",
            "    if _bufs is None or _bufs[0] != _key: _bufs = _alloc(*_key)",
            f"    _, {', '.join(pooled)}, = _bufs",
        ]
    if pooled:
        return ["    _bufs = _take(_pool) or _alloc()", f"    {', '.join(pooled)}, = _bufs"]
    return []


def _pool_key(sched: Schedule, pooled: list[str]) -> str:
    """The size variables the pooled buffers' layouts use, as a Python tuple (a pool set
    serves calls of these sizes only), or "" when the layouts are static."""
    syms: set[Any] = set()
    for name in pooled:
        lay = sched.program.buffers[name].layout
        syms |= set().union(*(sympy.sympify(n).free_symbols for n in (*lay.sizes, *lay.strides)))
    names = sorted(str(s) for s in syms)
    return f"({', '.join(names)},)" if names else ""


def _alloc_sized(src: _Source, sched: Schedule, pooled: list[str], key: str) -> list[str]:
    """``_alloc(*sizes)``: a set of the pooled buffers for these sizes, keyed by them, or by
    None when the set is larger than POOL_MAX_BYTES (used for one call, never kept)."""
    total = sum(
        sched.program.buffers[n].layout.extent * sched.program.buffers[n].dtype.itemsize
        for n in pooled
    )
    return [
        f"def _alloc{key}:",
        f"    _key = {key} if {pyexpr(sympy.expand(total))} <= {POOL_MAX_BYTES} else None",
        f"    return (_key, {', '.join(_alloc(src, sched, pooled))},)",
    ]


def _bind_sizes(prog: Any) -> list[str]:
    """Lines reading the size symbols off the call's inputs, then checking every other input
    size against what the trace knew of it (``y.size(0) == x.size(1)``): a call breaking
    such a relation raises rather than running kernels past the end of a buffer."""
    lines, bound = [], {}
    for sym, (name, kind, d) in prog.size_vars.sources.items():
        read = name if kind == "int" else f"{name}.{kind}({d})"
        lines.append(f"    {sym} = {read}")
        bound[(name, kind, d)] = sym
    checks = {(f"{n}.size({d})", bound.get((n, "size", d)), size)  # (read, symbol, size)
              for n in prog.inputs if not _static_input(prog, n)
              for d, size in enumerate(prog.buffers[n].layout.sizes)}  # fmt: skip
    checks |= {(n, bound.get((n, "int", 0)), size) for n, size in prog.size_vars.int_inputs.items()}
    for read, sym, size in sorted(checks, key=str):
        if sym is None or sym != size:  # a size the trace tied to another input's
            want = pyexpr(size)
            lines.append(
                f"    if {read} != {want}: raise ValueError("
                f"f'{read} is {{{read}}}, compiled for {want} = {{{want}}}')"
            )
    return lines


def _static_input(prog: Any, name: str) -> bool:
    """A tensor input of static sizes and strides (guarded by the caller, as in a static
    graph), or a number input."""
    buf = prog.buffers.get(name)
    return buf is None or is_static((buf.layout.sizes, buf.layout.strides))


def _drops(sched: Schedule, keep: set[str]) -> dict[int, list[str]]:
    """Step -> variables the wrapper deletes after it: dead buffers, once the last buffer
    taking their memory (``buf5 = buf2``) has it, so that memory goes back as soon as the
    last of them dies."""
    given: dict[str, int] = {}  # donor -> the step of its last taker
    for k, step in enumerate(sched.steps):
        for st in step.stages if isinstance(step, Kernel) else ():
            for s in st.stores:
                if s.name in sched.reuse:
                    given[sched.reuse[s.name]] = k
    out: dict[int, list[str]] = {}
    for k, names in sched.frees.items():
        for name in names:
            if name not in keep:
                out.setdefault(max(k, given.get(name, k)), []).append(name)
    return out


# The most a compiled graph allocates in kernel outputs for a pool to be kept between calls.
# A pool is resident all the time, so it adds to the steady-state peak (hf-gpt2's training
# step: 1.7 MiB of 5.7 at 16 MiB a graph, against torch inductor's 2.9 MiB; at 64 KiB a
# graph, still 0.06-0.13 MiB of hf-bert's and hf-vit's 0.1 MiB excess), and the allocations
# it saves did not show in the real models' step times (hf-gpt2/t5 training and inference,
# hf-vit inference: the same within noise with no pool). Only small graphs, where 2 us an
# allocation weighs most, keep one.
POOL_MAX_BYTES = 64 << 10


def _pooled(sched: Schedule) -> list[str]:
    """Buffers a call allocates for itself only (read by kernels and non-aliasing externs,
    never returned, nor sharing memory with what is): the wrapper takes them from a pool of
    earlier calls' sets (``list.pop``/``append``: threads each get their own) instead of
    allocating them each call (2 us apiece)."""
    prog = sched.program

    def root(name: str) -> str:
        while name in sched.reuse:
            name = sched.reuse[name]
        return name

    hints = prog.size_vars.hints if prog.size_vars is not None else {}
    made = [prog.buffers[n] for step in sched.steps for n in _allocated(step, sched)]
    if sum(hint(b.layout.extent * b.dtype.itemsize, hints) for b in made) > POOL_MAX_BYTES:
        return []  # a graph that large computes for far longer than its allocations take
    escaping = {o.name for o in prog.outputs if isinstance(o, Ref)}
    for step in sched.steps:
        if isinstance(step, Extern) and may_alias(step):
            escaping |= {r.name for r in step.refs()}
    escaping = {root(n) for n in escaping} | {root(n) for n in sched.reuse if root(n) in escaping}
    out, size = [], 0
    for step in sched.steps:
        for name in _allocated(step, sched):
            buf = prog.buffers[name]
            # a symbolic size: its bytes at the example sizes (the set's real size is checked
            # per size, in ``_alloc``)
            nbytes = hint(buf.layout.extent * buf.dtype.itemsize, hints)
            if name not in escaping and size + nbytes <= POOL_MAX_BYTES:
                out.append(name)
                size += nbytes
    return out


def _allocated(step: Kernel | Extern, sched: Schedule) -> list[str]:
    """Buffers the wrapper allocates for ``step`` (kernel outputs in memory, not reusing)."""
    if isinstance(step, Extern):
        return []
    names = [s.name for st in step.stages for s in st.stores if not s.local]
    return [n for n in dict.fromkeys(names) if n not in sched.reuse]


def _alloc(src: _Source, sched: Schedule, names: list[str]) -> list[str]:
    out = []
    for name in names:
        lay, dtype = sched.program.buffers[name].layout, sched.program.buffers[name].dtype
        shape, strides = pytuple(lay.sizes), pytuple(lay.strides)
        out.append(f"_empty({shape}, {strides}, dtype={_dtype_name(dtype, src)})")
    return out


def _kernel_call(
    src: _Source,
    sched: Schedule,
    kernel: Kernel,
    args: list[str],
    computed: set[str],
    tensors: bool = False,
) -> None:
    for st in kernel.stages:
        for store in st.stores:
            if store.local or store.name in computed:
                continue
            computed.add(store.name)
            donor = sched.reuse.get(store.name)
            if donor is not None:
                src.lines.append(f"    {store.name} = {donor}")
                continue
            buf = sched.program.buffers[store.name]
            src.lines.append(
                f"    {store.name} = _empty({pytuple(buf.layout.sizes)}, "
                f"{pytuple(buf.layout.strides)}, dtype={_dtype_name(buf.dtype, src)})"
            )
    if tensors:  # a Triton launcher takes the tensors and numbers
        src.lines.append(f"    {kernel.name}({', '.join(a.split(':')[0] for a in args)})")
        return
    # a C++ kernel: its buffers' data pointers, then its numbers (sizes, scalars), through
    # one ``_launch`` call (wrapper_launch)
    buffers = [a for a in args if ":" not in a]
    numbers = [a.split(":")[0] for a in args if ":" in a]
    assert args == buffers + [a for a in args if ":" in a], args  # buffers first
    pointers = f"({', '.join(buffers)}{',' if len(buffers) == 1 else ''})"
    src.lines.append(f"    _launch({', '.join([kernel.name, pointers, *numbers])})")


# Python arithmetic on numbers, written out in the wrapper rather than called
NUMBER_OPS: dict[Any, str] = {
    operator.add: "({0} + {1})",
    operator.sub: "({0} - {1})",
    operator.mul: "({0} * {1})",
    operator.truediv: "({0} / {1})",
    operator.neg: "(-{0})",
    operator.abs: "abs({0})",
    abs: "abs({0})",
    max: "max({all})",
    min: "min({all})",
}


def _number(src: _Source, op: ScalarOp) -> str:
    """``op`` as a Python expression over the wrapper's variables."""
    args = [_size_or_const(src, a) for a in op.args]
    fmt = NUMBER_OPS.get(op.target)
    if fmt is not None:
        return fmt.format(*args, all=", ".join(args))
    return f"{src.const(op.target)}({', '.join(args)})"


def _dtype_name(dtype: torch.dtype, src: _Source) -> str:
    name = "_" + str(dtype).removeprefix("torch.")
    src.consts[name] = dtype
    return name


def _extern_call(
    src: _Source, sched: Schedule, step: Extern, restride: set[str], computed: set[str]
) -> None:
    fast = FAST_CALLS.get(step.target) if set(step.kwargs) <= {"beta", "alpha"} else None
    if step.names[0] in sched.inplace:  # its ``self`` dies here: written in place
        fast = EXTERN_IN_PLACE[step.target]
    target = src.const(step.target if fast is None else fast)
    args = _arg(src, sched, list(step.args), computed)[1:-1]
    kwargs = ", ".join(f"{n}={_arg(src, sched, v, computed)}" for n, v in step.kwargs.items())
    call = f"{target}({', '.join(a for a in (args, kwargs) if a)})"
    if len(step.names) == 1 and _single(step):
        src.lines.append(f"    {step.names[0]} = {call}")
    else:
        src.lines.append(
            f"    {', '.join(step.names)}{',' if len(step.names) == 1 else ''} = _leaves({call})"
        )
    for name in step.names:
        if name in restride:
            lay = sched.program.buffers[name].layout
            src.lines.append(
                f"    if {name}.stride() != {pytuple(lay.strides)}: "
                f"{name} = _restride({name}, {pytuple(lay.sizes)}, {pytuple(lay.strides)})"
            )


def _single(step: Extern) -> bool:
    schema = getattr(step.target, "_schema", None)
    return (
        schema is not None and len(schema.returns) == 1 and str(schema.returns[0].type) == "Tensor"
    )
