"""Exceptions and ``with`` blocks: raising, catching, handlers, context managers.

An exception the traced code raises is a value (:class:`~ember.capture.values.ExcV`)
carried by :class:`~ember.capture.tracer.Raised`; ``interpreter.run_frame`` unwinds it to
the handler the 3.11 exception table names, and these handlers run the handler's code
(``PUSH_EXC_INFO``, ``CHECK_EXC_MATCH``, ``POP_EXCEPT``, ``RERAISE``, ...). A ``with``
block enters any context manager by calling its ``__enter__`` (inlined user code, or a
grad-mode/autocast value with a graph node of its own) and leaves it through ``__exit__``,
on the exception path with the exception's type and value (``WITH_EXCEPT_START``).
"""

from __future__ import annotations

import dataclasses

from ember.capture.attrs import load_attr
from ember.capture.calls import call_value
from ember.capture.interpreter import handler
from ember.capture.pyrules import as_exception, class_arg
from ember.capture.tracer import FrameState, Instr, Raised, Unsupported
from ember.capture.values import (
    Const,
    ExcV,
    GradExitV,
    GradModeV,
    ModeExitV,
    ModeV,
    ObjV,
)


@handler("RAISE_VARARGS")
def RAISE_VARARGS(fs: FrameState, inst: Instr) -> None:
    if not inst.arg:  # a bare ``raise``: the exception being handled
        if not isinstance(fs.tracer.exc_info, ExcV):
            raise Unsupported("a bare raise with no exception being handled", "exception")
        raise Raised(fs.tracer.exc_info)
    cause = fs.pop() if inst.arg == 2 else None
    exc = as_exception(fs, fs.pop())
    if cause is not None:
        none = isinstance(cause, Const) and cause.value is None
        exc = dataclasses.replace(exc, cause=None if none else as_exception(fs, cause))
    raise Raised(exc)


@handler("PUSH_EXC_INFO")
def PUSH_EXC_INFO(fs: FrameState, inst: Instr) -> None:
    exc = fs.pop()
    fs.push(fs.tracer.exc_info)  # restored by the handler's POP_EXCEPT
    fs.push(exc)
    fs.tracer.exc_info = exc


@handler("POP_EXCEPT")
def POP_EXCEPT(fs: FrameState, inst: Instr) -> None:
    fs.tracer.exc_info = fs.pop()


@handler("CHECK_EXC_MATCH")
def CHECK_EXC_MATCH(fs: FrameState, inst: Instr) -> None:
    """``except E:`` with ``E`` a class or a tuple of classes known while tracing."""
    wanted = class_arg(fs, fs.pop())
    exc = fs.peek()
    if not isinstance(exc, ExcV):
        raise Unsupported(f"matching a {type(exc).__name__} as an exception", "exception")
    fs.push(Const(issubclass(exc.cls, wanted)))


@handler("RERAISE")
def RERAISE(fs: FrameState, inst: Instr) -> None:
    exc = fs.pop()  # (with an oparg, lasti sits below: CPython resets the line from it)
    if not isinstance(exc, ExcV):
        raise Unsupported(f"re-raising a {type(exc).__name__}", "exception")
    raise Raised(exc)


@handler("WITH_EXCEPT_START")
def WITH_EXCEPT_START(fs: FrameState, inst: Instr) -> None:
    """The block raised: ``exit(type(exc), exc, None)``; a true result suppresses it."""
    exit_, exc = fs.peek(4), fs.peek()
    if not isinstance(exc, ExcV):
        raise Unsupported(f"a with block raising a {type(exc).__name__}", "exception")
    fs.push(call_value(fs, exit_, [ObjV(exc.cls), exc, Const(None)], {}))


@handler("BEFORE_WITH")
def BEFORE_WITH(fs: FrameState, inst: Instr) -> None:
    manager = fs.pop()
    if isinstance(manager, ModeV):
        token = fs.tracer.enter_mode(manager.enter, manager.exit, manager.args)
        fs.push(ModeExitV(manager.exit, token))
        fs.push(Const(None))  # what __enter__ returned (autocast's self is rarely used)
        return
    if isinstance(manager, GradModeV):
        if not manager.applied:
            fs.tracer.set_grad_enabled(manager.enabled)
        fs.push(GradExitV(manager.previous))  # what the block's end calls
        fs.push(Const(None))  # what __enter__ returned
        return
    # Any other context manager: its methods, called as CPython calls them.
    enter, exit_ = load_attr(fs, manager, "__enter__"), load_attr(fs, manager, "__exit__")
    fs.push(exit_)
    fs.push(call_value(fs, enter, [], {}))
