"""Handlers for stack shuffling, operators, comparisons, subscripts and string building."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch

from ember.capture import generators
from ember.capture.graphops import graph_call, scalar_call
from ember.capture.interpreter import handler
from ember.capture.pyitems import binary, delete_subscript, native_read, store_subscript, subscript
from ember.capture.pyrules import (
    constant_of,
    is_numeric,
    key_of,
    truth,
    view_items,
)
from ember.capture.tracer import FrameState, Instr, Unsupported
from ember.capture.userobjects import call_special, dict_equal, dict_view
from ember.capture.values import (
    Const,
    DictV,
    FuncV,
    InstanceV,
    IterV,
    ListV,
    ModuleV,
    ObjV,
    SetV,
    TensorV,
    TupleV,
    Value,
    ViewV,
)

# BINARY_OP's oparg indexes this table (mirrors opcode._nb_ops in CPython 3.11).
BINARY_OPS: tuple[Callable[[Any, Any], Any], ...] = (
    operator.add, operator.and_, operator.floordiv, operator.lshift, operator.matmul,
    operator.mul, operator.mod, operator.or_, operator.pow, operator.rshift, operator.sub,
    operator.truediv, operator.xor,
    operator.iadd, operator.iand, operator.ifloordiv, operator.ilshift, operator.imatmul,
    operator.imul, operator.imod, operator.ior, operator.ipow, operator.irshift, operator.isub,
    operator.itruediv, operator.ixor,
)  # fmt: skip

COMPARE_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "<": operator.lt, "<=": operator.le, "==": operator.eq,
    "!=": operator.ne, ">": operator.gt, ">=": operator.ge,
}  # fmt: skip

UNARY_OPS: dict[str, Callable[[Any], Any]] = {
    "UNARY_NEGATIVE": operator.neg,
    "UNARY_POSITIVE": operator.pos,
    "UNARY_INVERT": operator.invert,
}


@handler("NOP", "RESUME", "PRECALL")
def NOP(fs: FrameState, inst: Instr) -> None:
    """Nothing to do: PRECALL's bound-method unpacking is done by CALL (MethodV carries self)."""


@handler("POP_TOP")
def POP_TOP(fs: FrameState, inst: Instr) -> None:
    fs.pop()


@handler("PUSH_NULL")
def PUSH_NULL(fs: FrameState, inst: Instr) -> None:
    fs.push_null()


@handler("COPY")
def COPY(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    fs.push(fs.peek(inst.arg))


@handler("SWAP")
def SWAP(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    i = inst.arg
    fs.stack[-1], fs.stack[-i] = fs.stack[-i], fs.stack[-1]


@handler("BINARY_OP")
def BINARY_OP(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    b, a = fs.pop(), fs.pop()
    fs.push(binary(fs, BINARY_OPS[inst.arg], a, b))


@handler("COMPARE_OP")
def COMPARE_OP(fs: FrameState, inst: Instr) -> None:
    b, a = fs.pop(), fs.pop()
    op = COMPARE_OPS[inst.argval]
    if isinstance(a, TensorV) or isinstance(b, TensorV):
        fs.push(graph_call(fs, "call_function", op, [a, b], {}))
    elif is_numeric([a, b]):
        fs.push(scalar_call(fs, op, [a, b]))
    elif op in (operator.eq, operator.ne) and _identity_comparable(a, b):
        same = _same_object(a, b)
        fs.push(Const(same if op is operator.eq else not same))
    elif op in (operator.eq, operator.ne) and (equal := dict_equal(fs, a, b)) is not None:
        fs.push(Const(equal if op is operator.eq else not equal))  # dict-derived objects
    else:
        fs.push(Const(op(constant_of(fs, a), constant_of(fs, b))))


def _identity_comparable(a: Value, b: Value) -> bool:
    return isinstance(a, ModuleV | ObjV) or isinstance(b, ModuleV | ObjV)


def _same_object(a: Value, b: Value) -> bool:
    def obj(v: Value) -> Any:
        if isinstance(v, ModuleV):
            return v.module
        if isinstance(v, ObjV):
            return v.obj
        if isinstance(v, Const):
            return v.value
        return v

    return bool(obj(a) is obj(b) or (type(obj(a)) is type(obj(b)) and obj(a) == obj(b)))


@handler("IS_OP")
def IS_OP(fs: FrameState, inst: Instr) -> None:
    b, a = fs.pop(), fs.pop()
    same = _is(fs, a, b)
    fs.push(Const(same != bool(inst.arg)))


def _is(fs: FrameState, a: Value, b: Value) -> bool:
    if isinstance(a, TensorV) or isinstance(b, TensorV):
        return isinstance(a, TensorV) and isinstance(b, TensorV) and a.node is b.node
    if isinstance(a, InstanceV) or isinstance(b, InstanceV):
        return isinstance(a, InstanceV) and isinstance(b, InstanceV) and a.ref == b.ref
    if isinstance(a, ListV | DictV) and isinstance(b, ListV | DictV):
        return type(a) is type(b) and a.ref == b.ref
    if isinstance(a, ListV | DictV) or isinstance(b, ListV | DictV):
        return False
    if isinstance(a, TupleV) or isinstance(b, TupleV):
        return a is b
    if any(isinstance(v, FuncV) and v.fn is None for v in (a, b)):
        return a is b  # a function made while tracing
    kinds = (Const, ModuleV, ObjV, FuncV)  # a real object, maybe reached twice
    if isinstance(a, kinds) and isinstance(b, kinds):
        return _real(a) is _real(b)
    return a is b


def _real(v: Value) -> Any:
    if isinstance(v, FuncV):
        return v.fn
    return v.value if isinstance(v, Const) else v.module if isinstance(v, ModuleV) else v.obj  # type: ignore[attr-defined]


@handler("CONTAINS_OP")
def CONTAINS_OP(fs: FrameState, inst: Instr) -> None:
    container, item = fs.pop(), fs.pop()
    if isinstance(container, InstanceV | ObjV):
        special = call_special(fs, container, "__contains__", [item])
        if special is not None:
            fs.push(Const(truth(fs, special) != bool(inst.arg)))
            return
        container = dict_view(fs, container) or container
    if isinstance(container, ObjV) and not isinstance(container.obj, type | tuple):
        found = native_read(fs, container, operator.contains, constant_of(fs, item)).value
    elif isinstance(container, DictV):
        found = constant_of(fs, item) in fs.tracer.heap.get(container.ref)
    elif isinstance(container, IterV):
        found = _iter_contains(fs, container, constant_of(fs, item))
    elif isinstance(container, ViewV) and container.kind == "keys":
        found = constant_of(fs, item) in fs.tracer.heap.get(container.of.ref)
    elif isinstance(container, ViewV):
        found = constant_of(fs, item) in [constant_of(fs, x) for x in view_items(fs, container)]
    elif isinstance(container, ModuleV) and isinstance(container.module, torch.nn.ModuleDict):
        found = constant_of(fs, item) in container.module
    elif isinstance(container, SetV):
        found = key_of(fs, item) in fs.tracer.heap.get(container.ref)
    elif isinstance(container, TensorV) or isinstance(item, TensorV):
        raise Unsupported("'in' with tensors compares values", "data-dependent")
    else:
        found = constant_of(fs, item) in constant_of(fs, container)
    fs.push(Const(found != bool(inst.arg)))


def _iter_contains(fs: FrameState, it: IterV, key: Any) -> bool:
    """``key in it``: the iterator is consumed up to the match."""
    heap = fs.tracer.heap
    generators.refresh_dict_iter(fs, it)
    items = heap.get(it.ref)
    for i, v in enumerate(items):
        if constant_of(fs, v) == key:
            heap.set(it.ref, items[i + 1 :])
            return True
    heap.set(it.ref, [])
    return False


@handler("UNARY_NEGATIVE", "UNARY_POSITIVE", "UNARY_INVERT")
def UNARY(fs: FrameState, inst: Instr) -> None:
    v = fs.pop()
    op = UNARY_OPS[inst.opname]
    if isinstance(v, TensorV):
        fs.push(graph_call(fs, "call_function", op, [v], {}))
    elif is_numeric([v]):
        fs.push(scalar_call(fs, op, [v]))
    else:
        fs.push(Const(op(constant_of(fs, v))))


@handler("UNARY_NOT")
def UNARY_NOT(fs: FrameState, inst: Instr) -> None:
    fs.push(Const(not truth(fs, fs.pop())))


@handler("BINARY_SUBSCR")
def BINARY_SUBSCR(fs: FrameState, inst: Instr) -> None:
    index, container = fs.pop(), fs.pop()
    fs.push(subscript(fs, container, index))


@handler("STORE_SUBSCR")
def STORE_SUBSCR(fs: FrameState, inst: Instr) -> None:
    index, container, value = fs.pop(), fs.pop(), fs.pop()
    store_subscript(fs, container, index, value)


@handler("DELETE_SUBSCR")
def DELETE_SUBSCR(fs: FrameState, inst: Instr) -> None:
    index, container = fs.pop(), fs.pop()
    delete_subscript(fs, container, index)


@handler("FORMAT_VALUE")
def FORMAT_VALUE(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    spec = constant_of(fs, fs.pop()) if inst.arg & 0x04 else ""
    value = fs.pop()
    if isinstance(value, TensorV):
        raise Unsupported("formatting a tensor into a string reads its values", "data-dependent")
    obj = constant_of(fs, value) if not isinstance(value, ObjV | ModuleV) else _real(value)
    converters: dict[int, Callable[[Any], Any]] = {0: lambda x: x, 1: str, 2: repr, 3: ascii}
    fs.push(Const(format(converters[inst.arg & 0x03](obj), spec)))


@handler("BUILD_STRING")
def BUILD_STRING(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    parts = fs.popn(inst.arg)
    fs.push(Const("".join(constant_of(fs, p) for p in parts)))


__all__ = ["BINARY_OPS", "COMPARE_OPS", "UNARY_OPS"]
