"""The state of one translation, and of each frame the translator steps through.

:class:`Tracer` owns what the whole translation shares: the FX graph being
built, the fake-tensor mode that computes shapes and dtypes, the heap of
mutable containers, the graph inputs (one placeholder per source), and the
guards the translation relies on. :class:`FrameState` is one (possibly
inlined) Python frame: its instructions, value stack, locals and cells.

Anything the translator cannot follow raises :class:`Unsupported`, which
records the user's file, line and source text where it happened.
"""

from __future__ import annotations

import dis
import linecache
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from ember.capture import bytecode_311, guarding, nodemeta
from ember.capture import shapes as shapes_
from ember.capture.fakememo import FakeMemo, TracerFakeMode
from ember.capture.values import NULL, Const, Heap, SymV, TensorV, Value

MAX_INLINE_DEPTH = 64


@dataclass(frozen=True, slots=True)
class Location:
    """A place in the user's code: file, line, and the text of that line."""

    filename: str
    lineno: int | None
    function: str
    text: str

    def __str__(self) -> str:
        where = f'File "{self.filename}", line {self.lineno}, in {self.function}'
        return f"{where}\n    {self.text}" if self.text else where


# One-line advice per category, for explain(), the profiler and errors: every category a
# raise site uses has its own entry (tests/test_hints.py checks it; a raise site may still
# give a more precise hint of its own).
# The category of a call that fills in state the code reads (an optimizer's lazy state):
# that call runs natively and the next one is compiled again (no break is cached).
FIRST_CALL = "first-call"

HINTS: dict[str, str] = {
    FIRST_CALL: "only the first call runs eagerly; later calls are compiled",
    "data-dependent": "keep the value a tensor (e.g. torch.where instead of if/else on it)",
    "side-effect": "move the side effect (printing, mutating inputs) out of the compiled code",
    "call": "use torch operations, or ember.compiler.allow_in_graph for an opaque function",
    "opcode": "this Python construct is not captured yet; move it out of the hot path",
    "graph-break": "ember.compiler.graph_break() was called here on purpose",
    "disabled": "the callee was wrapped in ember.compiler.disable, so it runs eagerly by design;"
    " remove the disable() to capture it",
    "module-hooks": "remove the module's hooks, or accept a break at its call",
    "cache_limit": "each new input shape, type or constant compiles again, up to the cache"
    " limit; keep them stable (a recompilation profiler names the guard that fails)",
    "attribute": "read the attribute outside the compiled code and pass the value in",
    "tensor-attribute": "pass the value in as an argument instead of reading it here",
    "rng": "seed or read the random state outside the compiled code to keep one graph",
    "autograd": "change requires_grad or call autograd outside the compiled code",
    "double-backward": "compute gradients of gradients outside the compiled code",
    "grad-mode": "enable grad outside the compiled code (the caller's no_grad)",
    "subclass": "backend='eager' runs a tensor subclass's __torch_function__ as eager does",
    "constant": "ember needed a Python constant here (a bool, an int); compute it outside"
    " the compiled code or keep the value a tensor",
    "exception": "raise and catch this exception outside the compiled code",
    "generator": "consume the generator fully inside one function (e.g. list(gen))",
    "iteration": "iterate over a list, tuple, dict or range, or a tensor of known size",
    "loop": "bound the loop by a constant or a tensor's size, not by a value computed per step",
    "name": "define the name before the compiled code reads it",
    "import": "import the module at the top of the file, not inside the compiled code",
    "output": "return tensors or plain Python containers of them; build other objects"
    " outside the compiled code",
    "with": "enter and leave the with block inside one function",
    "view-inplace": "autograd refuses this in-place write to a view in eager too; write into"
    " a clone (y = x.clone()) instead",
    "backend": "the frame ran eagerly; another backend (eager, aot_eager) may take this graph",
    "internal": "please report it; the frame ran eagerly, so results are unaffected",
    "unsupported": "this Python operation is not captured yet; move it out of the compiled code",
}

# Categories that are no graph break: the whole frame runs eagerly (a break would hand the
# graph before it to the backend, and a compiled backward graph cannot be differentiated).
# "view-inplace": autograd refused an in-place write to a view (see graphops.VIEW_RULE_ERRORS).
NO_BREAK = frozenset({"double-backward", "subclass", "view-inplace"})


class Unsupported(Exception):
    """The translator met code it cannot capture into one graph.

    ``category`` groups reasons (``"opcode"``, ``"call"``, ``"data-dependent"``,
    ``"side-effect"``, ...); ``location`` is the innermost user code position and
    ``stack`` the inlined frames that led there, outermost first.
    """

    def __init__(self, reason: str, category: str = "unsupported", hint: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.category = category
        self.hint = hint or HINTS.get(category, "")
        self.location: Location | None = None
        self.stack: list[Location] = []
        self.top_index: int | None = None  # the outermost frame's instruction (a break point)

    def __str__(self) -> str:
        if self.location is None:
            return self.reason
        return f"{self.reason}\n{self.location}"


class Raised(Exception):
    """Traced code raised ``exc`` (an ``ExcV``): the interpreter unwinds to the handler of
    the raising instruction (``interpreter.run_frame``), in that frame or a caller's.

    Only pure-Python errors are modelled this way (a ``raise``, ``next()`` of an exhausted
    iterator, a missing dict key); an error of a tensor operation stays :class:`Unsupported`.
    Escaping the outermost frame, it becomes a graph break at the raising instruction, so
    CPython raises the real exception. ``reason`` is what that break records.
    """

    def __init__(self, exc: Any, reason: str = "") -> None:
        super().__init__(reason or f"raising {getattr(exc.cls, '__name__', exc.cls)}")
        self.exc = exc
        self.reason = str(self.args[0])


@dataclass(frozen=True, slots=True)
class Instr:
    """One decoded instruction; ``target`` is the index of a jump's destination."""

    opname: str
    arg: int | None
    argval: Any
    offset: int
    lineno: int | None
    target: int | None


def decode(code: types.CodeType) -> list[Instr]:
    """The code's instructions (no CACHE or EXTENDED_ARG units), jump targets as indices.

    Decoded once per code object (a transformers forward inlines the same few hundred
    functions on every translation): callers must not change the list.

    Indices are those of :func:`ember.capture.bytecode_311.decode`, which the graph
    break code uses to build resume functions. Opnames are the real 3.11 ones
    (``POP_JUMP_FORWARD_IF_FALSE``), as the handlers are registered under them.
    """
    found = _decoded.get(code)
    if found is None:
        found = _decoded[code] = _decode(code)
    return found


_decoded: weakref.WeakKeyDictionary[types.CodeType, list[Instr]] = weakref.WeakKeyDictionary()


def _decode(code: types.CodeType) -> list[Instr]:
    instrs, _ = bytecode_311.decode(code)
    where = bytecode_311.label_index(instrs)
    raw = code.co_code
    out = []
    line = code.co_firstlineno
    for ins in instrs:
        if ins.positions is not None and ins.positions.lineno is not None:
            line = ins.positions.lineno
        assert ins.offset is not None
        opname = dis.opname[raw[ins.offset]]
        target = where[ins.target] if ins.target is not None else None
        argval: Any = ins.argval
        arg = ins.arg
        if opname == "LOAD_GLOBAL":  # argval is (push_null, name): keep the name, bit 0 of arg
            assert isinstance(argval, tuple)
            arg = int(bool(argval[0]))
            argval = argval[1]
        elif opname == "KW_NAMES" and isinstance(argval, int):
            argval = code.co_consts[argval]
        elif opname == "COMPARE_OP":  # the operator's symbol, as dis gives it
            argval = dis.cmp_op[arg or 0]
        out.append(Instr(opname, arg, argval, ins.offset, line, target))
    return out


@dataclass(eq=False)
class Tracer:
    """What one translation shares across its frames."""

    backend_name: str
    graph: torch.fx.Graph = field(default_factory=torch.fx.Graph)
    fake_mode: FakeTensorMode = field(
        default_factory=lambda: TracerFakeMode(allow_non_fake_inputs=False)
    )
    # symbolic sizes: the policy, and (from the first symbolic input on) the ShapeEnv
    shapes: shapes_.Shapes = field(default_factory=shapes_.Shapes)
    heap: Heap = field(default_factory=Heap)
    # fake-tensor results of torch calls, reused for a repeat with symbolic sizes (fakememo)
    fake_memo: FakeMemo = field(default_factory=FakeMemo)
    guards: guarding.GuardCollector = field(default_factory=guarding.GuardCollector)
    # graph inputs, in placeholder order: the source, the real value at compile time
    input_sources: list[Any] = field(default_factory=list)
    example_inputs: list[torch.Tensor] = field(default_factory=list)
    _inputs_by_key: dict[str, TensorV] = field(default_factory=dict)
    _inputs_by_id: dict[int, TensorV] = field(default_factory=dict)
    _scalars_by_key: dict[str, SymV] = field(default_factory=dict)
    scalar_nodes: list[torch.fx.Node] = field(default_factory=list)  # pure number arithmetic
    # autocast / inference-mode blocks entered while tracing: (graph token, exit, real token)
    modes: list[tuple[torch.fx.Node, Any, Any]] = field(default_factory=list)
    _scalar_sources: dict[torch.fx.Node, Any] = field(default_factory=dict)  # placeholder: source
    _last_placeholder: torch.fx.Node | None = None
    ops: int = 0  # call_function/call_method nodes added
    # the Python type of each input tensor (a Parameter, a subclass), for isinstance()
    real_types: dict[torch.fx.Node, type] = field(default_factory=dict)
    calling: Any = None  # the builtin whose rule is running (rules shared by min/max, ...)
    # grad mode as the graph will have it at this point (it starts as the frame found it)
    grad_enabled: bool = field(default_factory=torch.is_grad_enabled)
    entry_grad_enabled: bool = field(default_factory=torch.is_grad_enabled)
    # the graph runs (partly) in inference mode: its tensor outputs are made inference
    # tensors or normal ones as eager's would be (set when the outputs are built)
    inference_outputs: bool = False
    steps: int = 0  # jumps taken, to stop unbounded loops
    # Python side effects, replayed in this order right after the graph runs:
    #   ("setattr" | "object_setattr", obj_source, name, value) | ("global", name, value)
    #   | ("cell", name, value) | ("exit_block", source): a split mode block's real exit
    #   ("container", value): a list or dict the frame passed in, written back whole
    effects: list[tuple[Any, ...]] = field(default_factory=list)
    attr_overlay: dict[tuple[int, str], Value] = field(default_factory=dict)  # (id(obj), name)
    # modules' _buffers dicts (by id) with a buffer rebound in this trace: the overlay holds
    # its new value, so reaching the dict itself (named_buffers, state_dict) is a break
    rebound_buffers: set[int] = field(default_factory=set)
    # one value per real list or dict from the frame, by identity (kept alive while tracing),
    # so that every name and path reaching it sees the same mutations
    containers: dict[int, tuple[Any, Value]] = field(default_factory=dict)
    global_overlay: dict[str, Value] = field(default_factory=dict)  # stored globals
    # the exception being handled (sys.exc_info()'s value): set by PUSH_EXC_INFO, restored
    # by POP_EXCEPT; a bare ``raise`` re-raises it
    exc_info: Value = field(default_factory=lambda: Const(None))
    generators: list[Any] = field(default_factory=list)  # every generators.GenState made
    # where nodes come from: the running frame and the module stack (nodemeta.stamp)
    node_meta: nodemeta.MetaState = field(default_factory=nodemeta.MetaState)

    def input_tensor(self, real: torch.Tensor, source: Any) -> TensorV:
        """The graph input for the tensor reached by ``source`` (one placeholder per tensor)."""
        key = guarding.source_key(source)
        if key in self._inputs_by_key:
            return self._inputs_by_key[key]
        if id(real) in self._inputs_by_id:
            # The same tensor reached by two paths: one placeholder, and a guard
            # that the two sources still hold the same tensor.
            first = self._inputs_by_id[id(real)]
            self.guards.same_tensor(first.source, source)
            self._inputs_by_key[key] = first
            return first
        parameter = isinstance(real, torch.nn.Parameter) or guarding.is_module_tensor(source)
        fake = self.shapes.fake_input(self.fake_mode, real, source, key, parameter)
        self.guards.tensor(source, real, shapes_.symbolic_entries(fake))
        node = self._placeholder(source, real, fake)
        self.real_types[node] = type(real)
        value = TensorV(node, fake, source=source)
        self._inputs_by_key[key] = value
        self._inputs_by_id[id(real)] = value
        return value

    def input_tensors(self) -> list[TensorV]:
        """The tensors the graph takes as inputs so far, one per placeholder."""
        unique = {id(v): v for v in self._inputs_by_key.values()}
        return list(unique.values())

    def input_scalar(self, real: float, source: Any) -> SymV:
        """The graph input for the float reached by ``source``: guarded on its type only."""
        key = guarding.source_key(source)
        if key in self._scalars_by_key:
            return self._scalars_by_key[key]
        self.guards.type_of(source, real)
        node = self._placeholder(source, real, real)
        value = SymV(node, real, source=source)
        self._scalars_by_key[key] = value
        self._scalar_sources[node] = source
        return value

    def input_symint(self, real: int, source: Any) -> SymV | None:
        """The graph input for the int reached by ``source`` when the policy makes it a
        symbol (as sizes: it changed between compiles, or ``dynamic=True``); else None,
        and it stays a constant."""
        key = guarding.source_key(source)
        if key in self._scalars_by_key:
            return self._scalars_by_key[key]
        symint = self.shapes.symbolic_int(self.fake_mode, real, source, key)
        if symint is None:
            return None
        self.guards.type_of(source, real)
        node = self._placeholder(source, symint, symint)
        value = SymV(node, symint, source=source)
        self._scalars_by_key[key] = value
        return value

    def specialize(self, v: SymV, fn: Any = None) -> Any:
        """The number ``v`` stands for (or ``fn`` of it), now assumed constant: a guard checks
        that the frame's numbers still give the same result (``gt(loss, 0.0) == True``)."""
        if isinstance(v.example, shapes_.SYM_TYPES):  # the ShapeEnv records the guard
            try:
                value = shapes_.concrete(v.example if fn is None else fn(v.example))
            except GuardOnDataDependentSymNode as e:  # an unbacked value: no guard decides it
                reason = f"branching on a value only known when the graph runs ({e.cond})"
                raise Unsupported(reason, "data-dependent") from None
            self.shapes.check_marks(self.guards._where())
            return value
        source = self.scalar_source(v.node)
        value = v.example
        if fn is not None:
            source, value = guarding.computed(fn, (source,)), fn(value)
        self.guards.equals(source, value)
        return value

    def scalar_source(self, node: torch.fx.Node) -> Any:
        """A source computing ``node`` from the frame's numbers, for guards."""
        if node in self._scalar_sources:
            return self._scalar_sources[node]
        args = tuple(
            self.scalar_source(a) if isinstance(a, torch.fx.Node) else a for a in node.args
        )
        assert callable(node.target)
        return guarding.computed(node.target, args)

    def _placeholder(self, source: Any, real: Any, example: Any) -> torch.fx.Node:
        name = guarding.source_name(source)
        if self._last_placeholder is None:
            ctx = self.graph.inserting_before(next(iter(self.graph.nodes), None))
        else:
            ctx = self.graph.inserting_after(self._last_placeholder)
        with ctx:
            node = self.graph.placeholder(_identifier(name, len(self.input_sources)))
        self._last_placeholder = node
        node.meta["example_value"] = example
        node.meta[nodemeta.MODULE_STATE] = nodemeta.module_state_of(source, real)
        nodemeta.stamp(self, node, source)
        self.input_sources.append(source)
        self.example_inputs.append(real)
        return node

    def enter_mode(self, enter: Any, exit_: Any, args: tuple[Any, ...]) -> torch.fx.Node:
        """Enter an autocast or inference-mode block: a graph node, and for real while
        tracing (so fake tensors see it); :meth:`leave_modes` undoes what is left open."""
        token = self.graph.call_function(enter, args)
        token.meta["example_value"] = None
        nodemeta.stamp(self, token)
        self.modes.append((token, exit_, enter(*args)))
        return token

    def exit_mode(self, exit_: Any, token: torch.fx.Node) -> None:
        """Leave the block entered as ``token``: a graph node, and for real."""
        node = self.graph.call_function(exit_, (token,))
        node.meta["example_value"] = None
        nodemeta.stamp(self, node)
        for i in range(len(self.modes) - 1, -1, -1):
            if self.modes[i][0] is token:
                _, real_exit, real = self.modes.pop(i)
                real_exit(real)
                return
        raise Unsupported("leaving a mode block that was not entered", "with")

    def leave_modes(self) -> None:
        """Leave, for real, every block tracing entered and did not leave (a failed trace)."""
        while self.modes:
            _, real_exit, real = self.modes.pop()
            real_exit(real)

    def drop_unused_scalars(self) -> None:
        """Remove number arithmetic nothing uses (a condition that only a guard needed)."""
        for node in reversed(self.scalar_nodes):
            if not node.users:
                self.graph.erase_node(node)
                self.ops -= 1

    def set_grad_enabled(self, enabled: bool) -> None:
        """Switch grad mode in the graph (a node) and while tracing (for the fake tensors)."""
        if enabled != self.grad_enabled:
            node = self.graph.call_function(torch._C._set_grad_enabled, (enabled,))
            node.meta["example_value"] = None
            nodemeta.stamp(self, node)
            torch._C._set_grad_enabled(enabled)
            self.grad_enabled = enabled

    def add_node(
        self, kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], fake: Any
    ) -> torch.fx.Node:
        if self.grad_enabled and not self.entry_grad_enabled and _needs_grad(fake):
            # The graph starts under no_grad, and aotgraph compiles such a graph without
            # autograd: an op that records a gradient starts a new graph, entered with grad on.
            reason = "grad enabled inside compiled code entered under no_grad"
            raise Unsupported(reason, "grad-mode")
        node = self.graph.create_node(kind, target, args, kwargs)
        node.meta["example_value"] = fake
        node.meta["ember_line"] = self.guards.where  # (file, line): the report marks it
        nodemeta.stamp(self, node)
        self.ops += 1
        return node


def _needs_grad(fake: Any) -> bool:
    """Whether an operation's result records autograd history."""
    if isinstance(fake, torch.Tensor):
        return fake.requires_grad
    return isinstance(fake, tuple | list) and any(_needs_grad(x) for x in fake)


def _identifier(name: str, index: int) -> str:
    cleaned = "".join(c if c.isalnum() else "_" for c in name).strip("_").lower()
    return cleaned or f"input_{index}"


@dataclass(eq=False)
class FrameState:
    """One frame being translated (the top frame, or an inlined call)."""

    tracer: Tracer
    code: types.CodeType
    instrs: list[Instr]
    globals: dict[str, Any]
    globals_source: Callable[[str], Any]  # name -> source of that global (None: unguardable)
    locals: dict[str, Value] = field(default_factory=dict)
    cells: dict[str, Value] = field(default_factory=dict)  # cell and free variables: CellV
    stack: list[Value] = field(default_factory=list)
    ip: int = 0
    kw_names: tuple[str, ...] = ()
    result: Value | None = None
    parent: FrameState | None = None
    depth: int = 0
    current: Instr | None = None
    yielded: Value | None = None  # set by YIELD_VALUE: the frame (a generator's) suspends
    # id of an exception -> the instruction that first raised it in this frame: where a graph
    # break goes if it escapes the outermost frame (its handlers then run natively)
    raised_at: dict[int, int] = field(default_factory=dict)

    def push(self, value: Value) -> None:
        self.stack.append(value)

    def pop(self) -> Value:
        return self.stack.pop()

    def popn(self, n: int) -> list[Value]:
        if n == 0:
            return []
        values = self.stack[-n:]
        del self.stack[-n:]
        return values

    def peek(self, depth: int = 1) -> Value:
        return self.stack[-depth]

    def push_null(self) -> None:
        self.stack.append(NULL)

    def location(self) -> Location:
        line = self.current.lineno if self.current else self.code.co_firstlineno
        text = linecache.getline(self.code.co_filename, line or 0).strip()
        return Location(self.code.co_filename, line, self.code.co_name, text)

    def jump(self, inst: Instr) -> None:
        assert inst.target is not None, inst
        self.ip = inst.target
