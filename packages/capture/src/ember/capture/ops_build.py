"""Handlers that build and take apart containers, and that iterate (loops unroll)."""

from __future__ import annotations

from typing import Any

from ember.capture import generators, shapes
from ember.capture.interpreter import handler
from ember.capture.pyrules import constant_of, iter_of, iterate, key_of
from ember.capture.tracer import FrameState, Instr, Unsupported
from ember.capture.values import Const, DictV, ListV, SetV, SliceV, SymV, TupleV, Value


@handler("BUILD_TUPLE")
def BUILD_TUPLE(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    fs.push(TupleV(tuple(fs.popn(inst.arg))))


@handler("BUILD_LIST")
def BUILD_LIST(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    fs.push(ListV(fs.tracer.heap.new(fs.popn(inst.arg))))


@handler("BUILD_MAP")
def BUILD_MAP(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    flat = fs.popn(2 * inst.arg)
    items = {constant_of(fs, flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}
    fs.push(DictV(fs.tracer.heap.new(items)))


@handler("BUILD_CONST_KEY_MAP")
def BUILD_CONST_KEY_MAP(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    keys = constant_of(fs, fs.pop())
    values = fs.popn(inst.arg)
    fs.push(DictV(fs.tracer.heap.new(dict(zip(keys, values, strict=True)))))


@handler("BUILD_SLICE")
def BUILD_SLICE(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    parts = fs.popn(inst.arg)
    if any(isinstance(p, SymV) and shapes.is_symbolic(p.example) for p in parts):
        fs.push(SliceV(tuple(parts)))  # a tensor index keeps it symbolic
        return
    fs.push(Const(slice(*(constant_of(fs, p) for p in parts))))


@handler("BUILD_SET")
def BUILD_SET(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    items = [key_of(fs, v) for v in fs.popn(inst.arg)]
    fs.push(SetV(fs.tracer.heap.new(_hashed(set(), items))))


@handler("SET_ADD", "SET_UPDATE")
def SET_ADD(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    value = fs.pop()
    target = fs.peek(inst.arg)
    assert isinstance(target, SetV), target
    items = [value] if inst.opname == "SET_ADD" else iterate(fs, value)
    _hashed(fs.tracer.heap.get(target.ref), [key_of(fs, v) for v in items])


def _hashed(target: set[Any], items: list[Any]) -> set[Any]:
    try:
        target.update(items)
    except TypeError as e:  # unhashable: eager raises it for real
        raise Unsupported(f"a set of unhashable values ({e})") from e
    return target


@handler("LIST_APPEND")
def LIST_APPEND(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    value = fs.pop()
    target = fs.peek(inst.arg)
    assert isinstance(target, ListV), target
    fs.tracer.heap.get(target.ref).append(value)


@handler("LIST_EXTEND")
def LIST_EXTEND(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    values = iterate(fs, fs.pop())
    target = fs.peek(inst.arg)
    assert isinstance(target, ListV), target
    fs.tracer.heap.get(target.ref).extend(values)


@handler("LIST_TO_TUPLE")
def LIST_TO_TUPLE(fs: FrameState, inst: Instr) -> None:
    lst = fs.pop()
    assert isinstance(lst, ListV), lst
    fs.push(TupleV(tuple(fs.tracer.heap.get(lst.ref))))


@handler("DICT_MERGE", "DICT_UPDATE")
def DICT_MERGE(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    other = fs.pop()
    target = fs.peek(inst.arg)
    assert isinstance(target, DictV), target
    if not isinstance(other, DictV):
        raise Unsupported(f"** of a {type(other).__name__}", "call")
    items = fs.tracer.heap.get(target.ref)
    new = fs.tracer.heap.get(other.ref)
    if inst.opname == "DICT_MERGE" and set(items) & set(new):
        raise Unsupported("duplicate keyword arguments", "call")
    items.update(new)


@handler("MAP_ADD")
def MAP_ADD(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    value, key = fs.pop(), fs.pop()
    target = fs.peek(inst.arg)
    assert isinstance(target, DictV), target
    fs.tracer.heap.get(target.ref)[constant_of(fs, key)] = value


@handler("UNPACK_SEQUENCE")
def UNPACK_SEQUENCE(fs: FrameState, inst: Instr) -> None:
    items = iterate(fs, fs.pop())
    if len(items) != inst.arg:
        raise Unsupported(f"unpacking {len(items)} values into {inst.arg} names", "call")
    for item in reversed(items):
        fs.push(item)


@handler("UNPACK_EX")
def UNPACK_EX(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    before, after = inst.arg & 0xFF, inst.arg >> 8
    items = iterate(fs, fs.pop())
    if len(items) < before + after:
        raise Unsupported(f"not enough values to unpack ({len(items)})", "call")
    middle = ListV(fs.tracer.heap.new(items[before : len(items) - after]))
    values: list[Value] = [*items[:before], middle, *items[len(items) - after :]]
    for item in reversed(values):
        fs.push(item)


@handler("GET_ITER")
def GET_ITER(fs: FrameState, inst: Instr) -> None:
    fs.push(iter_of(fs, fs.pop()))


@handler("FOR_ITER")
def FOR_ITER(fs: FrameState, inst: Instr) -> None:
    exhausted, value = generators.next_value(fs, fs.peek())  # a generator runs to its yield
    if exhausted:
        fs.pop()
        fs.jump(inst)
    else:
        fs.push(value)
