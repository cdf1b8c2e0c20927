"""Translate one frame: symbolic execution into an FX graph, guards, and the output spec.

:func:`translate` is the pipeline, one named step per line. It raises
:class:`~ember.capture.tracer.Unsupported` (with the user's file and line)
when the frame cannot be captured as one graph; the caller then runs the
frame eagerly and records the reason (or, under ``fullgraph=True``, raises).
"""

from __future__ import annotations

import contextlib
import contextvars
import dis
import logging
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.autograd.grad_mode import _enter_inference_mode

from ember.capture import breaks, generators, guarding
from ember.capture.breaks import Layout
from ember.capture.builder import _trusted, is_constant
from ember.capture.codegen import (
    GradModeExit,
    ModeReentry,
    Part,
    inference_tensor,
    make_namedtuple,
    normal_tensor,
)
from ember.capture.hook import Frame, argument_names
from ember.capture.interpreter import run_frame
from ember.capture.pyrules import member_value
from ember.capture.shapes import Policy, Shapes
from ember.capture.timing import TIMES
from ember.capture.tracer import FrameState, Tracer, Unsupported, decode
from ember.capture.values import (
    EMPTY,
    NULL,
    CellV,
    Const,
    DictV,
    ExcV,
    FuncV,
    GenV,
    GradExitV,
    InstanceV,
    IterV,
    Lazy,
    ListV,
    MethodV,
    ModeExitV,
    ModuleV,
    ObjV,
    SetV,
    SymV,
    TensorV,
    TupleV,
    Value,
    ViewV,
)


@dataclass(frozen=True, slots=True)
class Translation:
    """What translating a frame produced, before a backend compiles the graph."""

    code: types.CodeType
    graph_module: torch.fx.GraphModule
    example_inputs: list[torch.Tensor]
    input_sources: list[Any]
    output: Part
    guards: guarding.GuardCollector
    ops: int
    seconds: float
    user_location: str = field(default="")
    layout: Layout | None = None  # set when translation stopped at a graph break
    effects: list[tuple[Any, ...]] = field(default_factory=list)  # see codegen.generate
    shapes: Shapes | None = None  # the symbolic sizes, when the graph has any

    def seal(self) -> None:
        """Add the shape guards, once, after the backend compiled the graph: a backend
        that traces with the graph's ShapeEnv (aotgraph) adds the conditions its own
        trace relied on, and they are guarded with the frame's."""
        if self.shapes is not None and (self.shapes.inputs or self.shapes.ints):
            self.shapes.guard(self.guards, guarding.SizeSources)


def translate(
    frame: Frame,
    backend_name: str,
    stop_at: int | None = None,
    guard_key: str | None = None,
    dynamic: bool | Policy | None = False,
) -> Translation:
    """Capture ``frame`` as one graph; :class:`Unsupported` if it cannot be.

    With ``stop_at`` (an instruction index, for a graph break) translation stops
    before that instruction, and the output is the stack and the bound locals there.
    The backend guard compares ``guard_key`` (default: ``backend_name``). ``dynamic``
    is the symbolic-size policy (a :class:`~ember.capture.shapes.Policy`, or its
    ``dynamic``).
    """
    with TIMES.timed("capture"), _quiet_meta_errors():  # timed for compile_times()
        return _translate(frame, backend_name, stop_at, guard_key, dynamic)


class _MetaErrorFilter(logging.Filter):
    """Drops fake tensors' "failed while attempting to run meta" tracebacks while this
    thread translates: an op that raises on fake tensors raises eagerly too, and ember then
    reports it (a fallback, or eager's own error), so torch's log is a second, alarming copy."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_TRANSLATING.get() and record.msg.startswith("failed while attempting"))


_TRANSLATING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "ember_translating", default=False
)
logging.getLogger("torch._subclasses.fake_tensor").addFilter(_MetaErrorFilter())


@contextlib.contextmanager
def _quiet_meta_errors() -> Iterator[None]:
    token = _TRANSLATING.set(True)
    try:
        yield
    finally:
        _TRANSLATING.reset(token)


def _translate(
    frame: Frame, backend_name: str, stop_at: int | None, guard_key: str | None, dynamic: Any
) -> Translation:
    start = time.perf_counter()
    shapes = Shapes(dynamic if isinstance(dynamic, Policy) else Policy(dynamic), frame.code)
    tracer = Tracer(backend_name=backend_name, shapes=shapes)
    shapes.data_dependent(tracer.fake_mode)  # .item() and nonzero symbolic, if asked
    fs = _top_frame(tracer, frame)  # arguments and free variables, wrapped lazily
    grad_mode = torch.is_grad_enabled()
    # A tensor subclass's __torch_function__ sees the torch calls eager makes, and those
    # only: not what tracing and guarding read of its tensors.
    no_handlers = torch._C.DisableTorchFunctionSubclass()
    try:
        no_handlers.__enter__()
        result = run_frame(fs, stop_at)  # symbolic execution of the bytecode
        generators.check_finished(tracer)  # none left with a finally the graph cannot run
        while tracer.modes:  # a break inside autocast, or a split block left (calls.
            token, exit_, _ = tracer.modes[-1]  # _leave_split_block): the graph leaves the
            tracer.exit_mode(exit_, token)  # mode; the replacement handles the real one
    finally:
        no_handlers.__exit__(None, None, None)
        tracer.leave_modes()  # autocast and inference-mode blocks entered while tracing
        torch._C._set_grad_enabled(grad_mode)  # with-blocks switch it while tracing
    tensors: list[torch.fx.Node] = []
    layout: Layout | None = None
    tracer.inference_outputs = torch.is_inference_mode_enabled() or any(
        node.target is _enter_inference_mode for node in tracer.graph.nodes
    )
    if result is None:  # stopped at a graph break: rebuild the stack and the locals
        output, layout = _break_state(fs, tensors)
    else:
        output = _output_part(fs, result, tensors)  # how to rebuild the return value
    effects = _effect_parts(fs, tensors)  # side effects, replayed after the graph
    if tracer.grad_enabled != grad_mode:  # aotgraph runs a graph in the mode it found
        effects.append(("grad_mode", tracer.grad_enabled))
    tracer.graph.output(tuple(tensors))  # graph outputs: every tensor in it
    tracer.drop_unused_scalars()  # number arithmetic only guards needed
    gm = torch.fx.GraphModule(torch.nn.Module(), tracer.graph)
    gm.graph.lint()  # FX's own invariants (STYLE rule 10)
    tracer.guards.global_state()  # grad mode, autocast, default dtype, ...
    tracer.guards.backend(guard_key or backend_name)  # an entry never serves another backend
    # which tensor inputs share storage: aliased inputs need another graph
    tracer.guards.storage_aliasing(tracer.input_sources, tracer.example_inputs)
    return Translation(
        code=frame.code,
        graph_module=gm,
        example_inputs=tracer.example_inputs,
        input_sources=tracer.input_sources,
        output=output,
        guards=tracer.guards,
        ops=tracer.ops,
        seconds=time.perf_counter() - start,
        user_location=f"{frame.code.co_filename}:{frame.code.co_firstlineno}",
        layout=layout,
        effects=effects,
        shapes=shapes,
    )


def _effect_parts(fs: FrameState, tensors: list[torch.fx.Node]) -> list[tuple[Any, ...]]:
    """The recorded side effects, their values as rebuild specs, in program order."""
    out: list[tuple[Any, ...]] = []
    for effect in fs.tracer.effects:
        kind = effect[0]
        if kind == "container":
            v = effect[1]
            items = fs.tracer.heap.get(v.ref)
            if isinstance(v, ListV):
                out.append(("list", v.source, [_output_part(fs, x, tensors) for x in items]))
            else:
                parts = [(k, _output_part(fs, x, tensors)) for k, x in items.items()]
                kind = "dict_items" if v.ref in fs.tracer.heap.subclassed else "dict"
                out.append((kind, v.source, parts))
        elif kind == "exit_block":  # nothing to rebuild: the object is reached by its source
            out.append(effect)
        else:
            out.append((*effect[:-1], _output_part(fs, effect[-1], tensors)))
    return out


def _break_state(fs: FrameState, tensors: list[torch.fx.Node]) -> tuple[Part, Layout]:
    """The rebuild spec of the stack values and bound locals where translation stopped."""
    parts = []
    for v in fs.stack:
        if isinstance(v, IterV):  # a loop's iterator goes as the list of what remains
            parts.append(
                ("list", [_output_part(fs, x, tensors) for x in fs.tracer.heap.get(v.ref)])
            )
        elif v is not NULL:
            parts.append(_output_part(fs, v, tensors))
    live = tuple(n for n in fs.locals if not n.startswith(breaks.PREFIX))
    bound = {n: _cell_content(fs, n) for n in fs.code.co_cellvars}
    cells = tuple(n for n, content in bound.items() if content is not EMPTY)
    contents = [fs.locals[n] for n in live] + [bound[n] for n in cells]
    for value in contents:
        parts.append(
            ("source", value.source)
            if isinstance(value, Lazy)
            else _output_part(fs, value, tensors)
        )
    kinds = tuple(
        breaks.NULL_SLOT
        if v is NULL
        else breaks.ITER_SLOT
        if isinstance(v, IterV)
        else breaks.VALUE_SLOT
        for v in fs.stack
    )
    return ("tuple", parts), Layout(kinds, live, cells)


def _cell_content(fs: FrameState, name: str) -> Any:
    cell = fs.cells.get(name)
    return fs.tracer.heap.get(cell.ref) if isinstance(cell, CellV) else EMPTY


def _top_frame(tracer: Tracer, frame: Frame) -> FrameState:
    code = frame.code
    fs = FrameState(
        tracer=tracer,
        code=code,
        instrs=decode(code),
        globals=frame.globals,
        globals_source=guarding.global_,
    )
    for name, value in zip(argument_names(code), frame.args, strict=True):
        fs.locals[name] = Lazy(value, source=guarding.local(name))
    cells = frame.function.__closure__ or ()
    for name, cell in zip(code.co_freevars, cells, strict=True):
        try:
            content: Any = Lazy(cell.cell_contents, source=guarding.cell(name))
        except ValueError:
            content = EMPTY
        fs.cells[name] = CellV(tracer.heap.new(content, from_frame=True))
    return fs


# node.meta key: the heap reference naming a graph output's inference-tensor copy
INFERENCE_REF = "ember_inference_ref"

# Functions CPython makes for comprehensions: called at once, never stored anywhere.
COMPREHENSIONS = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"})


def _function_part(fs: FrameState, f: FuncV, tensors: list[torch.fx.Node]) -> Part:
    """A comprehension's function at a break (``[print(i) or x for i in ...]``), rebuilt
    with new cells holding its closure's contents.

    Only when nothing could tell the new cells from the frame's: the function is a
    comprehension's (it runs at once and is gone), defines no function of its own (that
    could outlive it holding the cells), never rebinds a free variable, and no cell is a
    real one of the frame's closure. Any other closure alive at a break would need the
    frame's very cells, so that frame runs eagerly.
    """
    heap = fs.tracer.heap
    if (
        f.code.co_name not in COMPREHENSIONS
        or any(isinstance(c, types.CodeType) for c in f.code.co_consts)
        or any(c.ref in heap.from_frame for c in f.closure)
        or _rebinds_free_variables(f.code)
    ):
        raise Unsupported("a closure made inside compiled code cannot be rebuilt", "output")
    contents = []
    for cell in f.closure:
        content = heap.get(cell.ref)
        contents.append(None if content is EMPTY else _output_part(fs, content, tensors))
    defaults = [_output_part(fs, d, tensors) for d in f.defaults]
    kwdefaults = [(k, _output_part(fs, d, tensors)) for k, d in f.kwdefaults]
    return ("function", (f.code, f.globals, defaults, kwdefaults, contents))


def _generator_part(fs: FrameState, g: GenV, tensors: list[torch.fx.Node]) -> Part:
    """A generator where the graph ends (returned, or alive at a break): made again by
    calling its function natively if it has not started; one that has run cannot be."""
    state = fs.tracer.heap.get(g.ref)
    if state.started:
        name = state.frame.code.co_name
        raise Unsupported(f"generator {name} has started where the graph ends", "generator")
    func, args, kwargs = state.call
    args_parts = [_output_part(fs, a, tensors) for a in args]
    kw_parts = [(k, _output_part(fs, a, tensors)) for k, a in kwargs.items()]
    return ("shared", (g.ref, ("call", (_output_part(fs, func, tensors), args_parts, kw_parts))))


def _rebinds_free_variables(code: types.CodeType) -> bool:
    free = set(code.co_freevars)
    return any(
        ins.opname in ("STORE_DEREF", "DELETE_DEREF") and ins.argval in free
        for ins in dis.get_instructions(code)
    )


def _block_exit_part(v: GradExitV | ModeExitV) -> Part:
    """The exit of a grad-mode, autocast or inference-mode block split by a break."""
    if isinstance(v, GradExitV):
        return ("new", (GradModeExit, [("const", v.previous)]))
    enter, args = v.token.target, v.token.args  # the graph node that entered the mode
    parts = [("const", enter), ("const", v.exit), *(("const", a) for a in args)]
    return ("new", (ModeReentry, parts))


def _tensor_part(fs: FrameState, v: TensorV, tensors: list[torch.fx.Node]) -> Part:
    """A tensor the graph computes: its output slot (appended to ``tensors`` if new)."""
    if v.node not in tensors:
        tensors.append(v.node)
    out: Part = ("out", tensors.index(v.node))
    if not fs.tracer.inference_outputs:
        return out
    # Inference-ness as eager's (a backend may compute it otherwise): one copy, however used.
    ref = v.node.meta.setdefault(INFERENCE_REF, fs.tracer.heap.new(None))
    as_eager = inference_tensor if v.fake.is_inference() else normal_tensor
    return ("shared", (ref, ("new", (as_eager, [out]))))


def _output_part(fs: FrameState, v: Value, tensors: list[torch.fx.Node]) -> Part:
    """The rebuild spec of the returned value; tensors are appended to ``tensors``."""
    heap = fs.tracer.heap
    if isinstance(v, Lazy) and v.source is not None:
        return ("source", v.source)  # never read while tracing: passed on as it is
    if isinstance(v, TensorV | SymV) and v.node.op == "placeholder" and v.source is not None:
        return ("source", v.source)  # an input handed back: reached again, not an output
    if isinstance(v, TensorV):
        return _tensor_part(fs, v, tensors)
    if isinstance(v, SymV):
        if v.node not in tensors:
            tensors.append(v.node)
        return ("out", tensors.index(v.node))
    if isinstance(v, Const):
        return ("const", v.value)
    if isinstance(v, TupleV) and v.cls is not None:  # a namedtuple: made again
        items = [_output_part(fs, x, tensors) for x in v.items]
        return ("new", (make_namedtuple, [("const", v.cls), *items]))
    if isinstance(v, TupleV):
        return ("tuple", [_output_part(fs, x, tensors) for x in v.items])
    if isinstance(v, SetV):  # a new set of its members
        members = [member_value(fs, k) for k in heap.get(v.ref)]
        parts: Part = ("tuple", [_output_part(fs, x, tensors) for x in members])
        return ("shared", (v.ref, ("new", (set, [parts]))))
    if isinstance(v, ListV | DictV):
        if v.ref in heap.from_frame and v.source is not None:
            return ("source", v.source)  # the caller's own list or dict, not a copy
        if isinstance(v, ListV):
            inner: Part = ("list", [_output_part(fs, x, tensors) for x in heap.get(v.ref)])
        else:
            items = heap.get(v.ref).items()
            inner = ("dict", [(k, _output_part(fs, x, tensors)) for k, x in items])
        return ("shared", (v.ref, inner))  # one object, however many names refer to it
    if isinstance(v, ModuleV | ObjV | FuncV) and v.source is not None:
        return ("source", v.source)
    if isinstance(v, ObjV) and (_trusted(v.obj) or is_constant(v.obj)):
        return ("const", v.obj)  # a torch function, a builtin, a class, a Python module
    if isinstance(v, FuncV) and v.fn is not None and not v.closure:
        return ("const", v.fn)  # a method's function, reached through its (guarded) class
    if isinstance(v, FuncV) and v.fn is None:
        return _function_part(fs, v, tensors)
    if isinstance(v, MethodV):
        return ("attr", (_output_part(fs, v.self_value, tensors), v.name))
    if isinstance(v, ViewV):  # a live view of the dict it came from (made whole first)
        return ("new", (getattr(dict, v.kind), [_output_part(fs, v.of, tensors)]))
    if isinstance(v, IterV):
        return ("iter", [_output_part(fs, x, tensors) for x in heap.get(v.ref)])
    if isinstance(v, InstanceV):  # made in the trace: made for real, once however shared
        attrs = [(k, _output_part(fs, x, tensors)) for k, x in heap.get(v.ref).items()]
        own = None
        if v.items is not None:
            own = [(k, _output_part(fs, x, tensors)) for k, x in heap.get(v.items).items()]
        return ("shared", (v.ref, ("object", (v.cls, attrs, own))))
    if isinstance(v, GradExitV | ModeExitV):
        return _block_exit_part(v)
    if isinstance(v, ExcV):
        return ("new", (v.cls, [_output_part(fs, x, tensors) for x in v.args]))
    if isinstance(v, GenV):
        return _generator_part(fs, v, tensors)
    raise Unsupported(f"a {type(v).__name__} made inside compiled code cannot be rebuilt", "output")
