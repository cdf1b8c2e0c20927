"""Node metadata: where in the user's code each graph node came from.

Every ``call_function``/``call_method`` node capture records, and every placeholder,
carries the keys torch's own capture writes, in the same forms, so that passes written
for torch graphs (quantization, export tools, profilers) read them unchanged:

* ``nn_module_stack``: ``{key: (path, module type)}``, outermost first, for each module
  whose ``forward`` the op ran inside. ``path`` is the module's source in Dynamo's
  spelling (``"L['self'].layers.0"``); ``key`` is ``str(id(module))``, with ``@n`` added
  for the n-th further call of the same path (as Dynamo keys inlined modules).
* ``source_fn_stack``: ``[(node name, torch function or method name)]``, or the module
  type when the innermost module is one of ``torch.nn``'s leaf modules.
* ``stack_trace``: the user's frames, innermost last, as ``traceback`` formats them
  (``torch.nn`` modules' and ember's own frames left out); ``print_readable()`` prints
  a ``# File: ...`` line from it (``graph.code``, which caches key on, does not).

* ``module_state`` (on every placeholder): ``"parameter"`` or ``"buffer"`` when the input
  is a module's registered parameter or buffer, else None (ember's key, plain data:
  ember.aotgraph hands it on to the inference compiler, whose freezing folds exactly
  those inputs as constants).
* ``recompute`` and ``ac_graph_id``: on the nodes of a ``torch.utils.checkpoint`` region,
  torch's ``CheckpointPolicy.PREFER_RECOMPUTE`` and the region's number (as torch tags
  them): ember.aotgraph's min-cut partitioner recomputes them in backward instead of
  saving them, as eager's checkpoint does (:func:`enter_checkpoint`).

A graph module's generated ``forward`` that capture interprets again (re-capture) hands
each node it re-creates the original node's metadata, custom keys included; only the
keys that describe the value (``example_value``, ``val``, ...) are capture's own.

>>> import torch
>>> from ember.capture.tracer import Tracer
>>> tracer = Tracer(backend_name="eager")
>>> key = enter_module(tracer, torch.nn.ReLU(), guarding.sources.Local("act"))
>>> node = tracer.graph.call_function(torch.relu, ())
>>> stamp(tracer, node)
>>> leave_module(tracer, key)
>>> list(node.meta["nn_module_stack"].values())
[("L['act']", <class 'torch.nn.modules.activation.ReLU'>)]
>>> node.meta["source_fn_stack"]
[('relu', <class 'torch.nn.modules.activation.ReLU'>)]
"""

from __future__ import annotations

import copy
import linecache
import operator
import os
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ember.capture import guarding
from ember.guards import sources

if TYPE_CHECKING:
    from ember.capture.tracer import FrameState, Tracer

__all__ = [
    "MODULE_STATE",
    "NN_MODULE_STACK",
    "SOURCE_FN_STACK",
    "STACK_TRACE",
    "VALUE_KEYS",
    "MetaState",
    "enter_checkpoint",
    "enter_module",
    "leave_checkpoint",
    "leave_module",
    "module_path",
    "module_state_of",
    "stamp",
]

NN_MODULE_STACK = "nn_module_stack"
SOURCE_FN_STACK = "source_fn_stack"
STACK_TRACE = "stack_trace"
MODULE_STATE = "module_state"  # a placeholder's: "parameter" or "buffer" (module_state_of)
RECOMPUTE, AC_GRAPH_ID = "recompute", "ac_graph_id"
PREFER_RECOMPUTE = torch.utils.checkpoint.CheckpointPolicy.PREFER_RECOMPUTE

# Keys that describe a node's value, not its origin: a re-captured node keeps its own.
VALUE_KEYS = frozenset(
    {"example_value", "val", "tensor_meta", "unbacked_bindings", "ember_line", "from_node"}
)

# Modules whose type stands for their ops in source_fn_stack (Dynamo's rule): torch.nn's
# and torch.ao's leaf modules, not containers (Sequential, ModuleList) that only route.
_LEAF_MODULE_PREFIXES = ("torch.nn.modules", "torch.ao.")
_CONTAINER_PREFIX = "torch.nn.modules.container"

# Frames left out of stack traces: torch.nn modules' forwards (the user's call of the
# module is the line that matters, as in Dynamo) and ember's own code (polyfills).
_HIDDEN_DIRS = (
    os.path.dirname(torch.nn.modules.__file__) + os.sep,
    os.path.dirname(os.path.dirname(__file__)) + os.sep,
)


@dataclass(eq=False, slots=True)
class MetaState:
    """What one translation knows about where its nodes come from.

    >>> MetaState().modules  # no module entered yet
    {}
    """

    frame: FrameState | None = None  # the frame whose instruction runs (the interpreter sets it)
    modules: dict[str, tuple[str, type]] = field(default_factory=dict)  # nn_module_stack now
    calls: dict[str, int] = field(default_factory=dict)  # module path -> calls entered so far
    # the callers' part of the stack trace of ``caller_of``'s nodes, and the innermost caller
    # running a generated forward: kept while the callers stay at the same instructions
    # (``callers_at``; a generator is resumed from other places)
    caller_of: FrameState | None = None
    callers_at: tuple[int, ...] = ()
    callers: tuple[str, FrameState | None] = ("", None)
    # activation checkpointing: the regions (ids) the traced code is inside, innermost last
    checkpoints: list[int] = field(default_factory=list)
    regions: int = 0  # checkpoint regions entered so far


def enter_checkpoint(tracer: Tracer) -> None:
    """The nodes made from now until :func:`leave_checkpoint` belong to a new checkpoint
    region (nested regions: the innermost's number).

    >>> from ember.capture.tracer import Tracer
    >>> tracer = Tracer(backend_name="eager")
    >>> enter_checkpoint(tracer)
    >>> node = tracer.graph.call_function(torch.sin, ())
    >>> stamp(tracer, node)
    >>> leave_checkpoint(tracer)
    >>> node.meta["recompute"], node.meta["ac_graph_id"]
    (<CheckpointPolicy.PREFER_RECOMPUTE: 3>, 1)
    """
    state = tracer.node_meta
    state.regions += 1
    state.checkpoints.append(state.regions)


def leave_checkpoint(tracer: Tracer) -> None:
    """Close the innermost checkpoint region (see :func:`enter_checkpoint`)."""
    tracer.node_meta.checkpoints.pop()


# -- nn_module_stack ----------------------------------------------------------------------------

S = guarding.sources

# How each source kind is spelled in a module path, Dynamo's way: L['x'], G['x'], and
# submodules as attributes even when numbered (ModuleList items: .layers.0).
PATH_RULES: dict[type, Callable[[Any], str]] = {
    S.Local: lambda s: f"L[{s.name!r}]",
    S.Global: lambda s: f"G[{s.name!r}]",
    S.Attr: lambda s: f"{module_path(s.base)}.{s.name}",
    S.ModuleChild: lambda s: f"{module_path(s.base)}.{s.name}",
    S.Item: lambda s: f"{module_path(s.base)}[{s.key!r}]",
}


def module_path(source: Any) -> str:
    """The path of the module reached by ``source``, spelled as Dynamo spells it.

    >>> S = guarding.sources
    >>> module_path(S.ModuleChild(S.ModuleChild(S.Local("self"), "layers"), "0"))
    "L['self'].layers.0"
    """
    rule = PATH_RULES.get(type(source))
    return rule(source) if rule is not None else str(source)


def enter_module(tracer: Tracer, module: torch.nn.Module, source: Any) -> str | None:
    """Push ``module`` (reached by ``source``) on the module stack; the key to pop it with.
    A module no source reaches (made while tracing) is not recorded, as in Dynamo.

    >>> from ember.capture.tracer import Tracer
    >>> tracer, act = Tracer(backend_name="eager"), torch.nn.ReLU()
    >>> src = guarding.sources.ModuleChild(guarding.sources.Local("self"), "act")
    >>> first = enter_module(tracer, act, src)
    >>> leave_module(tracer, first)
    >>> enter_module(tracer, act, src) == f"{id(act)}@1"  # the same module called again
    True
    >>> enter_module(tracer, act, None) is None
    True
    """
    if source is None:
        return None
    state = tracer.node_meta
    path = module_path(source)
    n = state.calls.get(path, 0)
    key = f"{id(module)}@{n}" if n else str(id(module))
    state.calls[path] = n + 1
    state.modules[key] = (path, type(module))
    return key


def leave_module(tracer: Tracer, key: str | None) -> None:
    """Pop the module :func:`enter_module` pushed under ``key`` (None: it pushed none).

    >>> from ember.capture.tracer import Tracer
    >>> tracer = Tracer(backend_name="eager")
    >>> leave_module(tracer, enter_module(tracer, torch.nn.ReLU(), None))
    >>> tracer.node_meta.modules
    {}
    """
    if key is not None:
        del tracer.node_meta.modules[key]


# -- stamping nodes -----------------------------------------------------------------------------


def module_state_of(source: Any, value: Any) -> str | None:
    """``"parameter"`` or ``"buffer"`` when an input read from ``source`` is one of a module's
    registered parameters or buffers, else None (a user's data, a plain tensor attribute).

    >>> from ember.guards import sources
    >>> module_state_of(sources.ModuleChild(sources.Local("self"), "w", sources.BUFFERS), 0)
    'buffer'
    >>> module_state_of(sources.Local("x"), torch.nn.Parameter(torch.ones(1)))
    'parameter'
    >>> module_state_of(sources.Local("x"), torch.ones(1)) is None
    True
    """
    if isinstance(value, torch.nn.Parameter):
        return "parameter"
    if not isinstance(source, sources.ModuleChild):
        return None
    return {sources.PARAMETERS: "parameter", sources.BUFFERS: "buffer"}.get(source.slot)


def stamp(tracer: Tracer, node: torch.fx.Node, source: Any = None) -> None:
    """Record where ``node`` comes from in its meta (``source``: a placeholder's).

    >>> from ember.capture.tracer import Tracer
    >>> tracer = Tracer(backend_name="eager")
    >>> node = tracer.graph.call_method("sin", ())
    >>> stamp(tracer, node)  # no frame running: no stack_trace
    >>> node.meta
    {'source_fn_stack': [('sin', 'sin')]}
    """
    state = tracer.node_meta
    meta = node.meta
    if state.modules:
        meta[NN_MODULE_STACK] = state.modules.copy()
    if state.checkpoints and node.op != "placeholder":  # torch's tags: recompute in backward
        meta[RECOMPUTE] = PREFER_RECOMPUTE
        meta[AC_GRAPH_ID] = state.checkpoints[-1]
    if node.op != "placeholder":
        meta[SOURCE_FN_STACK] = [(node.name, _source_fn(state, node.target))]
    fs = state.frame
    if fs is None:
        return
    where = _callers_at(fs)
    if fs is not state.caller_of or where != state.callers_at:
        state.caller_of, state.callers_at, state.callers = fs, where, _walk(fs.parent)
    trace, generated = _walk(fs, until=fs.parent)
    trace = state.callers[0] + trace
    generated = generated or state.callers[1]
    if trace:
        meta[STACK_TRACE] = trace
    if generated is not None:
        original = _original_meta(generated, node, source, inner=generated is not fs)
        if original is not None:
            meta.update({k: copy.copy(v) for k, v in original.items() if k not in VALUE_KEYS})


def _callers_at(fs: FrameState) -> tuple[int, ...]:
    """Where ``fs``'s callers are: their instructions' identities."""
    where = []
    frame = fs.parent
    while frame is not None:
        where.append(id(frame.current))
        frame = frame.parent
    return tuple(where)


def _source_fn(state: MetaState, target: Any) -> Any:
    if state.modules:
        innermost = next(reversed(state.modules.values()))[1]
        where = innermost.__module__
        if where.startswith(_LEAF_MODULE_PREFIXES) and not where.startswith(_CONTAINER_PREFIX):
            return innermost
    return target


# -- stack_trace --------------------------------------------------------------------------------

# (file, line, function) -> that frame's two formatted lines: formatted once per place
# (emptied when full: each graph module compiled again brings a generated file of its own)
_frame_lines: dict[tuple[str, int, str], str] = {}
MAX_FRAME_LINES = 50_000
# file name -> USER, HIDDEN or GENERATED (the generated forward of a graph module)
_file_kinds: dict[str, int] = {}
USER, HIDDEN, GENERATED = 0, 1, 2


def _walk(fs: FrameState | None, until: FrameState | None = None) -> tuple[str, FrameState | None]:
    """The user's frames from the outermost (or from below ``until``) to ``fs``, formatted as
    ``traceback`` does; and the innermost frame running a graph module's generated
    ``forward`` (re-capture)."""
    parts = []
    generated = None
    frame = fs
    while frame is not None and frame is not until:
        code = frame.code
        kind = _file_kinds.get(code.co_filename)
        if kind is None:
            kind = _file_kinds[code.co_filename] = _file_kind(code.co_filename)
        if kind != HIDDEN:
            line = frame.current.lineno if frame.current else code.co_firstlineno
            parts.append(_frame_text(code.co_filename, line or 0, code.co_name))
            if kind == GENERATED and generated is None:
                generated = frame
        frame = frame.parent
    parts.reverse()
    return "".join(parts), generated


def _file_kind(filename: str) -> int:
    """Whose code a file holds.

    >>> _file_kind(torch.nn.Linear.forward.__code__.co_filename) == HIDDEN
    True
    """
    if len(_file_kinds) >= MAX_FRAME_LINES:  # generated files: one per graph module
        _file_kinds.clear()
    if filename.startswith(_GENERATED_PREFIX):
        return GENERATED
    return HIDDEN if filename.startswith(_HIDDEN_DIRS) else USER


def _frame_text(filename: str, line: int, function: str) -> str:
    key = (filename, line, function)
    text = _frame_lines.get(key)
    if text is None:
        text = f'  File "{filename}", line {line}, in {function}\n'
        source = linecache.getline(filename, line).strip()
        if source:
            text += f"    {source}\n"
        if len(_frame_lines) >= MAX_FRAME_LINES:
            _frame_lines.clear()
        _frame_lines[key] = text
    return text


# -- re-capture of a graph module's generated code ------------------------------------------------

_GENERATED_PREFIX = "<eval_with_key>"  # the file name torch.fx gives generated forwards


@dataclass(frozen=True, slots=True)
class _Original:
    """What a generated ``forward`` was generated from: the meta of each code line's node."""

    lines: dict[int, dict[str, Any]]  # line - co_firstlineno -> that node's meta
    # (line, i) -> the meta of the node's ``getitem`` i: capture makes the items of a call's
    # tuple where it makes the call (indexing the tuple later adds no node)
    items: dict[tuple[int, int], dict[str, Any]]
    inputs: dict[str, dict[str, Any]]  # placeholder name, get_attr target -> its meta


_originals: weakref.WeakKeyDictionary[types.CodeType, _Original | None] = (
    weakref.WeakKeyDictionary()
)


def _original_meta(
    fs: FrameState, node: torch.fx.Node, source: Any, *, inner: bool
) -> dict[str, Any] | None:
    """The meta of the node of the graph module, whose ``forward`` ``fs`` runs, that
    ``node`` re-creates: by code line (as torch.fx records it; ``inner``: the node is made by
    code that line calls), or by name for an input."""
    if fs.code in _originals:
        original = _originals[fs.code]
    else:
        original = _originals[fs.code] = _find_original(fs)
    if original is None:
        return None
    if node.op == "placeholder":  # an argument by name, a get_attr by its path from self
        return original.inputs.get(_input_name(source))
    if fs.current is None or fs.current.lineno is None:
        return None
    line = fs.current.lineno - fs.code.co_firstlineno
    if node.target is operator.getitem and isinstance(node.args[1], int):
        found = original.items.get((line, node.args[1]))
        if found is not None and not inner:
            return found
    return original.lines.get(line)


def _input_name(source: Any) -> str:
    """``x`` for the argument ``L['x']``, ``a.b`` for ``L['self'].a.b`` (a get_attr's
    target), "" for others."""
    names = []
    while isinstance(source, S.Attr | S.ModuleChild):
        names.append(source.name)
        source = source.base
    if not isinstance(source, S.Local) or (names and source.name != "self"):
        return ""
    return ".".join(reversed(names)) if names else source.name


def _find_original(fs: FrameState) -> _Original | None:
    """What the graph module whose generated ``forward`` ``fs`` runs (its ``self``) holds."""
    self_value = fs.locals.get("self")
    gm = getattr(self_value, "module", getattr(self_value, "obj", None))
    if not isinstance(gm, torch.fx.GraphModule):
        return None
    if getattr(type(gm).forward, "__code__", None) is not fs.code:
        return None
    nodes = list(gm.graph.nodes)
    # metas only, never nodes: a node would keep the code (the dict's key) alive
    line_nodes = {line: nodes[i] for line, i in (getattr(gm, "_lineno_map", None) or {}).items()}
    items = {
        (line, user.args[1]): user.meta
        for line, n in line_nodes.items()
        for user in n.users
        if user.target is operator.getitem and isinstance(user.args[1], int)
    }
    lines = {line: n.meta for line, n in line_nodes.items()}
    inputs = {str(n.target): n.meta for n in nodes if n.op in ("placeholder", "get_attr")}
    return _Original(lines, items, inputs)
