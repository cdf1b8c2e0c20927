"""Operators and item access on symbolic values: ``a + b``, ``c[i]``, ``c[i] = v``, ``del c[i]``.

A tensor operand makes the operation a graph node; numbers the graph takes as inputs
stay in the graph; tuples and lists holding tensors are joined and repeated item by
item; objects of user classes go through their Python special methods
(``userobjects``), dict-derived ones through their items; real objects of natively-run
classes are read for real, behind a guard repeating the read (:func:`native_read`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch

from ember.capture import guarding
from ember.capture.builder import is_constant, wrap
from ember.capture.containers import _module_child, guard_children
from ember.capture.graphops import graph_call, scalar_call
from ember.capture.pyrules import (
    FIXED_VIEWS,
    _fold,
    _mutate,
    _special,
    constant_of,
    is_numeric,
)
from ember.capture.tracer import FIRST_CALL, FrameState, Raised, Unsupported
from ember.capture.userobjects import dict_getitem
from ember.capture.values import (
    Const,
    DictV,
    ExcV,
    InstanceV,
    ListV,
    ModuleV,
    ObjV,
    TensorV,
    TupleV,
    Value,
)


def binary(fs: FrameState, op: Callable[[Any, Any], Any], a: Value, b: Value) -> Value:
    """``op(a, b)`` for a binary operator."""
    if op in _PLAIN_OF_INPLACE and not isinstance(a, TensorV | ListV):
        op = _PLAIN_OF_INPLACE[op]  # ``n += t`` on a number: numbers have no __iadd__
    if isinstance(a, TensorV) or isinstance(b, TensorV):
        return graph_call(fs, "call_function", op, [a, b], {})
    if is_numeric([a, b]):
        return scalar_call(fs, op, [a, b])
    if isinstance(a, TupleV | ListV) or isinstance(b, TupleV | ListV):
        structured = _sequence_binary(fs, op, a, b)
        if structured is not None:
            return structured
    return _fold(fs, op, [a, b], {})


# In-place operators and the plain ones Python falls back to on immutable left operands.
_PLAIN_OF_INPLACE = {
    getattr(operator, name): getattr(operator, name[1:] + ("_" if name in ("iand", "ior") else ""))
    for name in (
        "iadd", "iand", "ifloordiv", "ilshift", "imatmul", "imod", "imul", "ior", "ipow",
        "irshift", "isub", "itruediv", "ixor",
    )
}  # fmt: skip


def _sequence_binary(fs: FrameState, op: Any, a: Value, b: Value) -> Value | None:
    """Concatenation and repetition of tuples/lists that may hold tensors."""
    heap = fs.tracer.heap
    if op in (operator.add, operator.iadd) and type(a) is type(b):
        if isinstance(a, TupleV) and isinstance(b, TupleV):
            return TupleV(a.items + b.items)
        if isinstance(a, ListV) and isinstance(b, ListV):
            if op is operator.iadd:
                _mutate(fs, a).extend(heap.get(b.ref))
                return a
            return ListV(heap.new(heap.get(a.ref) + heap.get(b.ref)))
    if op in (operator.add, operator.iadd) and isinstance(a, TupleV) and isinstance(b, Const):
        if isinstance(b.value, tuple):
            return TupleV(a.items + tuple(Const(x) for x in b.value))
    if op in (operator.add,) and isinstance(a, Const) and isinstance(b, TupleV):
        if isinstance(a.value, tuple):
            return TupleV(tuple(Const(x) for x in a.value) + b.items)
    if op is operator.mul and isinstance(b, Const) and isinstance(b.value, int):
        if isinstance(a, TupleV):
            return TupleV(a.items * b.value)
        if isinstance(a, ListV):
            return ListV(heap.new(heap.get(a.ref) * b.value))
    return None


def subscript(fs: FrameState, container: Value, index: Value) -> Value:
    """``container[index]``."""
    heap = fs.tracer.heap
    if (
        isinstance(container, ObjV)
        and isinstance(container.obj, dict)
        and isinstance(index, TensorV)
    ):
        return tensor_keyed_item(fs, container, index)
    if isinstance(container, InstanceV | ObjV):
        found = _special(fs, container, "__getitem__", [index])
        if found is not None:
            return dict_getitem(fs, container, found, index) if isinstance(found, DictV) else found
    if isinstance(container, TensorV):
        return graph_call(fs, "call_function", operator.getitem, [container, index], {})
    if isinstance(container, ModuleV):
        return _module_subscript(fs, container, constant_of(fs, index))
    if isinstance(container, TupleV | ListV):
        items = container.items if isinstance(container, TupleV) else heap.get(container.ref)
        key = constant_of(fs, index)
        if isinstance(key, slice):
            part = items[key]
            return (
                TupleV(tuple(part))
                if isinstance(container, TupleV)
                else ListV(heap.new(list(part)))
            )
        try:
            return items[key]  # type: ignore[no-any-return]
        except IndexError as e:
            raise Raised(ExcV(IndexError, (Const(str(e)),)), f"indexing raised {e}") from None
        except TypeError as e:
            raise Unsupported(f"indexing raised {type(e).__name__}: {e}") from e
    if isinstance(container, DictV):
        key = constant_of(fs, index)
        items = heap.get(container.ref)
        if key not in items:
            raise Raised(ExcV(KeyError, (Const(key),)), f"KeyError: {key!r}")
        return items[key]  # type: ignore[no-any-return]
    if isinstance(container, ObjV) and isinstance(container.obj, tuple):
        key = constant_of(fs, index)
        src = container.source
        return wrap(
            fs.tracer, container.obj[key], guarding.item(src, key) if src is not None else None
        )
    if (
        isinstance(container, ObjV)
        and container.source is None
        and type(container.obj) in FIXED_VIEWS
    ):
        return wrap(fs.tracer, container.obj[constant_of(fs, index)], None)
    if isinstance(container, ObjV) and not isinstance(container.obj, type):
        return native_read(fs, container, operator.getitem, constant_of(fs, index))
    return _fold(fs, operator.getitem, [container, index], {})


def tensor_keyed_item(fs: FrameState, container: ObjV, key: TensorV) -> Value:
    """``d[t]`` for a dict the frame reaches, keyed by a tensor it hands the graph (an
    optimizer's ``state``, keyed by its parameters): the item, reached as
    ``dict.__getitem__(d, t)`` by the guards and the graph's inputs. A key not there yet
    in a ``defaultdict`` (lazy state, filled in by an optimizer's first step) runs that
    call natively, and the next call is compiled again."""
    tracer = fs.tracer
    if container.source is None or key.source is None or key.node.op != "placeholder":
        raise Unsupported("indexing a dict by a tensor made inside compiled code", "constant")
    real = tracer.example_inputs[tracer.input_sources.index(key.source)]
    if real not in container.obj:
        if hasattr(container.obj, "__missing__"):
            raise Unsupported(f"a new key in a {type(container.obj).__name__}", FIRST_CALL)
        raise Raised(ExcV(KeyError, (Const("a tensor"),)), "KeyError: a tensor")
    source = guarding.computed(dict.__getitem__, (container.source, key.source))
    return wrap(tracer, dict.__getitem__(container.obj, real), source)


def native_read(fs: FrameState, v: ObjV, fn: Callable[..., Any], *args: Any) -> Const:
    """``fn(obj, *args)`` computed for real, for an object whose methods run natively (an
    ``os.environ`` lookup): a constant, guarded through the same computation.

    Only reads with a constant result are taken; anything else is a break.
    """
    try:
        result = fn(v.obj, *args)
    except Exception as e:
        raise Unsupported(f"{fn.__name__}() raised {type(e).__name__}: {e}") from e
    if not is_constant(result):
        raise Unsupported(f"{fn.__name__}() of a {type(v.obj).__name__} (not a constant)")
    if v.source is not None:
        fs.tracer.guards.equals(guarding.computed(fn, (v.source, *args)), result)
    return Const(result)


def _module_subscript(fs: FrameState, container: ModuleV, key: Any) -> Value:
    """``modules[key]`` for ModuleList/Sequential (int, slice) and ModuleDict (str)."""
    m = container.module
    names = list(m._modules)
    if isinstance(m, torch.nn.ModuleDict) and isinstance(key, str) and key in m._modules:
        return _module_child(fs, container, key)
    if isinstance(m, torch.nn.ModuleList | torch.nn.Sequential):
        if isinstance(key, int) and 0 <= key < len(names):
            return _module_child(fs, container, names[key])
        if isinstance(key, int) and -len(names) <= key:  # counted from the end: the length
            guard_children(fs, container)
            return _module_child(fs, container, names[key])
        if isinstance(key, slice):
            guard_children(fs, container)
            return TupleV(tuple(_module_child(fs, container, n) for n in names[key]))
    raise Unsupported(f"{type(m).__name__}[{key!r}]", "call")


def store_subscript(fs: FrameState, container: Value, index: Value, value: Value) -> None:
    """``container[index] = value``."""
    if isinstance(container, InstanceV | ObjV):
        found = _special(fs, container, "__setitem__", [index, value])
        if isinstance(found, DictV):
            container = found
        elif found is not None:
            return
    if isinstance(container, TensorV):
        graph_call(fs, "call_function", operator.setitem, [container, index, value], {})
        return
    if isinstance(container, ListV):
        _mutate(fs, container)[constant_of(fs, index)] = value
        return
    if isinstance(container, DictV):
        _mutate(fs, container)[constant_of(fs, index)] = value
        return
    raise Unsupported(f"item assignment on a {type(container).__name__}", "side-effect")


def delete_subscript(fs: FrameState, container: Value, index: Value) -> None:
    """``del container[index]`` on a list or dict (an int, a slice, or a key)."""
    if isinstance(container, InstanceV | ObjV):
        found = _special(fs, container, "__delitem__", [index])
        if isinstance(found, DictV):
            container = found
        elif found is not None:
            return
    if not isinstance(container, ListV | DictV):
        raise Unsupported(f"deleting an item of a {type(container).__name__}", "side-effect")
    key = constant_of(fs, index)
    try:
        del _mutate(fs, container)[key]
    except (KeyError, IndexError, TypeError) as e:
        raise Unsupported(f"del raised {type(e).__name__}: {e}") from e
