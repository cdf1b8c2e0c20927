"""Generators ember runs: a suspended frame in the heap, resumed where the program resumes it.

Calling a generator function inside the trace makes a :class:`~ember.capture.values.GenV`
whose frame (a :class:`GenState`) lives in the heap and has not started. ``next()``,
``send()``, a ``for`` loop or ``yield from`` resume it (:func:`resume`) until its next
``YIELD_VALUE`` suspends it again or it returns; ``throw()`` and ``close()`` raise an
exception at the suspended ``yield`` (:func:`throw`, :func:`close`). Side effects of the
generator and of its consumer so interleave as in CPython.

A generator cannot outlive the graph: one returned, or alive at a graph break, cannot be
rebuilt (the frame then runs eagerly). One left suspended inside a ``try`` or ``with``
block when the trace ends would run its ``finally`` at ``close()`` or garbage collection,
which the graph cannot do: :func:`check_finished` makes that unsupported.

>>> state = GenState(frame=None)
>>> state.started, state.done
(False, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ember.capture import bytecode_311
from ember.capture.tracer import FrameState, Raised, Tracer, Unsupported
from ember.capture.values import Const, ExcV, GenV, IterV, TupleV, Value

__all__ = [
    "GenState",
    "check_finished",
    "close",
    "drain",
    "make_generator",
    "next_value",
    "resume",
    "stop_iteration",
    "throw",
]


@dataclass(eq=False)
class GenState:
    """A generator's frame and where it is in its life."""

    frame: Any  # the FrameState of the generator function (Any: doctests make one without)
    call: Any = None  # (FuncV, args, kwargs) it was made by: how to make it again, unstarted
    started: bool = False
    done: bool = False
    running: bool = False


def make_generator(fs: FrameState, frame: FrameState, call: Any) -> GenV:
    """A new generator over ``frame`` (a generator function's frame, arguments bound), made
    by ``call`` (the function, its arguments and keyword arguments)."""
    state = GenState(frame, call)
    fs.tracer.generators.append(state)
    return GenV(fs.tracer.heap.new(state))


def _state(fs: FrameState, g: GenV) -> GenState:
    state = fs.tracer.heap.get(g.ref)
    assert isinstance(state, GenState)
    return state


def _error(cls: type, message: str) -> Raised:
    return Raised(ExcV(cls, (Const(message),)))


def resume(fs: FrameState, g: GenV, sent: Value) -> tuple[bool, Value]:
    """Send ``sent`` into ``g`` (``next()`` sends None): ``(False, value)`` for a yield,
    ``(True, value)`` once it has returned ``value``. What it raises propagates."""
    state = _state(fs, g)
    if state.running:
        raise _error(ValueError, "generator already executing")
    if state.done:
        return True, Const(None)
    if not state.started:
        if not (isinstance(sent, Const) and sent.value is None):
            raise _error(TypeError, "can't send non-None value to a just-started generator")
        state.started = True  # its RETURN_GENERATOR pushes the None the prologue pops
    else:
        state.frame.push(sent)  # what the suspended YIELD_VALUE evaluates to
    return _run(fs, state)


def _run(fs: FrameState, state: GenState) -> tuple[bool, Value]:
    from ember.capture.interpreter import run_frame

    gen: FrameState = state.frame
    gen.parent, gen.depth, gen.yielded = fs, fs.depth + 1, None
    state.running = True
    try:
        run_frame(gen)
    except Raised as e:
        state.done = True
        if isinstance(e.exc, ExcV) and issubclass(e.exc.cls, StopIteration):  # PEP 479
            message = Const("generator raised StopIteration")
            raise Raised(ExcV(RuntimeError, (message,), cause=e.exc)) from None
        raise
    finally:
        state.running = False
    if gen.yielded is not None:
        return False, gen.yielded
    state.done = True
    assert gen.result is not None
    return True, gen.result


def throw(fs: FrameState, g: GenV, exc: ExcV) -> tuple[bool, Value]:
    """``g.throw(exc)``: raise ``exc`` at the suspended ``yield``; then as :func:`resume`."""
    from ember.capture.interpreter import unwind

    state = _state(fs, g)
    if state.running:
        raise _error(ValueError, "generator already executing")
    if state.done or not state.started:
        state.done = True
        raise Raised(exc)
    gen: FrameState = state.frame
    delegate = _delegate(gen)
    if isinstance(delegate, GenV):
        if not issubclass(exc.cls, GeneratorExit):
            raise Unsupported("throwing into a generator suspended in yield from", "generator")
        close(fs, delegate)  # CPython closes the delegate, then raises in the generator
    if not unwind(gen, exc, gen.ip - 1):  # the yield raises it
        state.done = True
        raise Raised(exc)
    return _run(fs, state)


def _delegate(gen: FrameState) -> Value | None:
    """The iterator a generator suspended in ``yield from`` delegates to (None if not)."""
    resume_at = gen.instrs[gen.ip] if gen.ip < len(gen.instrs) else None
    if resume_at is None or resume_at.opname != "RESUME":
        return None
    if (resume_at.arg or 0) < bytecode_311.RESUME_DELEGATING:
        return None
    return gen.stack[-1]


def close(fs: FrameState, g: GenV) -> Value:
    """``g.close()``: GeneratorExit at the suspended ``yield``; its ``finally`` blocks run."""
    state = _state(fs, g)
    if state.done or not state.started:
        state.done = True
        return Const(None)
    try:
        done, _ = throw(fs, g, ExcV(GeneratorExit, ()))
    except Raised as e:
        if isinstance(e.exc, ExcV) and issubclass(e.exc.cls, GeneratorExit | StopIteration):
            return Const(None)
        raise
    if not done:
        raise _error(RuntimeError, "generator ignored GeneratorExit")
    return Const(None)


def stop_iteration(value: Value) -> ExcV:
    """The StopIteration that ends iteration of a generator that returned ``value``."""
    none = isinstance(value, Const) and value.value is None
    return ExcV(StopIteration, () if none else (value,))


def drain(fs: FrameState, g: GenV) -> list[Value]:
    """Everything ``g`` yields until it returns (``list(g)``); unbounded generators stop at
    the translator's step budget (their loops jump)."""
    out: list[Value] = []
    while True:
        done, value = resume(fs, g, Const(None))
        if done:
            return out
        out.append(value)


def refresh_dict_iter(fs: FrameState, it: IterV) -> None:
    """Bring the remaining items of an iterator over a dict up to date with the dict: its
    values as they are now, RuntimeError if it changed size (as CPython raises)."""
    heap = fs.tracer.heap
    live = heap.dict_iters.get(it.ref)
    if live is None:
        return
    ref, kind, keys = live
    items: dict[Any, Value] = heap.get(ref)
    if len(items) != len(keys):
        message = "dictionary changed size during iteration"
        raise Raised(ExcV(RuntimeError, (Const(message),)), message)
    if tuple(items) != keys:
        raise Unsupported("a dict's keys changed while iterating it", "iteration")
    rest = keys[len(keys) - len(heap.get(it.ref)) :]
    heap.set(it.ref, [_dict_step(kind, k, items) for k in rest])


def _dict_step(kind: str, key: Any, items: dict[Any, Value]) -> Value:
    if kind == "keys":
        return Const(key)
    return items[key] if kind == "values" else TupleV((Const(key), items[key]))


def next_value(fs: FrameState, it: Value) -> tuple[bool, Value]:
    """One step of iterating ``it`` (a generator or a static iterator): (exhausted, value)."""
    if isinstance(it, GenV):
        return resume(fs, it, Const(None))
    if isinstance(it, IterV):
        refresh_dict_iter(fs, it)
        remaining = fs.tracer.heap.get(it.ref)
        return (False, remaining.pop(0)) if remaining else (True, Const(None))
    raise Unsupported(f"iterating a {type(it).__name__} ember cannot read ahead", "iteration")


def check_finished(tracer: Tracer) -> None:
    """Unsupported if a generator is left suspended inside a ``try``/``with`` block: CPython
    would run its ``finally`` when closing it later, which the graph cannot do."""
    for state in tracer.generators:
        if not state.started or state.done:
            continue
        gen: FrameState = state.frame
        if bytecode_311.unwind_table(gen.code)[gen.ip - 1] is not None:
            raise Unsupported(
                f"generator {gen.code.co_name} left suspended inside a try or with block "
                "(its finally would run when it is closed)",
                "generator",
            )
