"""Objects of user and library classes: special methods traced, dict behaviour through views.

Two kinds of value stand for such objects: an :class:`InstanceV` was made in this
trace (``cls(...)``, its ``__init__`` inlined; attributes in the heap), an
:class:`ObjV` is a real object the frame reaches. Library code leans on both
being ordinary Python objects:

* special methods the class defines in Python (``__getitem__``, ``__setitem__``,
  ``__setattr__``, ``__len__``, ``__iter__``, ``__contains__``, ``__bool__``) are
  traced, through :func:`call_special`;
* a class deriving from ``dict`` or ``OrderedDict`` (``transformers.ModelOutput``,
  a registry keyed by name) keeps its items where dict's own methods find them: a
  :class:`DictV` *view* (:func:`dict_view`). ``super().__setitem__(k, v)``,
  ``self.items()``, ``self[k]`` without an override, iteration and ``len`` all act
  on the view; for a real object the view is guarded like a dict argument, and
  written back (with the base class's own methods) if the trace mutates it.

>>> import collections
>>> class Out(collections.OrderedDict):
...     pass
>>> dict_base(Out), dict_base(int)
(<class 'collections.OrderedDict'>, None)
"""

from __future__ import annotations

import collections
import functools
import inspect
import types
from typing import Any

from ember.capture import trace_rules
from ember.capture.tracer import FrameState, Unsupported
from ember.capture.values import Const, DictV, InstanceV, ObjV, Value

# The builtin dict types an object's items can live in, most derived first.
DICT_BASES: tuple[type, ...] = (collections.OrderedDict, collections.defaultdict, dict)

# The C dict types made in a trace as an :class:`InstanceV` of the type itself (attributes:
# a defaultdict's ``default_factory``; items: a view), as their user subclasses are.
BUILTIN_DICTS: tuple[type, ...] = (collections.OrderedDict, collections.defaultdict)


def dict_base(cls: Any) -> type | None:
    """The builtin dict type that ``cls`` derives from (``dict``, ``OrderedDict`` or
    ``defaultdict``), if any."""
    if not isinstance(cls, type):
        return None
    for base in cls.__mro__:
        if base in DICT_BASES:
            return base
    return None


def python_special(cls: type, name: str) -> types.FunctionType | None:
    """``cls``'s own Python definition of the special method ``name`` (one the interpreter
    traces), or None when the method is a builtin's (``object``'s, ``dict``'s), or the class
    belongs to a module the trace rules run natively (``os.environ``'s class: its methods
    are native, whatever mixins they come from)."""
    module = getattr(cls, "__module__", None)
    if isinstance(module, str) and trace_rules.lookup(module).action == trace_rules.SKIP:
        return None
    found = inspect.getattr_static(cls, name, None)
    return found if trace_rules.traceable(found) else None


def class_of(v: Value) -> type | None:
    """The class of a user or library object value; None for other values."""
    if isinstance(v, InstanceV):
        return v.cls
    if isinstance(v, ObjV) and not isinstance(v.obj, type | types.ModuleType):
        return type(v.obj)
    return None


def call_special(fs: FrameState, v: Value, name: str, args: list[Value]) -> Value | None:
    """``type(v).name(v, *args)`` traced, when the class defines ``name`` in Python;
    None when it does not (the caller then applies the builtin behaviour)."""
    from ember.capture.calls import call_value, function_value

    cls = class_of(v)
    if cls is None:
        return None
    fn = python_special(cls, name)
    if fn is None:
        return None
    return call_value(fs, function_value(fs, fn, None), [v, *args], {})  # (or its polyfill)


def dict_view(fs: FrameState, v: Value) -> DictV | None:
    """The items of a dict-derived object as a :class:`DictV`, or None for other values.

    A real object's view is made once per trace: its type and keys are guarded and each
    item is reached as ``obj[key]``, like a dict argument's.
    """
    if isinstance(v, InstanceV):
        return DictV(v.items) if v.items is not None else None
    if not isinstance(v, ObjV) or dict_base(type(v.obj)) is None:
        return None
    from ember.capture.builder import wrap_dict_items

    if v.source is None:
        raise Unsupported(f"the items of a {type(v.obj).__name__} ember cannot reach again")
    return wrap_dict_items(fs.tracer, v.obj, v.source)


def replace_items(target: Any, items: dict[Any, Any]) -> None:
    """Make ``target``'s items ``items``, with its builtin base's own methods (a subclass
    may forbid ``update``, as ``ModelOutput`` does, or give ``__setitem__`` side effects).

    >>> import collections
    >>> class Frozen(collections.OrderedDict):
    ...     def update(self, *a, **k):
    ...         raise TypeError("no")
    >>> d = Frozen(a=1)
    >>> replace_items(d, {"b": 2}); d
    Frozen([('b', 2)])
    """
    base: Any = dict_base(type(target)) or dict
    base.clear(target)
    for key, value in items.items():
        base.__setitem__(target, key, value)


def make_instance(cls: type, attributes: dict[str, Any], items: dict[Any, Any] | None) -> Any:
    """An instance of ``cls`` made in compiled code: no ``__init__`` runs, its attributes
    and (for a dict-derived class) its items are set directly.

    >>> class P:
    ...     pass
    >>> make_instance(P, {"a": 1}, None).a
    1
    """
    base: Any = dict_base(cls)
    obj: Any = base.__new__(cls) if base is not None else object.__new__(cls)
    if items:
        replace_items(obj, items)
    for name, value in attributes.items():
        if _is_slot(cls, name):
            object.__setattr__(obj, name, value)  # a slot of a C type: a defaultdict's factory
        else:
            obj.__dict__[name] = value
    return obj


@functools.lru_cache(maxsize=4096)
def _is_slot(cls: type, name: str) -> bool:
    """Whether ``cls.name`` is a C-level slot (``getattr_static`` costs 8-10 us, and a
    compiled function that returns a ``ModelOutput`` makes one per call)."""
    return isinstance(inspect.getattr_static(cls, name, None), types.MemberDescriptorType)


def dict_getitem(fs: FrameState, obj: Value, view: DictV, key: Value) -> Value:
    """``obj[key]`` for a dict-derived object whose ``__getitem__`` is dict's: the item, or
    what the class's ``__missing__`` makes of a missing key (a defaultdict's factory called
    and its result stored, or the class's own Python method traced)."""
    from ember.capture.attrs import load_attr
    from ember.capture.calls import call_value
    from ember.capture.pyitems import store_subscript, subscript
    from ember.capture.pyrules import constant_of

    cls = class_of(obj)
    if cls is None or constant_of(fs, key) in fs.tracer.heap.get(view.ref):
        return subscript(fs, view, key)
    found = call_special(fs, obj, "__missing__", [key])
    if found is not None:
        return found
    if inspect.getattr_static(cls, "__missing__", None) is not _DEFAULTDICT_MISSING:
        return subscript(fs, view, key)  # KeyError, as dict raises it
    factory = load_attr(fs, obj, "default_factory")
    if isinstance(factory, Const) and factory.value is None:
        return subscript(fs, view, key)
    value = call_value(fs, factory, [], {})
    store_subscript(fs, obj, key, value)  # through the class's own __setitem__, if any
    return value


_DEFAULTDICT_MISSING = collections.defaultdict.__missing__


def dict_equal(fs: FrameState, a: Value, b: Value) -> bool | None:
    """``a == b`` where one side is a dict-derived object and both hold items ember knows:
    two OrderedDicts compare in order, anything else as dicts; None where this does not
    apply (a class with its own ``__eq__``, no items on one side). Values must be constants.
    """
    from ember.capture.pyrules import constant_of

    classes = [class_of(v) or (dict if isinstance(v, DictV) else None) for v in (a, b)]
    if classes == [dict, dict] or any(dict_base(c) is None for c in classes):
        return None
    if any(python_special(c, "__eq__") is not None for c in classes if c is not None):
        return None
    views = [v if isinstance(v, DictV) else dict_view(fs, v) for v in (a, b)]
    if views[0] is None or views[1] is None:
        return None
    left, right = fs.tracer.heap.get(views[0].ref), fs.tracer.heap.get(views[1].ref)
    ordered = all(issubclass(c, collections.OrderedDict) for c in classes if c is not None)
    if (list(left) != list(right)) if ordered else (left.keys() != right.keys()):
        return False
    return all(constant_of(fs, left[k]) == constant_of(fs, right[k]) for k in left)
