"""``value.name``: attribute rules, one per kind of value.

:func:`load_attr` dispatches on the value's class through :data:`ATTR_RULES`.
Tensor metadata (``shape``, ``dtype``, ``device``, ...) folds to constants,
which the tensor's input guard already pins; module parameters, buffers and
submodules are reached by source so they become graph inputs and guarded
objects; methods become :class:`MethodV`, called later.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from typing import Any

import torch

from ember.capture import guarding, polyfills, trace_rules
from ember.capture.builder import TRUSTED_MODULE_PREFIXES, is_constant, wrap
from ember.capture.calls import function_value
from ember.capture.graphops import graph_call, tensor_sizes
from ember.capture.tracer import FrameState, Raised, Unsupported
from ember.capture.userobjects import class_of, python_special
from ember.capture.values import (
    BoundV,
    Const,
    DictV,
    ExcV,
    FuncV,
    GenV,
    InstanceV,
    ListV,
    MethodV,
    ModuleV,
    ObjV,
    PartialV,
    SetV,
    SuperV,
    SymV,
    TensorV,
    TupleV,
    Value,
    is_frozen_dataclass,
    tuple_fields,
)
from ember.guards import sources

# Tensor attributes that are static metadata of the (guarded) fake tensor.
TENSOR_METADATA = frozenset(
    {
        "shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "is_sparse",
        "is_quantized", "is_meta", "layout", "is_leaf", "is_nested", "is_mkldnn", "itemsize",
    }
)  # fmt: skip

# Tensor attributes that are graph operations: name -> (method, extra args from ndim)
TENSOR_VIEW_ATTRS: dict[str, Callable[[int], tuple[str, tuple[int, ...]]]] = {
    "T": lambda nd: ("permute", tuple(reversed(range(nd)))),
    "mT": lambda nd: ("transpose", (-2, -1)),
    "real": lambda nd: ("real", ()),
    "data": lambda nd: ("detach", ()),
}

TENSOR_UNSUPPORTED = {
    "grad": "reading .grad inside compiled code",
    "grad_fn": "reading .grad_fn inside compiled code",
    "_version": "reading a tensor's version counter",
}


def _tensor_attr(fs: FrameState, v: Value, name: str) -> Value:
    assert isinstance(v, TensorV)
    if name == "shape":
        return tensor_sizes(fs, v)
    if name in TENSOR_METADATA:
        return Const(getattr(v.fake, name))
    if name in TENSOR_VIEW_ATTRS:
        method, extra = TENSOR_VIEW_ATTRS[name](v.fake.dim())
        if method in ("real",):
            return graph_call(fs, "call_function", torch.real, [v], {})
        return graph_call(fs, "call_method", method, [v, *map(Const, extra)], {})
    if name == "grad" and v.source is not None and v.node.op == "placeholder":
        return _input_grad(fs, v)
    if name in TENSOR_UNSUPPORTED:
        raise Unsupported(TENSOR_UNSUPPORTED[name], "tensor-attribute")
    if callable(getattr(torch.Tensor, name, None)):
        return MethodV(v, name)
    if not hasattr(torch.Tensor, name):
        raise no_attribute("Tensor", name)
    raise Unsupported(f"tensor attribute .{name}", "tensor-attribute")


def _input_grad(fs: FrameState, v: TensorV) -> Value:
    """``.grad`` of a tensor the frame hands the graph (an optimizer's parameter): an input of
    its own, reached as ``<source>.grad`` (None guarded as None). No backward runs inside a
    graph (it is a break), so the gradient read where the graph starts is the one it sees."""
    tracer = fs.tracer
    real = tracer.example_inputs[tracer.input_sources.index(v.source)]
    return wrap(tracer, real.grad, guarding.attr(v.source, "grad"))


def _class_attribute(
    fs: FrameState, v: Value, obj: Any, name: str, cls_attr: Any, src: Any
) -> Value:
    """An attribute found on the class of ``obj`` (``cls_attr`` as the class's dict holds it,
    not yet bound): a method, a property, a static or class method, or a class value."""
    if isinstance(cls_attr, types.FunctionType):
        return MethodV(v, name)
    if isinstance(cls_attr, property) and trace_rules.traceable(cls_attr.fget):
        from ember.capture.calls import call_value

        fget: Any = cls_attr.fget
        return call_value(fs, function_value(fs, fget, None), [v], {})
    if isinstance(cls_attr, property) and v.source is None:
        # An object ember made while tracing, of a class whose module runs natively (an
        # inspect.Signature): its property is read for real; nothing outside sees it.
        return wrap(fs.tracer, getattr(obj, name), None)
    if isinstance(cls_attr, staticmethod):
        return wrap(fs.tracer, cls_attr.__func__, None)
    if isinstance(cls_attr, classmethod):
        return BoundV(wrap(fs.tracer, cls_attr.__func__, None), wrap(fs.tracer, type(obj), None))
    if isinstance(cls_attr, types.BuiltinFunctionType | types.MethodDescriptorType):
        return MethodV(v, name)
    if isinstance(cls_attr, types.WrapperDescriptorType | types.MethodWrapperType):
        return MethodV(v, name)
    if isinstance(cls_attr, types.GetSetDescriptorType | types.MemberDescriptorType):
        # A C-level field (``__slots__`` member, ``__class__``, ``__dict__``): read for real,
        # guarded through its source like any other read.
        return wrap(fs.tracer, cls_attr.__get__(obj, type(obj)), src)
    if hasattr(type(cls_attr), "__get__"):
        raise Unsupported(f"the descriptor {type(obj).__name__}.{name}", "attribute")
    return wrap(fs.tracer, cls_attr, src)


def no_attribute(what: str, name: str) -> Raised:
    """Reading ``name`` raises AttributeError, as the traced code sees it (``getattr`` with a
    default, ``hasattr`` and ``except AttributeError`` catch it; any other reason ember cannot
    read an attribute is an :class:`Unsupported` break instead)."""
    message = f"{what} has no attribute {name!r}"
    return Raised(ExcV(AttributeError, (Const(message),)), message)


def _module_attr(fs: FrameState, v: Value, name: str) -> Value:
    assert isinstance(v, ModuleV)
    module, src = v.module, guarding.attr(v.source, name) if v.source is not None else None
    store = module.__dict__
    for table in ("_parameters", "_buffers", "_modules"):
        if name in store.get(table, {}):
            child = guarding.module_child(v.source, name, table) if v.source is not None else None
            return wrap(fs.tracer, store[table][name], child)
    return generic_attr(fs, v, module, name, src)


def _object_attr(fs: FrameState, v: Value, name: str) -> Value:
    assert isinstance(v, ObjV)
    obj = v.obj
    src = guarding.attr(v.source, name) if v.source is not None else None
    if isinstance(obj, types.ModuleType | type):
        try:
            value = getattr(obj, name)
        except AttributeError:
            raise no_attribute(repr(obj), name) from None
        if isinstance(obj, type) and isinstance(inspect.getattr_static(obj, name), classmethod):
            return BoundV(wrap(fs.tracer, value.__func__, None), v)
        return wrap(fs.tracer, value, src)
    getattribute = inspect.getattr_static(type(obj), "__getattribute__")
    if getattribute is not _OBJECT_GETATTRIBUTE and trace_rules.traceable(getattribute):
        from ember.capture.calls import call_value  # a Python __getattribute__: traced

        return call_value(fs, function_value(fs, getattribute, None), [v, Const(name)], {})
    return generic_attr(fs, v, obj, name, src)


_OBJECT_GETATTRIBUTE = object.__getattribute__


def generic_attr(
    fs: FrameState, v: Value, obj: Any, name: str, src: Any, use_getattr: bool = True
) -> Value:
    """``object.__getattribute__(obj, name)``, then (``use_getattr``) the class's
    ``__getattr__``: data descriptors on the class, the instance's ``__dict__``, then the
    class's attributes."""
    cls = type(obj)
    if name == "__class__":
        return wrap(fs.tracer, cls, src)
    if name == "__dict__" and any(key[0] == id(obj) for key in fs.tracer.attr_overlay):
        raise Unsupported("reading __dict__ after storing attributes", "attribute")
    cls_attr = inspect.getattr_static(cls, name, _MISSING)
    is_data_descriptor = hasattr(type(cls_attr), "__set__") or hasattr(type(cls_attr), "__delete__")
    instance_dict = getattr(obj, "__dict__", None)
    on_instance = isinstance(instance_dict, dict) and name in instance_dict
    if cls_attr is not _MISSING and v.source is not None and hasattr(type(cls_attr), "__get__"):
        # a method, property or other descriptor: still the class's, not set on the instance
        # (one set on the instance, as an LR scheduler sets its optimizer's step, is read
        # from there through ``src``, and guarded so)
        if is_data_descriptor or not on_instance:
            fs.tracer.guards.class_member(v.source, obj, name, cls_attr)
    if cls_attr is not _MISSING and is_data_descriptor:
        return _class_attribute(fs, v, obj, name, cls_attr, src)
    if on_instance:
        return wrap(fs.tracer, instance_dict[name], src)  # type: ignore[index]
    if cls_attr is not _MISSING:
        return _class_attribute(fs, v, obj, name, cls_attr, src)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple field
        return wrap(fs.tracer, getattr(obj, name), src)
    getattr_fn = inspect.getattr_static(cls, "__getattr__", None)
    if use_getattr and getattr_fn is not None and not isinstance(obj, torch.nn.Module):
        if not trace_rules.traceable(getattr_fn):
            raise Unsupported(f"{cls.__name__}.__getattr__ for .{name}", "attribute")
        from ember.capture.calls import call_value

        return call_value(fs, function_value(fs, getattr_fn, None), [v, Const(name)], {})
    if v.source is not None:  # the attribute must still be missing when this graph runs
        found = hasattr if use_getattr else sources.has_generic_attribute
        fs.tracer.guards.equals(guarding.computed(found, (v.source, name)), False)
    raise no_attribute(f"{cls.__name__} object", name)


def _instance_attr(fs: FrameState, v: Value, name: str) -> Value:
    """An attribute of an instance made while tracing, through the class's own
    ``__getattribute__`` when it has one (traced)."""
    assert isinstance(v, InstanceV)
    getattribute = python_special(v.cls, "__getattribute__")
    if getattribute is not None:
        from ember.capture.calls import call_value

        return call_value(fs, function_value(fs, getattribute, None), [v, Const(name)], {})
    return instance_attr(fs, v, name)


def instance_attr(fs: FrameState, v: InstanceV, name: str, use_getattr: bool = True) -> Value:
    """``object.__getattribute__`` of an instance made while tracing: its own attribute or
    its class's, then (``use_getattr``) the class's ``__getattr__``."""
    own = fs.tracer.heap.get(v.ref)
    if name in own:
        return own[name]  # type: ignore[no-any-return]
    if name == "__dict__":
        return DictV(v.ref)  # the attributes themselves: writes to it are attribute stores
    if name == "__class__":
        return wrap(fs.tracer, v.cls, None)
    found = inspect.getattr_static(v.cls, name, _MISSING)
    getattr_fn = python_special(v.cls, "__getattr__") if use_getattr else None
    if found is _MISSING and getattr_fn is not None:
        from ember.capture.calls import call_value

        return call_value(fs, function_value(fs, getattr_fn, None), [v, Const(name)], {})
    if found is _MISSING:  # the instance is all known: eager raises the same
        message = f"'{v.cls.__name__}' object has no attribute '{name}'"
        raise Raised(ExcV(AttributeError, (Const(message),)), message)
    if isinstance(found, staticmethod):
        return wrap(fs.tracer, found.__func__, None)
    if isinstance(found, classmethod):
        return BoundV(wrap(fs.tracer, found.__func__, None), ObjV(v.cls))
    if isinstance(found, types.FunctionType):
        return BoundV(function_value(fs, found, None), v)
    if isinstance(found, property) and isinstance(found.fget, types.FunctionType):
        from ember.capture.calls import call_value

        return call_value(fs, function_value(fs, found.fget, None), [v], {})
    if isinstance(found, types.MethodDescriptorType | types.WrapperDescriptorType):
        return MethodV(v, name)  # a builtin base's method (dict.items): on the items
    if hasattr(type(found), "__get__"):
        raise Unsupported(f"the descriptor {v.cls.__name__}.{name}", "attribute")
    return wrap(fs.tracer, found, None)


def _const_attr(fs: FrameState, v: Value, name: str) -> Value:
    assert isinstance(v, Const)
    try:
        value = getattr(v.value, name)
    except AttributeError:
        raise no_attribute(f"{type(v.value).__name__} object", name) from None
    if callable(value):
        return MethodV(v, name)
    return Const(value)


def _container_attr(fs: FrameState, v: Value, name: str) -> Value:
    """A method of a list, dict or set (``{}.move_to_end`` is an AttributeError, as in Python)."""
    python_type = {ListV: list, DictV: dict, SetV: set}[type(v)]
    if not hasattr(python_type, name):
        raise no_attribute(f"'{python_type.__name__}' object", name)
    return MethodV(v, name)


def _tuple_attr(fs: FrameState, v: Value, name: str) -> Value:
    """A namedtuple's field, class attribute, method or (a subclass's) instance attribute; a
    plain tuple's method."""
    assert isinstance(v, TupleV)
    cls = v.cls
    if cls is None:
        return MethodV(v, name)
    fields = tuple_fields(cls)
    if name in fields:
        return v.items[fields.index(name)]
    own = getattr(v.real, "__dict__", None)
    if isinstance(own, dict) and name in own:  # a subclass's instance attribute
        return wrap(fs.tracer, own[name], guarding.attr(v.source, name))
    found: Any = inspect.getattr_static(cls, name, _MISSING)
    if found is _MISSING:
        if v.source is not None:  # still missing when the graph runs
            fs.tracer.guards.equals(guarding.computed(hasattr, (v.source, name)), False)
        elif not _is_library(cls):
            fs.tracer.guards.equals(guarding.computed(hasattr, (cls, name)), False)
        raise no_attribute(f"'{cls.__name__}' object", name)
    _guard_tuple_class_attr(fs, v, name, found)
    inner: Any = found.__func__ if isinstance(found, classmethod) else None
    if inner is not None and polyfills.lookup(inner) is not None:
        return BoundV(function_value(fs, inner, None), ObjV(cls))  # _make
    if trace_rules.traceable(found) or polyfills.lookup(found) is not None:
        return BoundV(function_value(fs, found, None), v)  # a user method, _replace, _asdict
    getter: Any = found.fget if isinstance(found, property) else None
    if trace_rules.traceable(getter):
        from ember.capture.calls import call_value

        return call_value(fs, function_value(fs, getter, None), [v], {})  # a subclass's
    if name in ("_fields", "_field_defaults") or is_constant(found):
        return Const(getattr(cls, name))
    return MethodV(v, name)


def _guard_tuple_class_attr(fs: FrameState, v: TupleV, name: str, found: Any) -> None:
    """What a namedtuple's class attribute was found to be is what the graph assumes: from
    the frame, nothing set on the instance since nor on the class; made in the trace,
    nothing set on the class (a subclass's constant or method replaced)."""
    if v.source is not None and hasattr(type(found), "__get__"):
        fs.tracer.guards.class_member(v.source, v.real, name, found)
        return
    if v.source is not None:  # a class constant, read through the instance
        where = guarding.attr(v.source, name)
    elif not _is_library(v.cls):
        where = guarding.computed(guarding.class_attribute, (v.cls, name))
    else:
        return  # a struct sequence of torch, a namedtuple class of the stdlib
    if is_constant(found):
        fs.tracer.guards.equals(where, found)
    else:
        fs.tracer.guards.identity(where, found)


def _is_library(obj: Any) -> bool:
    """Defined by torch or the stdlib modules ember trusts (not replaced by user code)."""
    module = getattr(obj, "__module__", "") or ""
    return module.split(".")[0] in (*TRUSTED_MODULE_PREFIXES, "collections", "typing")


def _exception_attr(fs: FrameState, v: Value, name: str) -> Value:
    """``e.args``, ``e.value`` (StopIteration), ``e.__cause__``; the rest of a built-in
    exception with constant arguments from the real exception."""
    assert isinstance(v, ExcV)
    python_init = isinstance(v.cls.__init__, types.FunctionType)
    if name == "args" and not python_init:
        return TupleV(v.args)
    if name == "value" and issubclass(v.cls, StopIteration):
        return v.args[0] if v.args else Const(None)
    if name == "__cause__":
        return v.cause if v.cause is not None else Const(None)
    if name == "__class__":
        return ObjV(v.cls)
    if not python_init and name not in ("__context__", "__traceback__"):
        from ember.capture.pyrules import as_value, constant_of

        found = getattr(constant_of(fs, v), name, _MISSING)
        if found is not _MISSING:
            return as_value(fs, found)
    raise Unsupported(f"attribute {name!r} of a {v.cls.__name__} made in the trace", "attribute")


def _generator_attr(fs: FrameState, v: Value, name: str) -> Value:
    if name in ("send", "throw", "close", "__next__", "__iter__"):
        return MethodV(v, name)
    raise Unsupported(f"attribute {name!r} of a generator", "attribute")


# Function attributes read as constants; the function itself is guarded by identity, and
# these by their own source (a replaced ``__code__`` or ``__defaults__`` recompiles).
FUNCTION_ATTRS = frozenset(
    {
        "__name__", "__qualname__", "__module__", "__doc__", "__code__", "__defaults__",
        "__kwdefaults__", "__wrapped__", "__annotations__", "__dict__", "__closure__",
    }
)  # fmt: skip


def _function_attr(fs: FrameState, v: Value, name: str) -> Value:
    assert isinstance(v, FuncV)
    if v.fn is None:
        raise Unsupported(f"attribute {name!r} of a function made in compiled code", "attribute")
    src = guarding.attr(v.source, name) if v.source is not None else None
    if name in v.fn.__dict__:  # set on the function (functools.wraps' __wrapped__)
        return wrap(fs.tracer, v.fn.__dict__[name], src)
    if name not in FUNCTION_ATTRS or not hasattr(v.fn, name):
        if not hasattr(v.fn, name):
            raise no_attribute("function", name)
        raise Unsupported(f"attribute {name!r} of a function", "attribute")
    value = getattr(v.fn, name)
    if name in ("__code__", "__closure__") and src is not None:
        fs.tracer.guards.identity(src, value)
        return Const(value, source=src)
    return wrap(fs.tracer, value, src)


def _super_attr(fs: FrameState, v: Value, name: str) -> Value:
    """``super().name``: found in the MRO after ``cls``, bound to the same self."""
    assert isinstance(v, SuperV)
    obj = v.self_value
    cls = class_of(obj) if not isinstance(obj, ModuleV) else type(obj.module)
    if cls is None:
        raise Unsupported(f"super() of a {type(obj).__name__}", "call")
    mro = cls.__mro__
    for klass in mro[mro.index(v.cls) + 1 :]:
        if name in klass.__dict__:
            found = klass.__dict__[name]
            if isinstance(found, types.FunctionType):
                return BoundV(function_value(fs, found, None), obj)
            if isinstance(found, types.WrapperDescriptorType | types.MethodDescriptorType):
                return BoundV(ObjV(found), obj)  # object.__setattr__, dict.__setitem__, ...
            if isinstance(found, classmethod):
                return BoundV(wrap(fs.tracer, found.__func__, None), wrap(fs.tracer, cls, None))
            if isinstance(found, staticmethod):
                return wrap(fs.tracer, found.__func__, None)
            if isinstance(found, property) and isinstance(found.fget, types.FunctionType):
                from ember.capture.calls import call_value

                return call_value(fs, function_value(fs, found.fget, None), [obj], {})
            if not hasattr(type(found), "__get__"):
                return wrap(fs.tracer, found, None)
            raise Unsupported(f"super().{name}: a {type(found).__name__}", "attribute")
    raise no_attribute("super()", name)


def _partial_attr(fs: FrameState, v: Value, name: str) -> Value:
    """``p.func``, ``p.args``, ``p.keywords`` of a ``functools.partial``."""
    assert isinstance(v, PartialV)
    if name == "func":
        return v.func
    if name == "args":
        return TupleV(v.args)
    if name == "keywords":
        return v.kwargs
    if v.source is not None or hasattr(functools.partial, name):  # its __dict__, its class's
        raise Unsupported(f"attribute {name!r} of a functools.partial", "attribute")
    raise no_attribute("'functools.partial' object", name)  # made in the trace: no others


def _number_attr(fs: FrameState, v: Value, name: str) -> Value:
    """``s.real``, ``s.is_integer``: the number is needed, so it is specialized."""
    assert isinstance(v, SymV)
    return _const_attr(fs, Const(fs.tracer.specialize(v)), name)


ATTR_RULES: dict[type, Callable[[FrameState, Value, str], Value]] = {
    SuperV: _super_attr,
    SymV: _number_attr,
    PartialV: _partial_attr,
    InstanceV: _instance_attr,
    ExcV: _exception_attr,
    GenV: _generator_attr,
    TensorV: _tensor_attr,
    ModuleV: _module_attr,
    ObjV: _object_attr,
    Const: _const_attr,
    ListV: _container_attr,
    DictV: _container_attr,
    SetV: _container_attr,
    TupleV: _tuple_attr,
    FuncV: _function_attr,
}

_MISSING = object()


def store_attr(fs: FrameState, obj: Value, name: str, value: Value, raw: bool = False) -> None:
    """``obj.name = value`` on an object the frame reaches: recorded, replayed after the graph.

    A class's own Python ``__setattr__`` is traced (``raw``: it is ``object.__setattr__``
    itself storing, past any override). Only plain stores are recorded: a descriptor on
    the class, a parameter or submodule of a module, a buffer set to anything but a
    tensor, or an object with no source is a graph break instead.
    """
    if isinstance(obj, InstanceV | ObjV) and not raw:
        setattr_fn = python_special(class_of(obj) or object, "__setattr__")
        if setattr_fn is not None:  # the class's own __setattr__, traced
            from ember.capture.calls import call_value

            call_value(fs, function_value(fs, setattr_fn, None), [obj, Const(name), value], {})
            return
    if isinstance(obj, InstanceV):  # made in this trace: no side effect, made whole later
        found = inspect.getattr_static(obj.cls, name, None)
        if is_frozen_dataclass(obj.cls) or hasattr(type(found), "__set__"):
            raise Unsupported(f"setting .{name} on a {obj.cls.__name__}", "side-effect")
        fs.tracer.heap.get(obj.ref)[name] = value
        return
    real = obj.module if isinstance(obj, ModuleV) else getattr(obj, "obj", None)
    if not isinstance(obj, ModuleV | ObjV) or obj.source is None or real is None:
        raise Unsupported(f"setting .{name} on a {type(obj).__name__}", "side-effect")
    cls = type(real)
    if isinstance(obj, ModuleV):
        # a buffer rebound to a tensor (``self.count = self.count + 1``): the replayed setattr
        # is nn.Module's, which stores it in _buffers as eager does
        buffer = name in real.__dict__.get("_buffers", {}) and isinstance(value, TensorV)
        tables = [real.__dict__.get(t, {}) for t in ("_parameters", "_buffers", "_modules")]
        if not buffer and (any(name in t for t in tables) or isinstance(value, ModuleV)):
            raise Unsupported(f"setting the parameter, buffer or submodule .{name}", "side-effect")
        if buffer:  # the dict read before would hold the old buffer; read after, a break
            if id(real._buffers) in fs.tracer.containers:
                raise Unsupported(f"setting buffer .{name} after reading _buffers", "side-effect")
            fs.tracer.rebound_buffers.add(id(real._buffers))
    elif cls.__setattr__ is not object.__setattr__ and cls is not type and not raw:
        raise Unsupported(f"setting .{name} on a {cls.__name__} with __setattr__", "side-effect")
    if id(getattr(real, "__dict__", None)) in fs.tracer.containers:
        raise Unsupported(f"setting .{name} after reading the object's __dict__", "side-effect")
    if hasattr(cls, name) and hasattr(getattr(cls, name), "__set__"):
        raise Unsupported(f"setting the descriptor .{name}", "side-effect")
    if isinstance(value, TensorV) and isinstance(obj, ModuleV) and value.fake.requires_grad:
        raise Unsupported(f"setting .{name} to a tensor that requires grad", "side-effect")
    fs.tracer.containers.setdefault(id(real), (real, obj))  # keeps `real` alive: ids stay unique
    fs.tracer.attr_overlay[(id(real), name)] = value
    fs.tracer.effects.append(("object_setattr" if raw else "setattr", obj.source, name, value))


def delete_attr(fs: FrameState, obj: Value, name: str) -> None:
    """``del obj.name``: on an instance made in this trace (through its class's Python
    ``__delattr__`` if it has one); on anything else a side effect ember does not replay."""
    if not isinstance(obj, InstanceV):
        raise Unsupported(f"deleting .{name} of a {type(obj).__name__}", "side-effect")
    delattr_fn = python_special(obj.cls, "__delattr__")
    if delattr_fn is not None:
        from ember.capture.calls import call_value

        call_value(fs, function_value(fs, delattr_fn, None), [obj, Const(name)], {})
        return
    own = fs.tracer.heap.get(obj.ref)
    if name not in own:
        raise no_attribute(f"{obj.cls.__name__} object", name)
    del own[name]


def load_attr(fs: FrameState, v: Value, name: str) -> Value:
    """The value of ``v.name``."""
    if fs.tracer.attr_overlay and isinstance(v, ModuleV | ObjV):
        real = v.module if isinstance(v, ModuleV) else v.obj
        stored = fs.tracer.attr_overlay.get((id(real), name))
        if stored is not None:
            return stored  # stored earlier in this trace
    rule = ATTR_RULES.get(type(v))
    if rule is None:
        raise Unsupported(f"attribute {name!r} of {type(v).__name__}", "attribute")
    return rule(fs, v, name)
