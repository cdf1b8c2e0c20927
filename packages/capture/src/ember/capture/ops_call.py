"""Calls, function creation and return."""

from __future__ import annotations

from ember.capture import generators
from ember.capture.calls import call_value
from ember.capture.interpreter import handler
from ember.capture.pyrules import iterate, make_iter
from ember.capture.tracer import FrameState, Instr, Unsupported
from ember.capture.values import (
    NULL,
    CellV,
    Const,
    DictV,
    FuncV,
    GenV,
    IterV,
    ObjV,
    TupleV,
    Value,
)


@handler("KW_NAMES")
def KW_NAMES(fs: FrameState, inst: Instr) -> None:
    fs.kw_names = tuple(inst.argval)


@handler("CALL")
def CALL(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    args = fs.popn(inst.arg)
    b, a = fs.pop(), fs.pop()
    # [NULL, f, args...] calls f(args); [f, x, args...] calls f(x, args) (methods, comprehensions)
    fn, args = (b, args) if a is NULL else (a, [b, *args])
    kw_names, fs.kw_names = fs.kw_names, ()
    kwargs: dict[str, Value] = {}
    if kw_names:
        kwargs = dict(zip(kw_names, args[-len(kw_names) :], strict=True))
        args = args[: -len(kw_names)]
    fs.push(call_value(fs, fn, args, kwargs))


@handler("CALL_FUNCTION_EX")
def CALL_FUNCTION_EX(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    kwargs_value = fs.pop() if inst.arg & 1 else None
    args = iterate(fs, fs.pop())
    fn = fs.pop()
    if fs.stack and fs.peek() is NULL:
        fs.pop()
    kwargs: dict[str, Value] = {}
    if kwargs_value is not None:
        if not isinstance(kwargs_value, DictV):
            raise Unsupported(f"** of a {type(kwargs_value).__name__}", "call")
        kwargs = dict(fs.tracer.heap.get(kwargs_value.ref))
    fs.push(call_value(fs, fn, args, kwargs))


@handler("MAKE_FUNCTION")
def MAKE_FUNCTION(fs: FrameState, inst: Instr) -> None:
    assert inst.arg is not None
    code = fs.pop()
    assert isinstance(code, Const), code
    closure = fs.pop() if inst.arg & 0x08 else TupleV(())
    if inst.arg & 0x04:
        fs.pop()  # annotations: not needed to run the function
    kwdefaults = fs.pop() if inst.arg & 0x02 else None
    defaults = fs.pop() if inst.arg & 0x01 else TupleV(())
    assert isinstance(closure, TupleV)
    cells = tuple(c for c in closure.items if isinstance(c, CellV))
    kw: tuple[tuple[str, Value], ...] = ()
    if isinstance(kwdefaults, DictV):
        kw = tuple(fs.tracer.heap.get(kwdefaults.ref).items())
    default_values = tuple(iterate(fs, defaults))
    fs.push(
        FuncV(
            code.value,
            fs.globals,
            defaults=default_values,
            kwdefaults=kw,
            closure=cells,
        )
    )


@handler("LOAD_ASSERTION_ERROR")
def LOAD_ASSERTION_ERROR(fs: FrameState, inst: Instr) -> None:
    fs.push(ObjV(AssertionError))  # an assert that fails while tracing: raised natively


@handler("RETURN_VALUE")
def RETURN_VALUE(fs: FrameState, inst: Instr) -> None:
    fs.result = fs.pop()


# Generators: each runs in its own frame, suspended in the heap (see ``generators``).


@handler("RETURN_GENERATOR")
def RETURN_GENERATOR(fs: FrameState, inst: Instr) -> None:
    if fs.depth == 0:
        raise Unsupported("a generator frame outside of a call that consumes it", "generator")
    fs.push(Const(None))  # what the first next() sends; the prologue's POP_TOP drops it


@handler("GET_YIELD_FROM_ITER")
def GET_YIELD_FROM_ITER(fs: FrameState, inst: Instr) -> None:
    source = fs.pop()
    iterator = isinstance(source, IterV | GenV)
    fs.push(source if iterator else make_iter(fs, iterate(fs, source)))


@handler("SEND")
def SEND(fs: FrameState, inst: Instr) -> None:
    """``yield from it``: send into ``it``; its yield is ours, its return value ends the loop."""
    sent = fs.pop()
    receiver = fs.peek()
    if isinstance(receiver, GenV):
        done, value = generators.resume(fs, receiver, sent)
    elif isinstance(sent, Const) and sent.value is None:
        done, value = generators.next_value(fs, receiver)
    else:
        raise Unsupported(f"sending a value into a {type(receiver).__name__}", "generator")
    if done:
        fs.stack[-1] = value
        fs.jump(inst)
    else:
        fs.push(value)


@handler("YIELD_VALUE")
def YIELD_VALUE(fs: FrameState, inst: Instr) -> None:
    fs.yielded = fs.pop()  # run_frame returns; resuming pushes the value sent
