"""Calling a value: inline user Python, record torch operations, model builtins.

:func:`call_value` dispatches on the kind of the callee through
:data:`CALL_RULES`. User functions and module ``forward`` methods are inlined
by a nested interpreter (:func:`inline`); torch functions and tensor methods
become graph nodes (:func:`ember.capture.graphops.graph_call`); Python
builtins and container methods are modelled in :mod:`ember.capture.pyrules`.
"""

from __future__ import annotations

import inspect
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ember.capture import codegen, guarding, markers, nodemeta, polyfills, settings, trace_rules
from ember.capture.builder import wrap
from ember.capture.graphops import graph_call
from ember.capture.tracer import FrameState, Raised, Unsupported, decode
from ember.capture.values import (
    BoundV,
    CellV,
    Const,
    DictV,
    FuncV,
    GradExitV,
    InstanceV,
    Lazy,
    MethodV,
    ModeExitV,
    ModuleV,
    ObjV,
    PartialV,
    TensorV,
    TupleV,
    Value,
)

CO_VARARGS, CO_VARKEYWORDS = inspect.CO_VARARGS, inspect.CO_VARKEYWORDS


CO_UNTRACEABLE = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE

Args = list[Value]
Kwargs = dict[str, Value]


def materialize(fs: FrameState, v: Value) -> Value:
    """``v`` itself, or for a :class:`Lazy` value the wrapped (and guarded) object."""
    if isinstance(v, Lazy):
        return wrap(fs.tracer, v.obj, v.source)
    return v


# -- inlining user functions -------------------------------------------------------------------


def bind(fs: FrameState, func: FuncV, args: Args, kwargs: Kwargs) -> dict[str, Value]:
    """Bind call arguments to the parameters of ``func`` as Python would; errors are unsupported.

    (Eager raises the real ``TypeError`` when the frame falls back.)
    """
    code = func.code
    nargs, nkw = code.co_argcount, code.co_kwonlyargcount
    names = code.co_varnames
    positional, kwonly = names[:nargs], names[nargs : nargs + nkw]
    rest = nargs + nkw
    star = names[rest] if code.co_flags & CO_VARARGS else None
    starstar = names[rest + bool(star)] if code.co_flags & CO_VARKEYWORDS else None
    if len(args) > nargs and star is None:
        raise Unsupported(f"{code.co_name}() given too many positional arguments", "call")
    bound: dict[str, Value] = dict(zip(positional, args, strict=False))
    extra_kw: dict[str, Value] = {}
    for key, value in kwargs.items():
        if key in kwonly or key in positional[code.co_posonlyargcount :]:
            if key in bound:
                raise Unsupported(f"{code.co_name}() got {key!r} twice", "call")
            bound[key] = value
        elif starstar is not None:
            extra_kw[key] = value
        else:
            raise Unsupported(f"{code.co_name}() got an unexpected keyword {key!r}", "call")
    defaults = func.defaults
    for i, name in enumerate(positional):
        if name not in bound:
            d = i - (nargs - len(defaults))
            if d < 0:
                raise Unsupported(f"{code.co_name}() missing argument {name!r}", "call")
            bound[name] = defaults[d]
    kwdefaults = dict(func.kwdefaults)
    for name in kwonly:
        if name not in bound:
            if name not in kwdefaults:
                raise Unsupported(f"{code.co_name}() missing argument {name!r}", "call")
            bound[name] = kwdefaults[name]
    if star is not None:
        bound[star] = TupleV(tuple(args[nargs:]))
    if starstar is not None:
        bound[starstar] = DictV(fs.tracer.heap.new(extra_kw))
    return bound


def function_value(fs: FrameState, fn: types.FunctionType, source: Any) -> FuncV:
    """The :class:`FuncV` of a real function. Its defaults are read through ``source`` when it
    has one (guarded on use: a replaced ``__defaults__`` recompiles); without a source the
    function is fixed (a class's method, reached through its guarded type), and so are they."""
    defaults = tuple(_default(fs, d, source, i) for i, d in enumerate(fn.__defaults__ or ()))
    kwdefaults = tuple(
        (k, _default(fs, v, source, k)) for k, v in (fn.__kwdefaults__ or {}).items()
    )
    return FuncV(
        fn.__code__,
        fn.__globals__,
        fn=fn,
        defaults=defaults,
        kwdefaults=kwdefaults,
        closure_cells=fn.__closure__,
        source=source,
    )


def _default(fs: FrameState, value: Any, function: Any, key: int | str) -> Value:
    if function is None:
        return wrap(fs.tracer, value, None)
    return Lazy(value, source=guarding.sources.Default(function, key))


def inline(fs: FrameState, func: FuncV, args: Args, kwargs: Kwargs) -> Value:
    """Run ``func`` in a nested interpreter; its return value."""
    from ember.capture.interpreter import run_frame

    code = func.code
    if code.co_flags & CO_UNTRACEABLE:
        raise Unsupported(f"calling coroutine function {code.co_name}", "call")
    row = trace_rules.lookup(trace_rules.module_of(func.globals))
    if row.action == trace_rules.SKIP:
        # The trace rules say this module runs natively: the call is a graph break.
        raise Unsupported(
            f"call to {code.co_qualname}, which ember runs natively ({row.prefix}: {row.reason})",
            "call",
            f"ember.compiler.set_trace_rule({row.prefix!r}, 'trace', ...) traces it",
        )
    if (
        func.fn is not None
        and not func.defaults
        and (func.fn.__defaults__ or func.fn.__kwdefaults__)
    ):
        func = function_value(fs, func.fn, func.source)
    child = FrameState(
        tracer=fs.tracer,
        code=code,
        instrs=decode(code),
        globals=func.globals,
        globals_source=_globals_source(fs, func),
        locals=dict(bind(fs, func, args, kwargs)),
        parent=fs,
        depth=fs.depth + 1,
    )
    child.cells.update(_closure_cells(fs, func))
    if code.co_flags & inspect.CO_GENERATOR:  # runs when resumed (next, for, send)
        from ember.capture.generators import make_generator

        return make_generator(fs, child, (func, args, kwargs))
    try:
        result = run_frame(child)
    finally:  # the caller's instruction goes on: its nodes come from the caller's frame
        fs.tracer.node_meta.frame = fs
    assert result is not None
    return result


def _globals_source(fs: FrameState, func: FuncV) -> Callable[[str], Any]:
    """How an inlined function's globals are reached: the caller's dict, or its module's."""
    if func.globals is fs.globals:
        return fs.globals_source
    return lambda name: guarding.module_global(func.globals, name)


def _closure_cells(fs: FrameState, func: FuncV) -> dict[str, Value]:
    names = func.code.co_freevars
    if func.closure:
        return dict(zip(names, func.closure, strict=True))
    cells = func.closure_cells or ()
    out: dict[str, Value] = {}
    for i, (name, cell) in enumerate(zip(names, cells, strict=True)):
        source = guarding.closure_cell(func.source, i) if func.source is not None else None
        try:
            content: Any = Lazy(cell.cell_contents, source=source)
        except ValueError:  # an empty cell
            from ember.capture.values import EMPTY

            content = EMPTY
        out[name] = CellV(fs.tracer.heap.new(content, from_frame=True))
    return out


# -- the rules ---------------------------------------------------------------------------------


def _call_function(fs: FrameState, f: Value, args: Args, kwargs: Kwargs) -> Value:
    assert isinstance(f, FuncV)
    if f.fn is not None and in_graph(f.fn):  # allow_in_graph: one node, not traced into
        return graph_call(fs, "call_function", f.fn, args, kwargs)
    if f.fn is not None and (markers.is_assumed_constant(f.fn) or _has_rule(f.fn)):
        from ember.capture.pyrules import call_python_object

        return call_python_object(fs, f.fn, args, kwargs)
    if markers.is_disabled_code(f.code):  # disable(fn, recursive=False)
        reason = f"call to {f.code.co_name}, disabled with ember.compiler.disable(recursive=False)"
        raise Unsupported(reason, "disabled")
    if f.fn is not None and _grad_decorated(f.fn) is not None:
        return _call_grad_decorated(fs, f, args, kwargs)
    if f.fn is not None and polyfills.contextmanager_parts(f.fn) is not None:
        return _call_contextmanager(fs, f, args, kwargs)
    return inline(fs, f, args, kwargs)


def _call_contextmanager(fs: FrameState, f: FuncV, args: Args, kwargs: Kwargs) -> Value:
    """A closure a polyfill stands in for (a ``@contextlib.contextmanager`` function: the
    polyfill's context manager over the decorated generator function), given the cells of
    the closure it reads (so the closure is guarded by identity)."""
    parts = polyfills.contextmanager_parts(f.fn)
    assert parts is not None
    call, indices = parts
    if f.source is not None:
        fs.tracer.guards.identity(f.source, f.fn)
    cells = [
        wrap(
            fs.tracer,
            f.fn.__closure__[index].cell_contents,
            guarding.closure_cell(f.source, index) if f.source is not None else None,
        )
        for index in indices
    ]
    return inline(fs, function_value(fs, call, None), [*cells, *args], kwargs)


def _grad_decorated(fn: Any) -> bool | None:
    """For a function decorated with ``@torch.no_grad()``/``@torch.enable_grad()``/
    ``@torch.set_grad_enabled(b)``: the grad mode it runs in; None for any other."""
    code = fn.__code__
    if code.co_name != "decorate_context" or "ctx_factory" not in code.co_freevars:
        return None
    factory = fn.__closure__[code.co_freevars.index("ctx_factory")].cell_contents
    manager = getattr(factory, "__self__", None)
    if type(manager) in (torch.no_grad, torch.enable_grad):
        return type(manager) is torch.enable_grad
    if type(manager) is torch.set_grad_enabled:
        return bool(manager.mode)
    return None


def _call_grad_decorated(fs: FrameState, f: FuncV, args: Args, kwargs: Kwargs) -> Value:
    """The decorated function, inlined between two grad-mode switches (the decorator's
    ``with`` block). The decorator is guarded by identity, so its closure is fixed."""
    enabled = _grad_decorated(f.fn)
    assert enabled is not None
    if f.source is not None:  # torch's code is trusted unguarded; this closure is the user's
        fs.tracer.guards.identity(f.source, f.fn)
    index = f.code.co_freevars.index("func")
    inner_source = guarding.closure_cell(f.source, index) if f.source is not None else None
    inner = wrap(fs.tracer, f.fn.__closure__[index].cell_contents, inner_source)
    previous = fs.tracer.grad_enabled
    fs.tracer.set_grad_enabled(enabled)
    try:
        result = call_value(fs, inner, args, kwargs)
    except Raised:  # the decorator's with block restores the mode on the way out
        fs.tracer.set_grad_enabled(previous)
        raise
    fs.tracer.set_grad_enabled(previous)
    return result


def _call_module(fs: FrameState, m: Value, args: Args, kwargs: Kwargs) -> Value:
    assert isinstance(m, ModuleV)
    key = nodemeta.enter_module(fs.tracer, m.module, m.source)  # the ops inside: its stack
    try:
        return _call_forward(fs, m, args, kwargs)
    finally:
        nodemeta.leave_module(fs.tracer, key)


def _call_forward(fs: FrameState, m: ModuleV, args: Args, kwargs: Kwargs) -> Value:
    """``m(*args, **kwargs)``: its forward (and forward hooks) inlined."""
    module = m.module
    hooks = _hooks(module)
    if hooks and (m.source is None or hooks != "forward"):
        raise Unsupported(f"calling {type(module).__name__} with {hooks} hooks", "module-hooks")
    if m.source is not None:  # the hooks traced (or none) are the ones it will have
        fs.tracer.guards.module_hooks(m.source, module)
    if "forward" in module.__dict__:  # set on the instance: nn.Module.__call__ calls it
        if m.source is None or hooks:
            raise Unsupported(f"calling a {type(module).__name__} with its own forward", "call")
        own = wrap(fs.tracer, module.__dict__["forward"], guarding.attr(m.source, "forward"))
        return call_value(fs, own, list(args), kwargs)
    forward = type(module).forward
    if m.source is not None:  # still the class's forward: none set on the instance since
        fs.tracer.guards.class_member(m.source, module, "forward", forward)
    if not isinstance(forward, types.FunctionType):
        raise Unsupported(f"{type(module).__name__}.forward is not a Python function", "call")
    if hooks:  # Module.__call__'s polyfill runs the hooks around forward
        call = polyfills.lookup(torch.nn.Module._call_impl)
        return call_value(fs, function_value(fs, call, None), [m, *args], kwargs)
    return call_value(fs, function_value(fs, forward, None), [m, *args], kwargs)


def _hooks(module: torch.nn.Module) -> str:
    """Which call hooks ``module`` has: "" (none), "forward" or "backward" (any at all)."""
    from torch.nn.modules import module as mod

    if (
        module._backward_hooks
        or module._backward_pre_hooks
        or mod._global_backward_hooks
        or mod._global_backward_pre_hooks
    ):
        return "backward"
    forward = (
        module._forward_hooks,
        module._forward_pre_hooks,
        mod._global_forward_hooks,
        mod._global_forward_pre_hooks,
    )
    return "forward" if any(forward) else ""


def _call_method(fs: FrameState, m: Value, args: Args, kwargs: Kwargs) -> Value:
    assert isinstance(m, MethodV)
    from ember.capture.pyobjects import call_python_method

    self_value = m.self_value
    if isinstance(self_value, ObjV) and isinstance(self_value.obj, torch.Generator):
        # Its state lives outside the graph: the call runs natively, in order with the
        # graph's random operations, on every call.
        raise Unsupported(f"calling Generator.{m.name}: a random generator's state", "rng")
    if isinstance(self_value, TensorV):
        return tensor_method(fs, self_value, m.name, args, kwargs)
    if isinstance(self_value, ModuleV | ObjV):
        obj = self_value.module if isinstance(self_value, ModuleV) else self_value.obj
        fn = getattr(type(obj), m.name, None)
        if isinstance(fn, types.FunctionType):  # polyfilled, traced, or a break by the rules
            explicit = isinstance(self_value, ModuleV) and m.name == "forward"  # m.forward(x)
            key = nodemeta.enter_module(fs.tracer, obj, self_value.source) if explicit else None
            try:
                return call_value(fs, function_value(fs, fn, None), [self_value, *args], kwargs)
            finally:
                nodemeta.leave_module(fs.tracer, key)
    return call_python_method(fs, self_value, m.name, args, kwargs)


# Tensor methods whose result is data, not a tensor: they need the values.
TENSOR_DATA_METHODS = {
    "item": "reading a tensor's value with .item()",
    "tolist": "reading a tensor's values with .tolist()",
    "numpy": "converting a tensor to numpy",
    "data_ptr": "reading a tensor's data pointer",
    "__bool__": "branching on a tensor's value",
    "__int__": "converting a tensor's value to int",
    "__float__": "converting a tensor's value to float",
    "backward": "calling .backward() inside compiled code",
    "register_hook": "registering a tensor hook inside compiled code",
    "retain_grad": "calling .retain_grad() inside compiled code",
}


# Tensor methods that change autograd state: a graph traced to aten ops (aot_eager,
# inductor) would drop the change, so each runs natively between two graphs.
TENSOR_AUTOGRAD_METHODS = {
    "requires_grad_": "changing requires_grad inside compiled code",
    "detach_": "detaching a tensor in place inside compiled code",
}


def _graph_input_requires_grad(t: TensorV, name: str, args: Args, kwargs: Kwargs) -> bool:
    """``x.requires_grad_()`` on a tensor the frame was given stays in the graph: aotgraph
    sets the flag before it runs and takes gradients from the call on, as eager does. On
    a tensor made inside the graph (``x.detach().requires_grad_()``) it is a break."""
    flags = [*args, *kwargs.values()]
    turns_on = all(isinstance(a, Const) and a.value is True for a in flags)
    return name == "requires_grad_" and turns_on and t.source is not None


def tensor_method(fs: FrameState, t: TensorV, name: str, args: Args, kwargs: Kwargs) -> Value:
    """``t.name(*args, **kwargs)``: metadata folds to a constant, the rest is a graph node."""
    if name in TENSOR_AUTOGRAD_METHODS and not _graph_input_requires_grad(t, name, args, kwargs):
        raise Unsupported(TENSOR_AUTOGRAD_METHODS[name], "autograd")
    if name == "backward":
        _no_double_backward("Tensor.backward", [t, *args], kwargs, 3)
    scalar = name == "item" and settings.section.get().scalar_outputs  # an unbacked symbol
    if name in TENSOR_DATA_METHODS and not scalar:
        hint = "keep the value a tensor, e.g. torch.where" if name == "item" else ""
        if name == "item":
            hint += " (or config.capture.scalar_outputs=True: .item() stays in the graph)"
        raise Unsupported(TENSOR_DATA_METHODS[name], "data-dependent", hint)
    stand_in = polyfills.lookup_tensor_method(name)
    if stand_in is not None:  # a method some of whose calls are rewritten (Tensor.addcdiv_)
        return call_value(fs, wrap(fs.tracer, stand_in, None), [t, *args], kwargs)
    return graph_call(fs, "call_method", name, [t, *args], kwargs)


def _call_object(fs: FrameState, f: Value, args: Args, kwargs: Kwargs) -> Value:
    assert isinstance(f, ObjV | Const)
    from ember.capture.pyrules import call_python_object

    obj = f.obj if isinstance(f, ObjV) else f.value
    if isinstance(obj, codegen.ModeReentry) and f.source is not None:
        return _leave_split_block(fs, obj, f.source)
    if in_graph(obj):
        return graph_call(fs, "call_function", obj, args, kwargs)
    if type(obj) is weakref.ref and f.source is not None and not args and not kwargs:
        # a weak reference (an LR scheduler's to its optimizer): its referent, reached through it
        return wrap(fs.tracer, obj(), guarding.computed(weakref.ref.__call__, (f.source,)))
    if isinstance(obj, types.FunctionType) and trace_rules.traceable(obj):
        # torch's Python that the trace rules inline (torch.optim's ``_single_tensor_adam``):
        # kept as a trusted object when wrapped, traced like a user function when called
        return _call_function(fs, function_value(fs, obj, f.source), args, kwargs)
    call = inspect.getattr_static(type(obj), "__call__", None)
    if (
        isinstance(f, ObjV)
        and not isinstance(obj, type)
        and isinstance(call, types.FunctionType)
        and trace_rules.traceable(call)
    ):  # a user object with a __call__ method: inlined like any method
        return inline(fs, function_value(fs, call, None), [f, *args], kwargs)
    return call_python_object(fs, obj, args, kwargs)


def _leave_split_block(fs: FrameState, block: Any, source: Any) -> Value:
    """The end of an autocast/inference-mode block that a break split (the resume function
    runs inside it): the rest of the graph runs in an off region of the mode, closed at the
    graph's end, and the real block's exit is replayed after the graph."""
    if block.off is None:
        raise Unsupported("leaving a split block whose mode was already on before it", "with")
    fs.tracer.guards.equals(guarding.attr(source, "off"), block.off)
    fs.tracer.enter_mode(block.enter, block.exit, block.off)
    fs.tracer.effects.append(("exit_block", source))
    return Const(None)


def _has_rule(fn: Any) -> bool:
    """A Python function the interpreter models with a rule of its own instead of tracing it
    (ember's ``graph_break``, ``inspect.signature``)."""
    from ember.capture.pyrules import BUILTIN_RULES

    return fn in BUILTIN_RULES


def _call_bound(fs: FrameState, f: Value, args: Args, kwargs: Kwargs) -> Value:
    assert isinstance(f, BoundV)
    return call_value(fs, f.func, [f.self_value, *args], kwargs)


def _call_partial(fs: FrameState, f: Value, args: Args, kwargs: Kwargs) -> Value:
    assert isinstance(f, PartialV)
    return call_value(fs, f.func, [*f.args, *args], {**fs.tracer.heap.get(f.kwargs.ref), **kwargs})


def _call_instance(fs: FrameState, f: Value, args: Args, kwargs: Kwargs) -> Value:
    """Calling an instance made while tracing: its class's ``__call__``, inlined."""
    assert isinstance(f, InstanceV)
    call = inspect.getattr_static(f.cls, "__call__", None)
    if not trace_rules.traceable(call):
        raise Unsupported(f"calling a {f.cls.__name__} (no Python __call__)", "call")
    return inline(fs, function_value(fs, call, None), [f, *args], kwargs)


def _call_mode_exit(fs: FrameState, f: Value, args: Args, kwargs: Kwargs) -> Value:
    assert isinstance(f, ModeExitV)
    fs.tracer.exit_mode(f.exit, f.token)  # the block's __exit__(None, None, None)
    return Const(None)


def _call_grad_exit(fs: FrameState, f: Value, args: Args, kwargs: Kwargs) -> Value:
    assert isinstance(f, GradExitV)
    fs.tracer.set_grad_enabled(f.previous)  # the block's __exit__(None, None, None)
    return Const(None)


CALL_RULES: dict[type, Callable[[FrameState, Value, Args, Kwargs], Value]] = {
    FuncV: _call_function,
    ModuleV: _call_module,
    MethodV: _call_method,
    ObjV: _call_object,
    Const: _call_object,
    GradExitV: _call_grad_exit,
    ModeExitV: _call_mode_exit,
    InstanceV: _call_instance,
    BoundV: _call_bound,
    PartialV: _call_partial,
}


def call_value(fs: FrameState, f: Value, args: Args, kwargs: Kwargs) -> Value:
    """The value of ``f(*args, **kwargs)``."""
    real = f.fn if isinstance(f, FuncV) else f.obj if isinstance(f, ObjV) else None
    if real is not None:
        state_break(real, args, kwargs)
        stand_in = polyfills.lookup(real)
        if stand_in is not None:  # plain Python that does what ``real`` does: traced instead
            return call_value(fs, wrap(fs.tracer, stand_in, None), args, kwargs)
    rule = CALL_RULES.get(type(f))
    if rule is None:
        raise Unsupported(f"calling a {type(f).__name__}", "call")
    return rule(fs, f, args, kwargs)


# -- calls that read or set state a graph cannot hold ----------------------------------------

# torch functions that read or set the random generator's or autograd's state, by
# "module.qualname" (torch rebinds torch.manual_seed to a wrapper with the same name when
# its compiler is imported, so identity would miss it). Each is a graph break: it runs natively, in
# order with the graph's random operations, on every call, as in eager.
STATE_CALLS: dict[str, tuple[str, str]] = {
    **{
        f"torch.random.{name}": (f"torch.{name}: the random generator's state", "rng")
        for name in (
            "manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state", "fork_rng"
        )
    },
    **{
        f"torch.cuda.random.{name}": (f"torch.cuda.{name}: the random generator's state", "rng")
        for name in (
            "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed",
            "get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all",
        )
    },
    "torch.autograd.grad": ("torch.autograd.grad inside compiled code", "autograd"),
    "torch.autograd.backward": ("torch.autograd.backward inside compiled code", "autograd"),
}  # fmt: skip

# Where ``create_graph`` sits among the positional arguments of each backward function.
CREATE_GRAPH_POSITION = {"torch.autograd.grad": 4, "torch.autograd.backward": 3}


def state_break(real: Any, args: Args, kwargs: Kwargs) -> None:
    """Raise the graph break for a call of ``real`` listed in :data:`STATE_CALLS`."""
    name = polyfills.qualified_name(real) if callable(real) else ""
    found = STATE_CALLS.get(name)
    if found is None:
        return
    if name in CREATE_GRAPH_POSITION:
        _no_double_backward(name, args, kwargs, CREATE_GRAPH_POSITION[name])
    raise Unsupported(*found)


def _no_double_backward(name: str, args: Args, kwargs: Kwargs, position: int) -> None:
    """A backward pass with ``create_graph=True`` (or a value not known while tracing)
    differentiates the graphs before it twice, which a compiled backward graph cannot:
    the whole frame runs eagerly (no break, whose first graph would be compiled)."""
    given = kwargs.get("create_graph", args[position] if len(args) > position else None)
    if given is None or (isinstance(given, Const) and not given.value):
        return
    raise Unsupported(f"{name} with create_graph=True inside compiled code", "double-backward")


# -- which callables become graph nodes -------------------------------------------------------

GRAPH_NAMESPACES = (
    torch,
    torch.nn.functional,
    torch.linalg,
    torch.fft,
    torch.special,
    torch.Tensor,
)

# torch callables that change global state or read data: never put in a graph.
NOT_IN_GRAPH = {
    torch.manual_seed,
    torch.seed,
    torch.set_grad_enabled,
    torch.set_default_dtype,
    torch.set_num_threads,
    torch.use_deterministic_algorithms,
    torch.is_grad_enabled,
    torch.is_tensor,
    torch.is_floating_point,
    torch.numel,
    torch.get_default_dtype,
    torch.is_inference_mode_enabled,
}

_in_graph_ids: set[int] = set()
# id -> the function itself (held so that its id cannot be reused by another object)
_user_allowed: dict[int, Any] = {}
_user_disallowed: dict[int, Any] = {}


def in_graph(obj: Any) -> bool:
    """Whether calling ``obj`` is recorded as one graph node (a torch operation)."""
    if not _in_graph_ids:
        for ns in GRAPH_NAMESPACES:
            for name in dir(ns):
                value = getattr(ns, name, None)
                if callable(value) and not isinstance(value, type) and not name.startswith("_"):
                    _in_graph_ids.add(id(value))
        _in_graph_ids.difference_update(id(f) for f in NOT_IN_GRAPH)
    key = id(obj)
    if _user_disallowed.get(key) is obj:
        return False
    if _user_allowed.get(key) is obj:
        return True
    if key in _in_graph_ids or isinstance(obj, torch._ops.OpOverload):
        return True
    return isinstance(obj, types.FunctionType) and polyfills.qualified_name(obj) in LIBRARY_OPS


# Library functions recorded as one graph node each, by "module.qualname" (so the library
# is never imported for it), with the reason. These are the functions their libraries
# register with torch's allow_in_graph: pure functions of tensors whose Python (pattern
# parsing, caches, backend lookup) is not worth tracing. Fake tensors run them, so the
# node's shapes are exact; aotgraph then traces them to aten ops like any other node.
LIBRARY_OPS: dict[str, str] = {
    **{
        f"einops.einops.{name}": "einops: a tensor operation given by a pattern string"
        for name in ("rearrange", "reduce", "repeat", "einsum")
    },
    **{
        f"einops.packing.{name}": "einops: packing by a pattern string"
        for name in ("pack", "unpack")
    },
}


def allow_in_graph(fn: Any) -> Any:
    """Record calls of ``fn`` (or of each function in a list) as one graph node each.

    ember does not trace into it; it must be a function of tensors that fake
    tensors can run. Returns ``fn``, so it works as a decorator.

    >>> def opaque(x):
    ...     return x.sin()
    >>> allow_in_graph(opaque) is opaque, in_graph(opaque)
    (True, True)
    >>> disallow_in_graph(opaque)
    """
    for f in fn if isinstance(fn, list | tuple) else [fn]:
        _user_disallowed.pop(id(f), None)
        _user_allowed[id(f)] = f
    return fn


def disallow_in_graph(fn: Any) -> None:
    """Never record calls of ``fn`` as a graph node: calling it breaks the graph.

    Raises ``ValueError`` for a callable ember would not put in a graph anyway.

    >>> disallow_in_graph(print)
    Traceback (most recent call last):
    ValueError: ember never puts <built-in function print> in a graph; nothing to disallow
    """
    if not in_graph(fn):
        raise ValueError(f"ember never puts {fn!r} in a graph; nothing to disallow")
    _user_allowed.pop(id(fn), None)
    _user_disallowed[id(fn)] = fn
