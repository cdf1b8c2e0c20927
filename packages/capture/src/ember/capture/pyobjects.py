"""Rules for Python objects: namedtuples, user classes, operator getters, list and dict methods.

The companion of :mod:`ember.capture.pyrules` (builtins, operators, subscripts): its
rules register themselves in ``pyrules.BUILTIN_RULES`` (by callable) and
``pyrules.OBJECT_KINDS`` (by a test on the callable), so ``call_python_object``
finds them. Objects made here live in the translation's heap (``InstanceV``) or
inline (a namedtuple's ``TupleV``) and are made for real only if they outlive the
graph (see ``userobjects.make_instance``).

>>> import collections
>>> Pair = collections.namedtuple("Pair", "a b")
>>> any(matches(Pair) for matches, _ in OBJECT_KINDS)
True
"""

from __future__ import annotations

import collections
import functools
import inspect
import operator
import types
from collections.abc import Callable
from typing import Any

import torch

from ember.capture import guarding, trace_rules
from ember.capture.builder import TRUSTED_MODULE_PREFIXES, wrap
from ember.capture.pyitems import delete_subscript, store_subscript, subscript
from ember.capture.pyrules import (
    FIXED_VIEWS,
    OBJECT_KINDS,
    Args,
    Kwargs,
    _dict,
    _fold,
    _mutate,
    _no_kwargs,
    as_exception,
    as_value,
    call_python_object,
    class_arg,
    constant_of,
    is_const_value,
    iterate,
    key_of,
    make_iter,
    rule,
    truth,
)
from ember.capture.tracer import FrameState, Raised, Unsupported
from ember.capture.userobjects import BUILTIN_DICTS, DICT_BASES, class_of, dict_base, dict_view
from ember.capture.values import (
    BoundV,
    CellV,
    Const,
    DictV,
    ExcV,
    FuncV,
    GenV,
    InstanceV,
    ListV,
    MethodV,
    ModeV,
    ModuleV,
    ObjV,
    PartialV,
    SetV,
    SuperV,
    TupleV,
    Value,
    ViewV,
    is_namedtuple_class,
    is_plain_class,
)

__all__ = ["GETTER_RULES", "call_python_method"]


def _itemgetter(fs: FrameState, getter: Any, target: Value) -> Value:
    keys = getter.__reduce__()[1]
    items = [subscript(fs, target, as_value(fs, k)) for k in keys]
    return items[0] if len(items) == 1 else TupleV(tuple(items))


def _attrgetter(fs: FrameState, getter: Any, target: Value) -> Value:
    from ember.capture.attrs import load_attr

    found = []
    for dotted in getter.__reduce__()[1]:
        value = target
        for name in dotted.split("."):
            value = load_attr(fs, value, name)
        found.append(value)
    return found[0] if len(found) == 1 else TupleV(tuple(found))


def _methodcaller(fs: FrameState, caller: Any, target: Value) -> Value:
    from ember.capture.attrs import load_attr
    from ember.capture.calls import call_value

    maker, args = caller.__reduce__()
    spelled: list[Any] = [*getattr(maker, "args", ()), *args]
    name, rest = spelled[0], spelled[1:]
    keywords: dict[str, Any] = getattr(maker, "keywords", {})
    method = load_attr(fs, target, name)
    values = [as_value(fs, a) for a in rest]
    return call_value(fs, method, values, {k: as_value(fs, v) for k, v in keywords.items()})


# Callable objects of these types are followed: ``itemgetter(0, 2)(xs)`` reads xs[0], xs[2].
GETTER_RULES: dict[type, Callable[[FrameState, Any, Value], Value]] = {
    operator.itemgetter: _itemgetter,
    operator.attrgetter: _attrgetter,
    operator.methodcaller: _methodcaller,
}


@rule(functools.reduce)
def _reduce(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    """``functools.reduce(fn, items[, initial])`` over a static sequence, calls inlined."""
    from ember.capture.calls import call_value

    _no_kwargs("reduce", kwargs)
    fn, items_value, *initial = args
    items = iterate(fs, items_value)
    if not initial and not items:
        raise Unsupported("reduce() of an empty sequence with no initial value")
    acc, rest = (initial[0], items) if initial else (items[0], items[1:])
    for item in rest:
        acc = call_value(fs, fn, [acc, item], {})
    return acc


def _instantiate(fs: FrameState, cls: type, args: Args, kwargs: Kwargs) -> Value:
    """``cls(*args, **kwargs)`` for a plain user class: a new instance, ``__init__`` inlined."""
    from ember.capture.calls import function_value, inline

    heap = fs.tracer.heap
    items = heap.new({}) if dict_base(cls) is not None else None
    instance = InstanceV(cls, heap.new({}), items)
    init: Any = getattr(cls, "__init__")  # noqa: B009 (mypy: an instance's __init__ is unsound)
    if init is object.__init__:
        if args or kwargs:
            raise Unsupported(f"{cls.__name__}() takes no arguments")
        return instance
    if items is not None and init in _DICT_INITS:
        if init is collections.defaultdict.__init__:  # defaultdict(factory, *args, **kwargs)
            args = _set_factory(fs, instance, args)
        _dict_method(fs, DictV(items), "update", args, kwargs)  # dict(*args, **kwargs)
        return instance
    if not trace_rules.traceable(init):
        raise Unsupported(f"{cls.__name__}.__init__ is not Python code ember follows", "call")
    init_value = function_value(fs, init, None)
    if not _is_none(inline(fs, init_value, [instance, *args], kwargs)):
        raise Unsupported(f"{cls.__name__}.__init__ returned a value")
    return instance


def _set_factory(fs: FrameState, instance: Value, args: Args) -> Args:
    """``defaultdict.__init__(instance, factory, *rest)``: the factory stored; ``rest``."""
    if not isinstance(instance, InstanceV):
        raise Unsupported("defaultdict.__init__ of an object made outside the trace", "call")
    factory, *rest = args or [Const(None)]
    fs.tracer.heap.get(instance.ref)["default_factory"] = factory
    return rest


_DICT_INITS = (dict.__init__, collections.OrderedDict.__init__, collections.defaultdict.__init__)


def _is_none(v: Value) -> bool:
    return isinstance(v, Const) and v.value is None


@rule(tuple.__new__)
def _tuple_new(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    """``tuple.__new__(cls, items)``, as a namedtuple's ``__new__`` does."""
    _no_kwargs("tuple.__new__", kwargs)
    cls: Any = (
        constant_of(fs, args[0]) if isinstance(args[0], Const) else getattr(args[0], "obj", None)
    )
    items = tuple(iterate(fs, args[1])) if len(args) > 1 else ()
    if cls is tuple:
        return TupleV(items)
    if not is_namedtuple_class(cls) or len(items) != len(cls._fields):
        raise Unsupported("tuple.__new__ of a class other than a namedtuple's", "call")
    return TupleV(items, cls=cls)


@rule(object.__setattr__)
def _object_setattr(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    """``object.__setattr__(instance, name, value)``, as a frozen dataclass's ``__init__`` does."""
    _no_kwargs("object.__setattr__", kwargs)
    target, name, value = args
    if isinstance(target, InstanceV):
        fs.tracer.heap.get(target.ref)[constant_of(fs, name)] = value
    else:
        from ember.capture.attrs import store_attr

        store_attr(fs, target, constant_of(fs, name), value, raw=True)
    return Const(None)


@rule(object.__init__)
def _object_init(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    """``object.__init__(self)``, as ``super().__init__()`` reaches it."""
    if len(args) != 1 or kwargs:
        raise Unsupported("object.__init__() takes exactly one argument (the instance)")
    return Const(None)


@rule(object.__getattribute__)
def _object_getattribute(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    """``object.__getattribute__(obj, name)``: the attribute, past any ``__getattribute__``
    the class defines (as a class's own override calls it)."""
    from ember.capture import attrs

    _no_kwargs("object.__getattribute__", kwargs)
    target, name = args[0], constant_of(fs, args[1])
    if isinstance(target, ObjV | ModuleV):
        real = target.obj if isinstance(target, ObjV) else target.module
        src = guarding.generic_attr(target.source, name) if target.source is not None else None
        return attrs.generic_attr(fs, target, real, name, src, use_getattr=False)
    if isinstance(target, InstanceV):
        return attrs.instance_attr(fs, target, name, use_getattr=False)
    return attrs.load_attr(fs, target, name)


@rule(delattr, object.__delattr__)
def _delattr(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    """``delattr(obj, name)`` (``object.__delattr__`` skips the class's own override)."""
    from ember.capture import attrs

    _no_kwargs("delattr", kwargs)
    target, name = args[0], constant_of(fs, args[1])
    if fs.tracer.calling is object.__delattr__ and isinstance(target, InstanceV):
        own = fs.tracer.heap.get(target.ref)
        if name not in own:
            raise attrs.no_attribute(f"{target.cls.__name__} object", name)
        del own[name]
    else:
        attrs.delete_attr(fs, target, name)
    return Const(None)


@rule(object.__new__)
def _object_new(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    """``object.__new__(cls)`` for a class ember instantiates (``copy`` makes objects so):
    a new instance, no ``__init__`` run."""
    cls: Any = class_arg(fs, args[0]) if args else None
    if len(args) != 1 or kwargs or not _user_class(cls):
        raise Unsupported("object.__new__ of a class ember does not make", "call")
    heap = fs.tracer.heap
    return InstanceV(cls, heap.new({}), heap.new({}) if dict_base(cls) is not None else None)


def _namedtuple(fs: FrameState, cls: Any, args: Args, kwargs: Kwargs) -> Value:
    """``Pair(a, b=...)``: the fields bound as the class's ``__new__`` binds them."""
    fields: tuple[str, ...] = cls._fields
    bound: dict[str, Value] = dict(zip(fields, args, strict=False))
    for name, value in kwargs.items():
        if name not in fields or name in bound:
            raise Unsupported(f"{cls.__name__}() got an unexpected or repeated argument {name!r}")
        bound[name] = value
    for name, default in cls._field_defaults.items():
        bound.setdefault(name, Const(default))
    if len(args) > len(fields) or set(bound) != set(fields):
        raise Unsupported(f"{cls.__name__}() called with the wrong arguments")
    return TupleV(tuple(bound[name] for name in fields), cls=cls)


def _call_getter(fs: FrameState, getter: Any, args: Args, kwargs: Kwargs) -> Value:
    if len(args) != 1 or kwargs:
        raise Unsupported(f"{type(getter).__name__} called with {len(args)} arguments", "call")
    return GETTER_RULES[type(getter)](fs, getter, args[0])


def _user_class(obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or ""
    polyfill = module.startswith("ember.capture.polyfills.")
    return is_plain_class(obj) and (polyfill or module.split(".")[0] not in TRUSTED_MODULE_PREFIXES)


def _call_cached(fs: FrameState, wrapper: Any, args: Args, kwargs: Kwargs) -> Value:
    """A function wrapped by ``functools.lru_cache``/``cache`` (identity-guarded): its
    ``__wrapped__`` traced, with constants or tensors alike. What one caches is a pure
    function, so the call's value is the cache's; the real cache is neither read nor filled."""
    from ember.capture.calls import call_value

    return call_value(fs, wrap(fs.tracer, wrapper.__wrapped__, None), args, kwargs)


OBJECT_KINDS.extend(
    [
        (lambda obj: type(obj) is functools._lru_cache_wrapper, _call_cached),
        (is_namedtuple_class, _namedtuple),
        (lambda obj: type(obj) in GETTER_RULES, _call_getter),
        (_user_class, _instantiate),
        (lambda obj: obj in BUILTIN_DICTS, _instantiate),  # OrderedDict(), defaultdict(list)
    ]
)


# -- functional builtins ---------------------------------------------------------------------


@rule(super)
def _super(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    if args:  # super(cls, obj)
        cls, obj = args
        return SuperV(class_arg(fs, cls), obj)
    cell = fs.cells.get("__class__")  # zero-argument super(): the method's class and self
    if not isinstance(cell, CellV) or not fs.code.co_argcount:
        raise Unsupported("super() outside a method", "call")
    from ember.capture.calls import materialize

    cls = materialize(fs, fs.tracer.heap.get(cell.ref))
    name = fs.code.co_varnames[0]
    first = fs.locals.get(name, Const(None))
    self_cell = fs.cells.get(name)
    if isinstance(self_cell, CellV):  # self is also a closure's: CPython reads the cell
        first = fs.tracer.heap.get(self_cell.ref)
    first = materialize(fs, first)
    if not isinstance(cls, ObjV) or not isinstance(cls.obj, type):
        raise Unsupported("super() without a class", "call")
    return SuperV(cls.obj, first)


@rule(functools.partial)
def _partial(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    func, rest, keywords = args[0], list(args[1:]), dict(kwargs)
    if isinstance(func, PartialV):  # a partial of a partial is flattened, as CPython does
        keywords = {**fs.tracer.heap.get(func.kwargs.ref), **keywords}
        rest = [*func.args, *rest]
        func = func.func
    return PartialV(func, tuple(rest), DictV(fs.tracer.heap.new(keywords)))


@rule(map)
def _map(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    from ember.capture.calls import call_value

    fn, *iterables = args
    columns = [iterate(fs, it) for it in iterables]
    rows = zip(*columns, strict=False)
    return make_iter(fs, [call_value(fs, fn, list(row), {}) for row in rows])


@rule(sorted)
def _sorted(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    """``sorted(items, key=..., reverse=...)`` over a static sequence: the keys must be known
    while tracing (``key=len`` on strings, a lambda reading constants); the items may be
    anything, tensors included."""
    from ember.capture.calls import call_value

    (items_value,) = args
    if set(kwargs) - {"key", "reverse"}:
        raise Unsupported(f"sorted() with keyword arguments {sorted(kwargs)}", "call")
    items = iterate(fs, items_value)
    key = kwargs.get("key")
    if key is not None and not (isinstance(key, Const) and key.value is None):
        keys = [constant_of(fs, call_value(fs, key, [item], {})) for item in items]
    else:
        keys = [constant_of(fs, item) for item in items]
    reverse = bool(constant_of(fs, kwargs.get("reverse", Const(False))))
    order = sorted(range(len(items)), key=keys.__getitem__, reverse=reverse)
    return ListV(fs.tracer.heap.new([items[i] for i in order]))


@rule(filter)
def _filter(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    from ember.capture.calls import call_value

    fn, iterable = args
    identity = isinstance(fn, Const) and fn.value is None

    def keep(item: Value) -> bool:
        return truth(fs, item if identity else call_value(fs, fn, [item], {}))

    return make_iter(fs, [item for item in iterate(fs, iterable) if keep(item)])


# -- methods of Python values ------------------------------------------------------------------


def call_python_method(
    fs: FrameState, self_value: Value, name: str, args: Args, kwargs: Kwargs
) -> Value:
    """A method of a list, dict, tuple or constant."""
    heap = fs.tracer.heap
    if isinstance(self_value, ListV):
        return _list_method(fs, self_value, name, args, kwargs)
    if isinstance(self_value, DictV):
        return _dict_method(fs, self_value, name, args, kwargs)
    if isinstance(self_value, SetV):
        return _set_method(fs, self_value, name, args, kwargs)
    if isinstance(self_value, GenV):
        return _generator_method(fs, self_value, name, args)
    if isinstance(self_value, TupleV) and name in ("index", "count"):
        return _fold(fs, getattr(tuple, name), [TupleV(self_value.items), *args], kwargs)
    if isinstance(self_value, Const):
        method = getattr(type(self_value.value), name, None)
        if method is not None and all(is_const_value(fs, a) for a in [*args, *kwargs.values()]):
            return _fold(fs, method, [self_value, *args], kwargs)
    view = dict_view(fs, self_value)
    if view is not None and _is_builtin_method(getattr(class_of(self_value), name, None)):
        return _dict_method(fs, view, name, args, kwargs)  # dict's own method, on the items
    if isinstance(self_value, ModuleV | ObjV):
        obj = self_value.module if isinstance(self_value, ModuleV) else self_value.obj
        return call_python_object(fs, getattr(obj, name), args, kwargs)
    del heap
    raise Unsupported(f"method {name}() of a {type(self_value).__name__}", "call")


def _is_builtin_method(fn: Any) -> bool:
    return isinstance(
        fn, types.MethodDescriptorType | types.WrapperDescriptorType | types.BuiltinFunctionType
    )


def _dict_base_method(obj: Any) -> bool:
    """``dict.__setitem__``, ``OrderedDict.get``, ...: a builtin dict method, unbound."""
    return _is_builtin_method(obj) and getattr(obj, "__objclass__", None) in DICT_BASES


def _call_dict_base_method(fs: FrameState, method: Any, args: Args, kwargs: Kwargs) -> Value:
    """``dict.__setitem__(obj, k, v)`` (as ``super().__setitem__(k, v)`` calls it) on the
    items of a dict-derived object."""
    view = dict_view(fs, args[0]) if args else None
    if view is None:
        view = args[0] if args and isinstance(args[0], DictV) else None
    if view is None:
        raise Unsupported(f"{method.__qualname__} on a {type(args[0]).__name__}", "call")
    rest = args[1:]
    if method is collections.defaultdict.__init__:  # super().__init__(factory, ...)
        rest = _set_factory(fs, args[0], rest)
    return _dict_method(fs, view, method.__name__, rest, kwargs)


OBJECT_KINDS.append((_dict_base_method, _call_dict_base_method))


def _list_method(fs: FrameState, lst: ListV, name: str, args: Args, kwargs: Kwargs) -> Value:
    heap = fs.tracer.heap
    items: list[Value] = heap.get(lst.ref)
    if name in ("index", "count", "__len__", "__contains__"):
        return _fold(fs, getattr(list, name), [lst, *args], kwargs)
    if name == "copy":
        return ListV(heap.new(list(items)))
    mutators: dict[str, Callable[[list[Value]], Any]] = {
        "append": lambda it: it.append(args[0]),
        "extend": lambda it: it.extend(iterate(fs, args[0])),
        "insert": lambda it: it.insert(constant_of(fs, args[0]), args[1]),
        "pop": lambda it: it.pop(*(constant_of(fs, a) for a in args)),
        "reverse": lambda it: it.reverse(),
        "clear": lambda it: it.clear(),
        "remove": lambda it: it.pop(_index_of(fs, it, args[0])),
    }
    if name not in mutators:
        raise Unsupported(f"list.{name}() inside compiled code", "call")
    result = mutators[name](_mutate(fs, lst))
    return result if isinstance(result, Value) else Const(None)


def _generator_method(fs: FrameState, g: GenV, name: str, args: Args) -> Value:
    """``send``, ``throw``, ``close``, ``__next__`` of a generator ember runs."""
    from ember.capture import generators

    if name == "close":
        return generators.close(fs, g)
    if name == "__iter__":
        return g
    if name == "throw":  # throw(exc) or throw(type, value[, tb])
        given = args[1] if len(args) > 1 and not _is_none(args[1]) else args[0]
        done, value = generators.throw(fs, g, as_exception(fs, given))
    elif name in ("send", "__next__"):
        done, value = generators.resume(fs, g, args[0] if args else Const(None))
    else:
        raise Unsupported(f"generator.{name}() inside compiled code", "call")
    if done:
        raise Raised(generators.stop_iteration(value))
    return value


def _index_of(fs: FrameState, items: list[Value], wanted: Value) -> int:
    """Where ``list.remove``/``index`` finds ``wanted``: items before it must be comparable
    while tracing (constants), as the comparison of a tensor would read its values."""
    target = constant_of(fs, wanted)
    for i, item in enumerate(items):
        if constant_of(fs, item) == target:
            return i
    raise Unsupported("list.remove(x): x not in list")


_MEMBER_ARG = ("add", "discard", "remove", "__contains__")  # one element, not a collection


def _set_method(fs: FrameState, s: SetV, name: str, args: Args, kwargs: Kwargs) -> Value:
    """A method of a set of constants: mutators change the heap's set, the rest fold."""
    target: set[Any] = fs.tracer.heap.get(s.ref)
    values = [key_of(fs, a) if name in _MEMBER_ARG else constant_of(fs, a) for a in args]
    if name in ("add", "discard", "remove", "update", "clear", "difference_update"):
        getattr(target, name)(*values)
        return Const(None)
    if name in ("union", "intersection", "difference", "symmetric_difference", "copy"):
        return SetV(fs.tracer.heap.new(getattr(target, name)(*values)))
    if name in ("issubset", "issuperset", "isdisjoint", "__contains__", "__len__"):
        return Const(getattr(target, name)(*values))
    raise Unsupported(f"set.{name}() inside compiled code", "call")


def _dict_method(fs: FrameState, d: DictV, name: str, args: Args, kwargs: Kwargs) -> Value:
    heap = fs.tracer.heap
    items: dict[Any, Value] = heap.get(d.ref)
    if name in ("keys", "values", "items"):
        return ViewV(d, name)
    if name == "get":
        key = constant_of(fs, args[0])
        return items.get(key, args[1] if len(args) > 1 else Const(None))
    if name == "copy":
        return DictV(heap.new(dict(items)))
    if name == "update":
        other = _dict(fs, args, kwargs)
        assert isinstance(other, DictV)
        _mutate(fs, d).update(heap.get(other.ref))
        return Const(None)
    if name == "pop":
        return _mutate(fs, d).pop(constant_of(fs, args[0]), *args[1:])  # type: ignore[no-any-return]
    if name == "setdefault":
        default = args[1] if len(args) > 1 else Const(None)
        value: Value = _mutate(fs, d).setdefault(constant_of(fs, args[0]), default)
        return value
    if name == "clear":
        _mutate(fs, d).clear()
        return Const(None)
    if name in ("popitem", "move_to_end"):  # dict's and OrderedDict's (reached only by those)
        return _reorder(fs, d, name, args, kwargs)
    if name in _DICT_SPECIALS:
        return _DICT_SPECIALS[name](fs, d, *args)
    raise Unsupported(f"dict.{name}() inside compiled code", "call")


def _reorder(fs: FrameState, d: DictV, name: str, args: Args, kwargs: Kwargs) -> Value:
    """``popitem(last=True)`` and ``move_to_end(key, last=True)``; a plain dict's
    ``popitem()`` takes the last item, as an OrderedDict's does by default."""
    items: dict[Any, Value] = fs.tracer.heap.get(d.ref)
    if name == "popitem":
        last = constant_of(fs, args[0] if args else kwargs.get("last", Const(True)))
        if not items:
            raise Unsupported("popitem() of an empty dict", "call")
        key = next(reversed(items)) if last else next(iter(items))
        return TupleV((Const(key), _mutate(fs, d).pop(key)))
    key = constant_of(fs, args[0])
    last = constant_of(fs, args[1] if len(args) > 1 else kwargs.get("last", Const(True)))
    if key not in items:
        raise Raised(ExcV(KeyError, (Const(key),)), f"KeyError: {key!r}")
    moved = _mutate(fs, d)
    value, rest = moved.pop(key), {} if last else dict(moved)
    if not last:
        moved.clear()
    moved[key] = value
    moved.update(rest)
    return Const(None)


def _dict_setitem(fs: FrameState, d: DictV, key: Value, value: Value) -> Value:
    store_subscript(fs, d, key, value)
    return Const(None)


def _dict_delitem(fs: FrameState, d: DictV, key: Value) -> Value:
    delete_subscript(fs, d, key)
    return Const(None)


# dict's special methods, called by name (``super().__setitem__(k, v)`` in a subclass)
_DICT_SPECIALS: dict[str, Callable[..., Value]] = {
    "__getitem__": lambda fs, d, key: subscript(fs, d, key),
    "__setitem__": _dict_setitem,
    "__delitem__": _dict_delitem,
    "__contains__": lambda fs, d, key: Const(constant_of(fs, key) in fs.tracer.heap.get(d.ref)),
    "__len__": lambda fs, d: Const(len(fs.tracer.heap.get(d.ref))),
    "__iter__": lambda fs, d: make_iter(fs, iterate(fs, d)),
    "__init__": lambda fs, d, *args: _dict_method(fs, d, "update", list(args), {}),
}


# -- context managers with graph nodes of their own -------------------------------------------


@rule(torch.autocast)
def _autocast(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    """``torch.autocast(device_type, dtype=None, enabled=True, cache_enabled=None)``."""
    from torch.amp import autocast_mode

    names = ("device_type", "dtype", "enabled", "cache_enabled")
    given = dict(zip(names, args, strict=False)) | kwargs
    if set(given) - set(names) or "device_type" not in given:
        raise Unsupported("torch.autocast() with these arguments", "call")
    defaults = {"dtype": None, "enabled": True, "cache_enabled": None}
    values = tuple(constant_of(fs, given[n]) if n in given else defaults[n] for n in names)
    return ModeV(autocast_mode._enter_autocast, autocast_mode._exit_autocast, values)


@rule(torch.inference_mode)
def _inference_mode(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    from torch.autograd import grad_mode

    (mode,) = [*args, *kwargs.values()] or [Const(True)]
    enabled = bool(constant_of(fs, mode))
    return ModeV(grad_mode._enter_inference_mode, grad_mode._exit_inference_mode, (enabled,))


# -- inspect ----------------------------------------------------------------------------------


@rule(inspect.signature)
def _signature(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    """``inspect.signature(f)``: the real signature of the function ``f`` stands for (its
    identity, or its class's, is guarded where it was read), computed while tracing."""
    target, options = args[0], {k: constant_of(fs, v) for k, v in kwargs.items()}
    if isinstance(target, BoundV) and isinstance(target.func, FuncV) and target.func.fn:
        sig = inspect.signature(target.func.fn, **options)
        params = list(sig.parameters.values())
        return ObjV(sig.replace(parameters=params[1:]))  # bound: the first parameter is taken
    if isinstance(target, MethodV) and isinstance(target.self_value, ModuleV | ObjV):
        owner = class_of(target.self_value) or type(getattr(target.self_value, "module", None))
        method = inspect.getattr_static(owner, target.name, None)
        if isinstance(method, types.FunctionType):
            return _signature(
                fs, [BoundV(FuncV(method.__code__, {}, fn=method), ObjV(None))], kwargs
            )
    real: Any = None
    if isinstance(target, FuncV):
        real = target.fn
    elif isinstance(target, ModuleV):
        real = target.module
    elif isinstance(target, ObjV) and callable(target.obj):
        real = target.obj
    if real is None:
        raise Unsupported(f"inspect.signature of a {type(target).__name__}", "call")
    return ObjV(inspect.signature(real, **options))


def _signature_view_method(obj: Any) -> bool:
    """``sig.parameters.values()`` and friends: a method of a signature's parameter mapping
    (or its views), which ember computed while tracing and nobody can change."""
    owner: Any = getattr(obj, "__self__", None)
    if not isinstance(obj, types.BuiltinMethodType) or type(owner) not in FIXED_VIEWS:
        return False
    mapping = owner if isinstance(owner, types.MappingProxyType) else owner.mapping
    return all(isinstance(v, inspect.Parameter) for v in mapping.values())


def _call_signature_view_method(fs: FrameState, obj: Any, args: Args, kwargs: Kwargs) -> Value:
    real_args = [constant_of(fs, a) for a in args]
    real_kwargs = {k: constant_of(fs, v) for k, v in kwargs.items()}
    return wrap(fs.tracer, obj(*real_args, **real_kwargs), None)


OBJECT_KINDS.append((_signature_view_method, _call_signature_view_method))


@rule(torch.get_default_dtype)
def _get_default_dtype(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    """A constant: the default dtype is part of every frame's global-state guard."""
    if args or kwargs:
        raise Unsupported("get_default_dtype() with arguments", "call")
    return Const(torch.get_default_dtype())


@rule(torch.is_inference_mode_enabled)
def _is_inference_mode_enabled(fs: FrameState, args: Args, kwargs: Kwargs) -> Value:
    """The mode as the graph has it here: blocks entered while tracing are entered for real."""
    _no_kwargs("torch.is_inference_mode_enabled", kwargs)
    return Const(torch.is_inference_mode_enabled())
