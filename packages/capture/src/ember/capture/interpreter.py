"""The symbolic interpreter: one handler per 3.11 opcode, over a stack of values.

Handlers live in family modules (``ops_load``, ``ops_stack``, ``ops_build``,
``ops_call``, ``ops_jump``, ``ops_except``) and register themselves here with ``@handler``,
keyed by ``dis`` opname; :data:`HANDLERS` is the table :func:`run_frame`
dispatches on. An opcode with no handler is a graph break with a reason
(:data:`UNSUPPORTED` says why for the ones left out on purpose), never an
``AttributeError``.

>>> "LOAD_FAST" in HANDLERS and "BINARY_OP" in HANDLERS
True
"""

from __future__ import annotations

import dis
import os
from collections.abc import Callable

from ember.capture import bytecode_311
from ember.capture.tracer import (
    MAX_INLINE_DEPTH,
    NO_BREAK,
    FrameState,
    Instr,
    Raised,
    Unsupported,
)
from ember.capture.values import Const, Value

# A break inside a polyfill (Module.__call__'s running a hook ember cannot trace) is
# reported at the user's line that called it; the stack keeps the polyfill's frames.
_POLYFILLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "polyfills", "")

Handler = Callable[[FrameState, Instr], None]

HANDLERS: dict[str, Handler] = {}

# Opcodes deliberately not handled, with the reason a user sees.
UNSUPPORTED: dict[str, str] = {
    "SETUP_ANNOTATIONS": "class or module bodies are not captured",
    "IMPORT_STAR": "import statements inside compiled code",
    "LOAD_NAME": "class or module bodies are not captured",
    "STORE_NAME": "class or module bodies are not captured",
    "DELETE_NAME": "class or module bodies are not captured",
    "LOAD_CLASSDEREF": "class bodies are not captured",
    "LOAD_BUILD_CLASS": "defining a class inside compiled code",
    "DELETE_GLOBAL": "deleting a global inside compiled code (a side effect)",
    "BEFORE_ASYNC_WITH": "async code",
    "CHECK_EG_MATCH": "except* inside compiled code",
    "PREP_RERAISE_STAR": "except* inside compiled code",
    "GET_AWAITABLE": "async code",
    "GET_AITER": "async code",
    "GET_ANEXT": "async code",
    "END_ASYNC_FOR": "async code",
    "ASYNC_GEN_WRAP": "async code",
    "MATCH_CLASS": "match statements",
    "MATCH_MAPPING": "match statements",
    "MATCH_SEQUENCE": "match statements",
    "MATCH_KEYS": "match statements",
    "GET_LEN": "match statements",
    "COPY_DICT_WITHOUT_KEYS": "match statements",
    "PRINT_EXPR": "interactive-mode code",
    "DELETE_DEREF": "deleting a closure variable",
    "CACHE": "an inline cache entry is not an instruction",
    "EXTENDED_ARG": "decoded away by dis",
}


def handler(*opnames: str) -> Callable[[Handler], Handler]:
    """Register ``fn`` as the handler of each of ``opnames`` (which must be real 3.11 opnames)."""

    def register(fn: Handler) -> Handler:
        for name in opnames:
            if name not in dis.opmap:
                raise ValueError(f"{name} is not a 3.11 opname")
            if name in HANDLERS:
                raise ValueError(f"{name} already has a handler: {HANDLERS[name].__name__}")
            HANDLERS[name] = fn
        return fn

    return register


def run_frame(fs: FrameState, stop_at: int | None = None) -> Value | None:
    """Step through ``fs`` until it returns (its value), yields (None, ``fs.yielded`` set), or
    reaches ``stop_at`` (None).

    An exception the traced code raises (:class:`Raised`) jumps to the handler of the
    instruction that raised it, or leaves the frame for its caller's handlers. When something
    is unsupported, or an exception escapes, the outermost frame records the index of its
    instruction that was running (``Unsupported.top_index``): where a graph break goes.
    """
    if fs.depth > MAX_INLINE_DEPTH:
        raise Unsupported(f"calls nested deeper than {MAX_INLINE_DEPTH} (recursion?)", "call")
    while fs.result is None and fs.yielded is None:
        if fs.ip == stop_at:
            return None
        if fs.ip >= len(fs.instrs):
            raise Unsupported("ran off the end of the code", "internal")
        index = fs.ip
        inst = fs.instrs[index]
        fs.current = inst
        if fs.tracer.shapes.recording:  # the line of the branch that set each shape guard
            fs.tracer.shapes.note_where(fs.tracer.guards.where)
        fs.tracer.guards.where = (fs.code.co_filename, inst.lineno)
        fs.tracer.node_meta.frame = fs  # nodes made now come from this frame (nodemeta)
        fs.ip += 1
        fn = HANDLERS.get(inst.opname)
        try:
            if fn is None:
                reason = UNSUPPORTED.get(inst.opname, "no handler for this opcode")
                raise Unsupported(f"{inst.opname}: {reason}", "opcode")
            fn(fs, inst)
        except Raised as e:
            first = fs.raised_at.setdefault(id(e.exc), index)
            if unwind(fs, e.exc, index):
                continue
            if fs.depth != 0:
                raise
            raise _escaped(fs, e, first) from None
        except Unsupported as e:
            if e.location is None and (
                fs.depth == 0 or not fs.code.co_filename.startswith(_POLYFILLS)
            ):
                e.location = fs.location()  # the user's line, not a polyfill's
            e.stack.insert(0, fs.location())
            if fs.depth == 0 and e.category not in NO_BREAK:
                e.top_index = index
            raise
    return fs.result


def _escaped(fs: FrameState, e: Raised, index: int) -> Unsupported:
    """An exception leaving the outermost frame: a graph break at the instruction that first
    raised it there, so CPython raises it (and runs the handlers it met) for real."""
    fs.current = fs.instrs[index]
    escaped = Unsupported(e.reason, "exception", "raise it outside the compiled code")
    escaped.location, escaped.top_index = fs.location(), index
    escaped.stack = [escaped.location]
    return escaped


def unwind(fs: FrameState, exc: Value, index: int) -> bool:
    """Go to the handler of instruction ``index`` with ``exc`` raised there, as CPython's
    ``exception_unwind`` does: cut the stack to the entry's depth, push lasti if the entry
    says so, push the exception, jump. False when no handler covers the instruction."""
    where = bytecode_311.unwind_table(fs.code)[index]
    if where is None:
        return False
    del fs.stack[where.depth :]
    if where.lasti:
        fs.push(Const(index))  # only RERAISE reads it (for the traceback's line)
    fs.push(exc)
    fs.ip = where.target
    return True


def _load_families() -> None:
    # Importing the family modules fills HANDLERS (each registers with @handler).
    from ember.capture import (  # noqa: F401
        ops_build,
        ops_call,
        ops_except,
        ops_jump,
        ops_load,
        ops_stack,
    )


_load_families()
