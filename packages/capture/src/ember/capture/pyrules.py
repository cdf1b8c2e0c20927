"""Python semantics over symbolic values: builtins, container methods, iteration, operators.

Each builtin the translator models has one rule in :data:`BUILTIN_RULES`,
keyed by the builtin object itself. Pure functions (``math``, ``operator``,
most builtins) called with constant arguments are simply evaluated
(:data:`FOLDABLE_MODULES`). Iteration is static: :func:`iterate` returns the
values a ``for`` loop will see, so loops unroll.
"""

from __future__ import annotations

import collections
import math
import operator
import types
from collections.abc import Callable
from typing import Any

import torch

from ember.capture import generators, guarding, markers, nodemeta, polyfills
from ember.capture.builder import is_constant, wrap
from ember.capture.codegen import make_namedtuple
from ember.capture.containers import _module_items
from ember.capture.graphops import graph_call, scalar_call
from ember.capture.tracer import FrameState, Raised, Unsupported
from ember.capture.userobjects import call_special, dict_view
from ember.capture.values import (
    Const,
    DictV,
    ExcV,
    FuncV,
    GenV,
    GradModeV,
    InstanceV,
    IterV,
    ListV,
    MethodV,
    ModuleV,
    ObjV,
    SetV,
    SliceV,
    SymV,
    TensorV,
    TupleV,
    Value,
    ViewV,
)

Args = list[Value]
Kwargs = dict[str, Value]
Rule = Callable[[FrameState, Args, Kwargs], Value]

BUILTIN_RULES: dict[Any, Rule] = {}


def rule(*objs: Any) -> Callable[[Rule], Rule]:
    """Register the decorated function as the rule for calling each of ``objs``."""

    def register(fn: Rule) -> Rule:
        for obj in objs:
            if obj in BUILTIN_RULES:
                raise ValueError(f"{obj!r} already has a rule")
            BUILTIN_RULES[obj] = fn
        return fn

    return register


# -- converting values -------------------------------------------------------------------------


def constant_of(fs: FrameState, v: Value) -> Any:
    """The Python value of a fully constant ``v``; :class:`Unsupported` if it holds tensors.

    A number the graph takes as an input is specialized: from here on the
    translation assumes its value, and guards it.
    """
    if isinstance(v, Const):
        return v.value
    if isinstance(v, SymV):
        return fs.tracer.specialize(v)
    if isinstance(v, SliceV):  # a list or tuple index: the sizes in it specialise
        return slice(*(constant_of(fs, x) for x in v.parts))
    if isinstance(v, TupleV):
        items = tuple(constant_of(fs, x) for x in v.items)
        return make_namedtuple(v.cls, *items) if v.cls is not None else items
    if isinstance(v, ListV):
        return [constant_of(fs, x) for x in fs.tracer.heap.get(v.ref)]
    if isinstance(v, DictV):
        return {k: constant_of(fs, x) for k, x in fs.tracer.heap.get(v.ref).items()}
    if isinstance(v, SetV):
        members = fs.tracer.heap.get(v.ref)
        if any(isinstance(k, Member) for k in members):
            raise Unsupported("a set of modules or tensors where a constant is needed", "constant")
        return set(members)
    if isinstance(v, ObjV) and (is_constant(v.obj) or isinstance(v.obj, IDENTITY_CONSTANTS)):
        return v.obj  # (classes, modules and functions are guarded by identity when read)
    if isinstance(v, ExcV) and not isinstance(v.cls.__init__, types.FunctionType):
        return v.cls(*(constant_of(fs, a) for a in v.args))  # str(e), f"{e}", e.errno
    what = type(v.obj).__name__ if isinstance(v, ObjV) else type(v).__name__
    raise Unsupported(f"a {what} where a constant is needed", "constant")


class Member:
    """A module or tensor as a member of a set made while tracing, compared by identity as
    Python's sets compare them (``Module`` and ``Tensor`` hash by ``id``); a tensor's
    identity in the graph is its node. It keeps the value, source included, for iteration."""

    __slots__ = ("identity", "value")

    def __init__(self, value: ModuleV | TensorV) -> None:
        self.value = value
        self.identity = value.module if isinstance(value, ModuleV) else value.node

    def __hash__(self) -> int:
        return id(self.identity)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Member) and other.identity is self.identity


def key_of(fs: FrameState, v: Value) -> Any:
    """``v`` as a member of a set made while tracing: its constant, or a :class:`Member`
    for a module compared by identity or a tensor. ``named_modules`` and
    ``named_parameters`` keep a ``memo`` set of what they visited and ask only whether it
    holds an object."""
    if (isinstance(v, ModuleV) and _by_identity(type(v.module))) or isinstance(v, TensorV):
        return Member(v)
    return constant_of(fs, v)


def member_value(fs: FrameState, key: Any) -> Value:
    """The value of a set member again (the inverse of :func:`key_of`)."""
    return key.value if isinstance(key, Member) else Const(key)


def _by_identity(cls: type) -> bool:
    plain: tuple[Any, Any] = (object.__hash__, object.__eq__)
    return (cls.__hash__, cls.__eq__) == plain


# Objects that stand for themselves: read from the frame, they are guarded by identity.
IDENTITY_CONSTANTS = (type, types.ModuleType, types.BuiltinFunctionType, types.FunctionType)


def is_const_value(fs: FrameState, v: Value) -> bool:
    try:
        constant_of(fs, v)
    except Unsupported:
        return False
    return True


def as_value(fs: FrameState, obj: Any) -> Value:
    """The value of a Python object computed while tracing (no source)."""
    if isinstance(obj, list):
        return ListV(fs.tracer.heap.new([as_value(fs, x) for x in obj]))
    if isinstance(obj, dict):
        return DictV(fs.tracer.heap.new({k: as_value(fs, x) for k, x in obj.items()}))
    if type(obj) is set:
        return SetV(fs.tracer.heap.new(set(obj)))
    if isinstance(obj, tuple) and type(obj) is tuple and not is_constant(obj):
        return TupleV(tuple(as_value(fs, x) for x in obj))
    return wrap(fs.tracer, obj, None)


# -- truthiness and iteration ------------------------------------------------------------------


def truth(fs: FrameState, v: Value) -> bool:
    """``bool(v)`` when it is known while tracing."""
    if isinstance(v, Const):
        return bool(v.value)
    if isinstance(v, TupleV):
        return bool(v.items)
    if isinstance(v, ListV | DictV | SetV):
        return bool(fs.tracer.heap.get(v.ref))
    if isinstance(v, ViewV):
        return bool(fs.tracer.heap.get(v.of.ref))
    if isinstance(v, TensorV):
        raise Unsupported("branching on a tensor's value", "data-dependent")
    if isinstance(v, SymV):  # guard the condition (``loss > 0``), not the number
        return bool(fs.tracer.specialize(v, None if type(v.example) is bool else operator.truth))
    if isinstance(v, FuncV | MethodV | IterV | GenV | ExcV):
        return True
    if isinstance(v, InstanceV):
        for name in ("__bool__", "__len__"):
            found = _special(fs, v, name, [])
            if found is not None:
                return truth(fs, found)
        if hasattr(v.cls, "__bool__") or hasattr(v.cls, "__len__"):
            raise Unsupported(f"the truth value of a {v.cls.__name__}", "constant")
        return True
    obj = v.module if isinstance(v, ModuleV) else getattr(v, "obj", None)
    cls = type(obj)
    if not hasattr(cls, "__bool__") and not hasattr(cls, "__len__"):
        return True  # plain objects are true
    if isinstance(obj, torch.nn.Module | tuple | type) or is_constant(obj):
        return bool(obj)
    raise Unsupported(f"the truth value of a {cls.__name__}", "constant")


def iterate(fs: FrameState, v: Value) -> list[Value]:
    """The values a ``for`` loop over ``v`` sees, in order (loops are unrolled)."""
    heap = fs.tracer.heap
    if isinstance(v, InstanceV | ObjV):
        found = _special(fs, v, "__iter__", [])
        if found is not None:
            return iterate(fs, found)
    if isinstance(v, TupleV):
        return list(v.items)
    if isinstance(v, ListV):
        return list(heap.get(v.ref))
    if isinstance(v, SetV):
        return [member_value(fs, k) for k in heap.get(v.ref)]
    if isinstance(v, DictV):
        return [Const(k) for k in heap.get(v.ref)]
    if isinstance(v, Const) and isinstance(v.value, frozenset):
        return [Const(x) for x in v.value]
    if isinstance(v, IterV):  # used up
        generators.refresh_dict_iter(fs, v)
        items = list(heap.get(v.ref))
        heap.set(v.ref, [])
        return items
    if isinstance(v, ViewV):  # the dict's items now: a view is not used up
        return view_items(fs, v)
    if isinstance(v, GenV):  # run to its end now, as list(gen) would
        return generators.drain(fs, v)
    if isinstance(v, Const) and isinstance(v.value, tuple | list | range | str | torch.Size):
        return [Const(x) for x in v.value]
    if isinstance(v, TensorV):
        if v.fake.dim() == 0:
            raise Unsupported("iterating over a 0-d tensor", "call")
        return [
            graph_call(fs, "call_function", operator.getitem, [v, Const(i)], {})
            for i in range(v.fake.shape[0])
        ]
    if isinstance(v, ModuleV):
        return _module_items(fs, v)
    if isinstance(v, ObjV) and isinstance(v.obj, tuple):
        src = v.source
        return [
            wrap(fs.tracer, x, guarding.item(src, i) if src is not None else None)
            for i, x in enumerate(v.obj)
        ]
    if isinstance(v, ObjV) and _fixed_view(v):
        # computed while tracing from guarded objects (a signature's parameters): fixed
        return [wrap(fs.tracer, x, None) for x in v.obj]
    raise Unsupported(f"iterating over a {type(v).__name__}", "iteration")


def _fixed_view(v: ObjV) -> bool:
    return v.source is None and type(v.obj) in FIXED_VIEWS


# Read-only views of objects ember computed while tracing (``inspect.signature(f).parameters``
# and its ``keys()``/``values()``/``items()``): nothing can change them during the trace.
FIXED_VIEWS = frozenset(
    {
        types.MappingProxyType,
        type({}.keys()),
        type({}.values()),
        type({}.items()),
        type(collections.OrderedDict().keys()),
        type(collections.OrderedDict().values()),
        type(collections.OrderedDict().items()),
    }
)


def _special(fs: FrameState, v: Value, name: str, args: Args) -> Value | None:
    """``v.name(*args)`` for a special method the class defines in Python (traced); for a
    dict-derived object that inherits it from dict, its items (a :class:`DictV` to apply
    the builtin behaviour to); None for anything else."""
    found = call_special(fs, v, name, args)
    if found is not None:
        return found
    return dict_view(fs, v)


def view_items(fs: FrameState, v: ViewV) -> list[Value]:
    """What iterating the dict view ``v`` gives now."""
    items: dict[Any, Value] = fs.tracer.heap.get(v.of.ref)
    if v.kind == "keys":
        return [Const(k) for k in items]
    if v.kind == "values":
        return list(items.values())
    return [TupleV((Const(k), x)) for k, x in items.items()]


def make_iter(fs: FrameState, values: list[Value]) -> IterV:
    return IterV(fs.tracer.heap.new(list(values)))


def iter_of(fs: FrameState, v: Value) -> Value:
    """``iter(v)``: an iterator is its own; an iterator over a dict (or a view of one) reads
    the dict at each step, so changes made while iterating show as in CPython."""
    if isinstance(v, IterV | GenV):
        return v
    it = make_iter(fs, iterate(fs, v))
    of = v if isinstance(v, DictV) else v.of if isinstance(v, ViewV) else None
    if of is not None:
        kind = v.kind if isinstance(v, ViewV) else "keys"
        fs.tracer.heap.dict_iters[it.ref] = (of.ref, kind, tuple(fs.tracer.heap.get(of.ref)))
    return it


# -- builtins ----------------------------------------------------------------------------------


def _no_kwargs(name: str, kwargs: Kwargs) -> None:
    if kwargs:
        raise Unsupported(f"{name}() with keyword arguments {sorted(kwargs)}", "call")


@rule(len)
def _len(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    (v,) = args
    if isinstance(v, TensorV):
        if v.fake.dim() == 0:
            raise Unsupported("len() of a 0-d tensor", "call")
        return Const(v.fake.shape[0])
    if isinstance(v, ModuleV):
        return Const(len(v.module))  # type: ignore[arg-type]
    if isinstance(v, ObjV) and isinstance(v.obj, tuple):
        return Const(len(v.obj))
    if isinstance(v, InstanceV | ObjV):
        found = _special(fs, v, "__len__", [])
        if found is not None:
            return found if not isinstance(found, DictV) else _len(fs, [found], {})
    if isinstance(v, ObjV) and v.source is None and hasattr(type(v.obj), "__len__"):
        return Const(len(v.obj))  # an object computed while tracing (a signature's parameters)
    return Const(
        len(iterate(fs, v)) if not isinstance(v, IterV) else len(fs.tracer.heap.get(v.ref))
    )


def python_type(fs: FrameState, v: Value) -> type:
    """The Python type of the object ``v`` stands for."""
    if isinstance(v, TensorV):
        real = fs.tracer.real_types.get(v.node)
        return real if real is not None else torch.Tensor
    table: dict[type, Callable[[Any], type]] = {
        Const: lambda x: type(x.value),
        TupleV: lambda x: x.cls or tuple,
        ListV: lambda x: list,
        DictV: lambda x: dict,
        ModuleV: lambda x: type(x.module),
        ObjV: lambda x: type(x.obj),
        FuncV: lambda x: type(x.fn) if x.fn is not None else type(python_type),
        IterV: lambda x: type(iter(())),
        ViewV: lambda x: type(getattr({}, x.kind)()),
        SymV: lambda x: type(x.example),
        SetV: lambda x: set,
        InstanceV: lambda x: x.cls,
        ExcV: lambda x: x.cls,
        GenV: lambda x: types.GeneratorType,
    }
    if type(v) not in table:
        raise Unsupported(f"the type of a {type(v).__name__}", "call")
    return table[type(v)](v)


def as_exception(fs: FrameState, v: Value) -> ExcV:
    """What ``raise v`` raises: an exception made in the trace, or an instance of a class."""
    if isinstance(v, ExcV):
        return v
    cls = v.obj if isinstance(v, ObjV) else v.value if isinstance(v, Const) else None
    if isinstance(cls, type) and issubclass(cls, BaseException):
        return ExcV(cls, ())
    raise Unsupported(
        f"raising a {python_type(fs, v).__name__} made outside the trace", "exception"
    )


@rule(isinstance)
def _isinstance(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    v, cls = args
    return Const(issubclass(python_type(fs, v), class_arg(fs, cls)))


@rule(issubclass)
def _issubclass(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    a, cls = args
    sub = a.obj if isinstance(a, ObjV) else constant_of(fs, a)
    return Const(issubclass(sub, class_arg(fs, cls)))


def class_arg(fs: FrameState, cls: Value) -> Any:
    if isinstance(cls, ObjV):
        return cls.obj
    if isinstance(cls, TupleV):
        return tuple(class_arg(fs, c) for c in cls.items)
    return constant_of(fs, cls)


@rule(type)
def _type(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    if len(args) != 1:
        raise Unsupported("type() with three arguments", "call")
    return ObjV(python_type(fs, args[0]))


@rule(range)
def _range(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    _no_kwargs("range", kwargs)
    return Const(range(*(constant_of(fs, a) for a in args)))


@rule(enumerate)
def _enumerate(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    start = constant_of(fs, kwargs.pop("start", args[1] if len(args) > 1 else Const(0)))
    items = iterate(fs, args[0])
    return make_iter(fs, [TupleV((Const(start + i), x)) for i, x in enumerate(items)])


@rule(zip)
def _zip(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    strict = constant_of(fs, kwargs.pop("strict", Const(False)))
    _no_kwargs("zip", kwargs)
    columns = [iterate(fs, a) for a in args]
    if strict and len({len(c) for c in columns}) > 1:
        raise Unsupported("zip(strict=True) over sequences of different lengths", "call")
    return make_iter(fs, [TupleV(tuple(row)) for row in zip(*columns, strict=False)])


@rule(reversed)
def _reversed(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    return make_iter(fs, list(reversed(iterate(fs, args[0]))))


@rule(iter)
def _iter(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    if isinstance(args[0], GenV):
        return args[0]  # a generator is its own iterator
    if isinstance(args[0], IterV):
        return args[0]
    return iter_of(fs, args[0])


@rule(next)
def _next(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    if not isinstance(args[0], IterV | GenV):
        raise Unsupported("next() of a non-iterator", "call")
    exhausted, value = generators.next_value(fs, args[0])
    if not exhausted:
        return value
    if len(args) > 1:
        return args[1]
    raise Raised(generators.stop_iteration(value), "next() of an exhausted iterator")


@rule(tuple)
def _tuple(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    return TupleV(tuple(iterate(fs, args[0]))) if args else TupleV(())


@rule(list)
def _list(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    return ListV(fs.tracer.heap.new(iterate(fs, args[0]) if args else []))


@rule(dict)
def _dict(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    items: dict[Any, Value] = {}
    if args:
        src = args[0] if isinstance(args[0], DictV) else dict_view(fs, args[0]) or args[0]
        if isinstance(src, DictV):  # a dict, or a dict-derived object's items
            items.update(fs.tracer.heap.get(src.ref))
        else:
            for pair in iterate(fs, src):
                key, value = iterate(fs, pair)
                items[constant_of(fs, key)] = value
    items.update(kwargs)
    return DictV(fs.tracer.heap.new(items))


@rule(set, frozenset)
def _set(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    _no_kwargs("set", kwargs)
    values = iterate(fs, args[0]) if args else []
    if fs.tracer.calling is frozenset:
        return Const(frozenset(constant_of(fs, v) for v in values))
    items = [key_of(fs, v) for v in values]
    return SetV(fs.tracer.heap.new(set(items)))


@rule(sum)
def _sum(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    total: Value = args[1] if len(args) > 1 else kwargs.get("start", Const(0))
    for item in iterate(fs, args[0]):
        total = pyitems.binary(fs, operator.add, total, item)
    return total


@rule(any, all)
def _any_all(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    """Stops at the first item that decides, as CPython does (a generator is resumed no
    further, so its later items, side effects and errors never happen)."""
    decisive = _called_name(fs) == "any"  # any(): a true item decides; all(): a false one
    it = args[0] if isinstance(args[0], GenV) else make_iter(fs, iterate(fs, args[0]))
    while True:
        exhausted, item = generators.next_value(fs, it)
        if exhausted:
            return Const(not decisive)
        if truth(fs, item) == decisive:
            return Const(decisive)


def _called_name(fs: FrameState) -> str:
    return fs.tracer.calling.__name__ if fs.tracer.calling is not None else ""


@rule(min, max)
def _min_max(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    values = iterate(fs, args[0]) if len(args) == 1 else args
    if any(isinstance(v, TensorV) for v in values):
        raise Unsupported(
            "min()/max() over tensors compares values (use torch.minimum)", "data-dependent"
        )
    fn = min if _called_name(fs) == "min" else max
    if is_numeric(values) and not kwargs and len(values) > 1:
        return scalar_call(fs, fn, values)
    return Const(
        fn(
            *(constant_of(fs, v) for v in values),
            **{k: constant_of(fs, v) for k, v in kwargs.items()},
        )
    )


@rule(abs)
def _abs(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    (v,) = args
    if isinstance(v, TensorV):
        return graph_call(fs, "call_function", torch.abs, [v], {})
    if is_numeric([v]):
        return scalar_call(fs, abs, [v])
    return Const(abs(constant_of(fs, v)))


@rule(getattr)
def _getattr(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    from ember.capture.attrs import load_attr

    name = constant_of(fs, args[1])
    if len(args) == 3:
        try:
            return load_attr(fs, args[0], name)
        except Raised as e:
            if not _raised(e, AttributeError):
                raise
            return args[2]
    return load_attr(fs, args[0], name)


def _raised(e: Raised, cls: type[BaseException]) -> bool:
    return isinstance(e.exc, ExcV) and issubclass(e.exc.cls, cls)


@rule(hasattr)
def _hasattr(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    from ember.capture.attrs import load_attr

    try:
        load_attr(fs, args[0], constant_of(fs, args[1]))
    except Raised as e:
        if _raised(e, AttributeError):
            return Const(False)
        raise
    return Const(True)


@rule(callable)
def _callable(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    # callable(x) asks whether x's type defines __call__ (its MRO, not its metaclass)
    return Const(any("__call__" in c.__dict__ for c in python_type(fs, args[0]).__mro__))


@rule(float, int, bool, str)
def _convert(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    fn = fs.tracer.calling
    assert fn is not None
    if args and isinstance(args[0], TensorV):
        raise Unsupported(f"{fn.__name__}() of a tensor reads its value", "data-dependent")
    if fn is bool and args:
        return Const(truth(fs, args[0]))
    if fn in (float, int) and len(args) == 1 and not kwargs and is_numeric(args):
        return scalar_call(fs, fn, args)
    return Const(fn(*(constant_of(fs, a) for a in args)))


@rule(print)
def _print(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    raise Unsupported(
        "call to builtin print", "side-effect", "print outside compiled code, or return the value"
    )


@rule(torch.no_grad, torch.enable_grad)
def _grad_mode(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    if args or kwargs:
        raise Unsupported("no_grad()/enable_grad() with arguments", "call")
    enabled = fs.tracer.calling is torch.enable_grad
    return GradModeV(enabled, fs.tracer.grad_enabled, applied=False)


@rule(torch.is_grad_enabled)
def _is_grad_enabled(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    """Known while tracing: the frame's guards fix the mode it starts in, and the graph's
    own mode changes are tracked (``Tracer.grad_enabled``)."""
    _no_kwargs("is_grad_enabled", kwargs)
    return Const(fs.tracer.grad_enabled)


@rule(torch.set_grad_enabled)
def _set_grad_enabled(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    (mode,) = [*args, *kwargs.values()]
    previous = fs.tracer.grad_enabled
    fs.tracer.set_grad_enabled(bool(constant_of(fs, mode)))  # it takes effect when called
    return GradModeV(fs.tracer.grad_enabled, previous, applied=True)


@rule(markers.graph_break)
def _graph_break(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    raise Unsupported("graph_break() called", "graph-break")


@rule(markers.checkpoint_region)
def _checkpoint_region(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    enter = bool(constant_of(fs, [*args, *kwargs.values()][0]))
    (nodemeta.enter_checkpoint if enter else nodemeta.leave_checkpoint)(fs.tracer)
    return Const(None)


@rule(markers.is_compiling)
def _is_compiling(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    return Const(True)


FOLDABLE_MODULES = ("math", "operator", "builtins", "_operator")

# Kinds of callables with a rule of their own, by a test on the callable (a namedtuple
# class, a user class, an itemgetter): filled by ``pyobjects``; tried in order.
ObjectRule = Callable[[FrameState, Any, Args, Kwargs], Value]
OBJECT_KINDS: list[tuple[Callable[[Any], bool], ObjectRule]] = []


def call_python_object(fs: FrameState, obj: Any, args: Args, kwargs: Kwargs) -> Value:
    """Call a Python callable that is not a torch operation and not inlined user code."""
    if isinstance(obj, type) and issubclass(obj, BaseException) and not kwargs:
        return ExcV(obj, tuple(args))  # raised next, most likely: rebuilt at the raise
    replacement = polyfills.lookup(obj)
    if replacement is not None:  # library code written as Python ember steps through
        from ember.capture.calls import call_value

        return call_value(fs, wrap(fs.tracer, replacement, None), args, kwargs)
    for matches, call in OBJECT_KINDS:
        if matches(obj):
            return call(fs, obj, args, kwargs)
    if isinstance(obj, markers.Disabled):
        name = getattr(obj, "__qualname__", repr(obj))  # the user's function, as named
        raise Unsupported(f"call to {name}, disabled with ember.compiler.disable", "disabled")
    if markers.is_assumed_constant(obj):
        return _fold(fs, obj, args, kwargs)  # unguarded, as the user promised
    lazy = polyfills.lazy_builtin(obj) if _hashable(obj) else None
    if lazy is not None and any(isinstance(a, GenV) for a in args):
        # over a generator: a generator of its own, so each item is made when consumed
        from ember.capture.calls import function_value, inline

        return inline(fs, function_value(fs, lazy, None), args, kwargs)
    rule_fn = BUILTIN_RULES.get(obj) if _hashable(obj) else None
    if rule_fn is not None:
        previous, fs.tracer.calling = fs.tracer.calling, obj
        try:
            return rule_fn(fs, list(args), dict(kwargs))
        finally:
            fs.tracer.calling = previous
    module = getattr(obj, "__module__", None) or ""
    if isinstance(obj, type) and obj in (torch.Size, slice, complex, torch.finfo, torch.iinfo):
        module = "builtins"
    if _hashable(obj) and obj in SCALAR_FUNCTIONS and is_numeric(args) and not kwargs:
        return scalar_call(fs, obj, args)  # math on numbers the graph takes as inputs
    if module.split(".")[0] in FOLDABLE_MODULES and all(
        is_const_value(fs, a) for a in [*args, *kwargs.values()]
    ):
        return _fold(fs, obj, args, kwargs)
    if obj is operator.getitem and len(args) == 2 and not kwargs:
        return pyitems.subscript(fs, args[0], args[1])
    if obj is operator.setitem and len(args) == 3 and not kwargs:
        pyitems.store_subscript(fs, args[0], args[1], args[2])
        return Const(None)
    containers = (ListV, DictV, TupleV)
    if (
        _hashable(obj)
        and obj in OPERATOR_TENSOR_FUNCTIONS
        and any(isinstance(a, TensorV) for a in args)
        and not any(isinstance(a, containers) for a in args)
    ):
        return graph_call(fs, "call_function", obj, args, kwargs)
    name = getattr(obj, "__qualname__", None) or repr(obj)
    raise Unsupported(f"calling {name} (not a torch operation ember can record)", "call")


# Functions of numbers that stay in the graph when an argument is a graph input.
SCALAR_FUNCTIONS = frozenset(
    [abs, float, int, round, pow]
    + [getattr(math, n) for n in dir(math) if callable(getattr(math, n))]
    + [getattr(operator, n) for n in dir(operator) if not n.startswith("_")]
)


def is_numeric(values: Args) -> bool:
    """Some of ``values`` are numbers the graph takes as inputs, the rest plain numbers."""
    return any(isinstance(v, SymV) for v in values) and all(
        isinstance(v, SymV) or (isinstance(v, Const) and type(v.value) in (int, float, bool))
        for v in values
    )


def _fold(fs: FrameState, obj: Any, args: Args, kwargs: Kwargs) -> Value:
    try:
        result = obj(
            *(constant_of(fs, a) for a in args),
            **{k: constant_of(fs, v) for k, v in kwargs.items()},
        )
    except Exception as e:
        reason = f"{getattr(obj, '__name__', obj)}() raised {type(e).__name__}: {e}"
        if type(e).__module__ != "builtins" or not all(is_constant(a) for a in e.args):
            raise Unsupported(reason) from e
        # A builtin on constants raised: so would eager (what it read is guarded).
        raise Raised(ExcV(type(e), tuple(Const(a) for a in e.args)), reason) from None
    return as_value(fs, result)


def _hashable(obj: Any) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True


# -- operators ---------------------------------------------------------------------------------

OPERATOR_TENSOR_FUNCTIONS = frozenset(
    getattr(operator, name) for name in dir(operator) if not name.startswith("_")
)


def _mutate(fs: FrameState, v: ListV | DictV) -> Any:
    """The heap content of a container about to be mutated.

    A list or dict the frame was given is mutated in the heap and written back whole
    after the graph runs (a recorded side effect); one with no source cannot be.
    """
    if v.ref in fs.tracer.heap.from_frame:
        if v.source is None:
            raise Unsupported("mutating a list or dict ember cannot reach again", "side-effect")
        if not any(e[0] == "container" and e[1].ref == v.ref for e in fs.tracer.effects):
            fs.tracer.effects.append(("container", v))
    return fs.tracer.heap.get(v.ref)


@rule(setattr)
def _setattr(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    from ember.capture.attrs import store_attr

    _no_kwargs("setattr", kwargs)
    obj, name, value = args
    store_attr(fs, obj, constant_of(fs, name), value)
    return Const(None)


__all__ = [
    "BUILTIN_RULES",
    "OBJECT_KINDS",
    "call_python_object",
    "constant_of",
    "iterate",
    "truth",
]

# The rules of pyobjects register themselves here (it needs this module's helpers).
from ember.capture import pyitems, pyobjects  # noqa: E402, F401
