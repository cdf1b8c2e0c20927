"""Turn real objects read from the frame into symbolic values, with the guards they need.

``wrap(tracer, obj, source)`` is the one place where a real object enters a
translation. The rule for an object is chosen by its type from
:data:`WRAP_RULES` (the first entry whose type matches, in order); each rule
records the guard its use implies: a tensor becomes a graph input guarded on
its metadata, a number a constant guarded on its value, a module or function
an object guarded on its identity.

Objects with no source (made while tracing, or constants of the code) are
wrapped the same way but cannot be guarded, so only immutable Python constants
and tensors-free structures are accepted without one.
"""

from __future__ import annotations

import collections
import enum
import functools
import operator
import types
from collections.abc import Callable
from typing import Any

import torch

from ember.capture import guarding
from ember.capture.codegen import GradModeExit
from ember.capture.tracer import Tracer, Unsupported
from ember.capture.values import (
    BoundV,
    Const,
    DictV,
    FuncV,
    GradExitV,
    ListV,
    MethodV,
    ModuleV,
    ObjV,
    PartialV,
    TupleV,
    Value,
    is_namedtuple_class,
    is_structseq_class,
)

# Python values compared by equality in guards and folded as constants.
CONSTANT_TYPES: tuple[type, ...] = (
    int,
    float,
    bool,
    str,
    bytes,
    complex,
    type(None),
    type(Ellipsis),
    type(NotImplemented),
    torch.dtype,
    torch.device,
    torch.memory_format,
    torch.layout,
    range,
    slice,
    enum.Enum,
    types.CodeType,
)

# Python modules whose attributes are taken as they are, unguarded: ember
# assumes nobody rebinds torch.relu or math.sqrt between calls (as Dynamo does).
TRUSTED_MODULE_PREFIXES = (
    "torch", "math", "operator", "builtins", "functools", "itertools", "ember",
)  # fmt: skip


def is_constant(obj: Any) -> bool:
    """Whether ``obj`` is a constant: an immutable value compared by equality.

    >>> is_constant((1, 2.0, None)), is_constant([1]), is_constant(torch.float32)
    (True, False, True)
    """
    if type(obj) in (tuple, frozenset):
        return all(is_constant(x) for x in obj)
    return isinstance(obj, CONSTANT_TYPES)


def _wrap_tensor(tracer: Tracer, obj: Any, source: Any) -> Value:
    if source is None:
        raise Unsupported("a tensor the frame cannot reach by a source (a constant tensor)")
    if tracer.backend_name != "eager" and own_torch_function(type(obj)):
        # aotgraph would hand its handler aten operations (or none, compiled), not the
        # torch calls eager makes: the frame runs eagerly (the eager backend replays them).
        reason = f"a {type(obj).__name__}, a tensor subclass with its own __torch_function__"
        raise Unsupported(reason, "subclass")
    return tracer.input_tensor(obj, source)


_PLAIN_TORCH_FUNCTIONS = (
    torch.Tensor.__torch_function__.__func__,  # type: ignore[attr-defined]
    torch._C._disabled_torch_function_impl,  # nn.Parameter's
)


def own_torch_function(cls: type) -> bool:
    """Whether a tensor class overrides ``__torch_function__`` (``nn.Parameter`` does not).

    >>> own_torch_function(torch.nn.Parameter), own_torch_function(torch.Tensor)
    (False, False)
    """
    handler = cls.__torch_function__  # type: ignore[attr-defined]
    return getattr(handler, "__func__", handler) not in _PLAIN_TORCH_FUNCTIONS


def _wrap_constant(tracer: Tracer, obj: Any, source: Any) -> Value:
    if type(obj) is float and _argument_source(source):
        return tracer.input_scalar(obj, source)  # a graph input, not a constant
    if (
        type(obj) is float
        and source is not None
        and tracer.shapes.float_changed(guarding.source_key(source), obj)
    ):
        return tracer.input_scalar(obj, source)  # it changed since the last compile
    if type(obj) is int and _argument_source(source):
        symbolic = tracer.input_symint(obj, source)  # a size-like int the policy makes a
        if symbolic is not None:  # symbol (it changed between compiles, or dynamic=True)
            return symbolic
    if source is not None:
        tracer.guards.equals(source, obj)
    return Const(obj, source=source)


def _changed(tracer: Tracer, obj: float, source: Any) -> bool:
    """Whether a float reached through an attribute, a global or a closure changed since
    the last compile of this code (an LR a scheduler sets between optimizer steps): then
    it is a graph input from now on, so that each new value does not compile again."""
    return tracer.shapes.float_changed(guarding.source_key(source), obj)


def _argument_source(source: Any) -> bool:
    """Whether ``source`` is an argument of the frame or an item of one (``L['xs'][2]``).

    Floats reached this way are graph inputs (as in Dynamo, floats are not specialized):
    a value ``.item()`` hands to a resume function changes every call. Floats reached
    through attributes, globals and closures are configuration and stay constants.
    """
    while isinstance(source, guarding.sources.Item):
        source = source.base
    return isinstance(source, guarding.sources.Local)


def _wrap_grad_exit(tracer: Tracer, obj: Any, source: Any) -> Value:
    """The exit of a grad-mode block a graph break split, handed to the resume function."""
    if source is not None:
        tracer.guards.type_of(source, obj)
        tracer.guards.equals(guarding.attr(source, "previous"), obj.previous)
    return GradExitV(obj.previous, source=source)


def _wrap_module(tracer: Tracer, obj: Any, source: Any) -> Value:
    if source is not None:
        tracer.guards.identity(source, obj)
    return ModuleV(obj, source=source)


def _wrap_tuple(tracer: Tracer, obj: Any, source: Any) -> Value:
    if is_constant(obj):
        return _wrap_constant(tracer, obj, source)
    if source is not None:
        tracer.guards.type_of(source, obj)
        tracer.guards.length(source, obj)
    items = tuple(
        wrap(tracer, x, guarding.item(source, i) if source is not None else None)
        for i, x in enumerate(obj)
    )
    if is_namedtuple_class(type(obj)) or is_structseq_class(type(obj)):
        # kept whole from the frame: a subclass's class attributes and instance attributes
        # are read on it (guarded through their source)
        return TupleV(items, cls=type(obj), source=source, real=obj if source else None)
    if type(obj) is not tuple:  # torch.Size, other tuple subclasses: kept as objects
        if isinstance(obj, torch.Size):
            return Const(obj, source=source)
        return ObjV(obj, source=source)
    return TupleV(items, source=source)


def _wrap_list(tracer: Tracer, obj: Any, source: Any) -> Value:
    if type(obj) is not list:  # a subclass: its own methods
        return _wrap_object(tracer, obj, source)
    if id(obj) in tracer.containers:  # the same list reached again: the same value
        return tracer.containers[id(obj)][1]
    if source is not None:
        tracer.guards.type_of(source, obj)
        tracer.guards.length(source, obj)
    items = [
        wrap(tracer, x, guarding.item(source, i) if source is not None else None)
        for i, x in enumerate(obj)
    ]
    value = ListV(tracer.heap.new(items, from_frame=source is not None), source=source)
    tracer.containers[id(obj)] = (obj, value)
    return value


def _wrap_dict(tracer: Tracer, obj: Any, source: Any) -> Value:
    if type(obj) is not dict:  # a subclass (OrderedDict, a ModelOutput): its own methods
        return _wrap_object(tracer, obj, source)
    return wrap_dict_items(tracer, obj, source)


def wrap_dict_items(tracer: Tracer, obj: Any, source: Any) -> DictV:
    """The items of the dict (or dict subclass instance) ``obj`` as one :class:`DictV` per
    trace: its type and keys guarded, each value reached as ``source[key]``."""
    if id(obj) in tracer.rebound_buffers:  # its items would be the buffers before the store
        raise Unsupported("reading a module's _buffers after setting a buffer", "side-effect")
    if id(obj) in tracer.containers:  # the same dict reached again: the same value
        # (before the key scan: its keys were checked when it was first wrapped, and a
        # config's ``__dict__`` is reached again on every attribute read through its
        # Python ``__getattribute__``: 90 keys scanned each time)
        known = tracer.containers[id(obj)][1]
        assert isinstance(known, DictV)
        return known
    if not all(is_constant(k) for k in obj):
        raise Unsupported(f"a dict with non-constant keys ({type(obj).__name__})")
    if source is not None:
        tracer.guards.type_of(source, obj)
        tracer.guards.dict_keys(source, obj)
    item = guarding.item if type(obj) is dict else guarding.dict_item  # past a __getitem__
    items = {
        k: wrap(tracer, v, item(source, k) if source is not None else None)
        for k, v in _base_items(obj)
    }
    value = DictV(tracer.heap.new(items, from_frame=source is not None), source=source)
    if type(obj) is not dict:
        tracer.heap.subclassed.add(value.ref)
    tracer.containers[id(obj)] = (obj, value)
    return value


def _base_items(obj: Any) -> Any:
    """The items of a dict (subclass instance) as its builtin base keeps them, in order."""
    if isinstance(obj, collections.OrderedDict):
        return collections.OrderedDict.items(obj)
    return dict.items(obj)


def _wrap_function(tracer: Tracer, obj: Any, source: Any) -> Value:
    if type(getattr(obj, "__self__", None)) in (list, dict) and source is not None:
        # ``lst.append`` handed to a resume function (a call pending at a break)
        tracer.guards.type_of(source, obj)
        tracer.guards.equals(guarding.attr(source, "__name__"), obj.__name__)
        owner = wrap(tracer, obj.__self__, guarding.attr(source, "__self__"))
        return MethodV(owner, obj.__name__)
    if source is not None:  # torch's too: F.relu = my_relu (and back) is seen
        tracer.guards.identity(source, obj)
    if source is not None and not _trusted(obj):
        if isinstance(obj, types.FunctionType):  # the same function, given other code
            tracer.guards.identity(guarding.attr(source, "__code__"), obj.__code__)
    if isinstance(obj, types.FunctionType) and not _trusted(obj):
        return FuncV(
            obj.__code__, obj.__globals__, fn=obj, closure_cells=obj.__closure__, source=source
        )
    return ObjV(obj, source=source)


# Callable objects whose behaviour is state no source reaches (an itemgetter's keys):
# guarded by identity, so rebinding the name to another one recompiles.
OPAQUE_CALLABLES = (
    operator.itemgetter, operator.attrgetter, operator.methodcaller,
    functools._lru_cache_wrapper,  # its __wrapped__ is traced
)  # fmt: skip
IDENTITY_GUARDED = (type, types.ModuleType, types.BuiltinFunctionType, *OPAQUE_CALLABLES)


def _wrap_object(tracer: Tracer, obj: Any, source: Any) -> Value:
    """Python modules, classes, builtins, torch functions, user objects: kept as objects."""
    if source is not None and not _trusted(obj):
        if isinstance(obj, IDENTITY_GUARDED):
            tracer.guards.identity(source, obj)
        else:
            tracer.guards.type_of(source, obj)
    return ObjV(obj, source=source)


def _trusted(obj: Any) -> bool:
    if not isinstance(obj, type | types.ModuleType) and not hasattr(obj, "__qualname__"):
        return False  # an instance (an itemgetter in a global): guarded like any object
    module = getattr(obj, "__module__", None) or getattr(obj, "__name__", "")
    if isinstance(obj, types.ModuleType):
        module = obj.__name__
    if not isinstance(module, str) or module.startswith("ember.capture.polyfills"):
        return False  # a polyfill's functions and helpers are traced like user code
    return module.split(".")[0] in TRUSTED_MODULE_PREFIXES


def _wrap_bound_method(tracer: Tracer, obj: Any, source: Any) -> Value:
    """A real bound method (``obj.method`` stored somewhere, a classmethod): function + self."""
    if not isinstance(obj.__func__, types.FunctionType):
        return _wrap_object(tracer, obj, source)
    if source is not None:
        tracer.guards.type_of(source, obj)
    func_src = guarding.attr(source, "__func__") if source is not None else None
    self_src = guarding.attr(source, "__self__") if source is not None else None
    return BoundV(wrap(tracer, obj.__func__, func_src), wrap(tracer, obj.__self__, self_src))


def _wrap_partial(tracer: Tracer, obj: Any, source: Any) -> Value:
    if type(obj) is not functools.partial:  # a subclass (ember.compiler.disable, ...)
        return _wrap_object(tracer, obj, source)
    if source is not None:
        tracer.guards.type_of(source, obj)
    args_src = guarding.attr(source, "args") if source is not None else None
    return PartialV(
        wrap(tracer, obj.func, guarding.attr(source, "func") if source is not None else None),
        tuple(
            wrap(tracer, a, guarding.item(args_src, i) if args_src is not None else None)
            for i, a in enumerate(obj.args)
        ),
        # keys guarded, values reached as p.keywords[k]: a changed keyword recompiles
        wrap_dict_items(
            tracer, obj.keywords, guarding.attr(source, "keywords") if source else None
        ),
        source=source,
    )


# (type, rule), tried in order: the first whose type matches wins.
WRAP_RULES: list[tuple[type | tuple[type, ...], Callable[[Tracer, Any, Any], Value]]] = [
    (torch.Tensor, _wrap_tensor),
    (GradModeExit, _wrap_grad_exit),
    (torch.nn.Module, _wrap_module),
    (tuple, _wrap_tuple),
    (CONSTANT_TYPES, _wrap_constant),
    (list, _wrap_list),
    (dict, _wrap_dict),
    ((types.FunctionType, types.BuiltinFunctionType), _wrap_function),
    (types.MethodType, _wrap_bound_method),
    (functools.partial, _wrap_partial),
    (object, _wrap_object),
]


def wrap(tracer: Tracer, obj: Any, source: Any) -> Value:
    """The symbolic value of ``obj``, reached by ``source`` (None if the frame cannot reach it).

    >>> tracer = Tracer(backend_name="eager")
    >>> wrap(tracer, 3, None)
    Const(source=None, value=3)
    """
    for kind, rule in WRAP_RULES:
        if isinstance(obj, kind):
            return rule(tracer, obj, source)
    raise AssertionError("object matches the last rule")  # pragma: no cover
