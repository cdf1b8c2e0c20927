"""Graph breaks: run the graph so far, the instruction ember cannot follow natively, then resume.

When translation stops at an instruction of the frame (its own, or a call
whose callee it could not follow), the frame is translated again up to just
before that instruction, and its replacement becomes, in bytecode:

1. call the *prefix* (a generated Python function, see ``codegen``): it runs the
   graph and returns the values of the stack and of the live locals, rebuilt;
2. push those values and store the locals, as the original code had them;
3. the break instruction(s), copied from the original code (``KW_NAMES``,
   ``PRECALL``, ``CALL`` for a call), so CPython runs them natively;
4. call a *resume function* with the stack and the live locals, return its result.
   A conditional jump gets two resume functions, one per direction.

A resume function is the original code with a new prologue that pushes the
stack (passed as arguments) and jumps to the instruction after the break. It is
a fresh code object, so the hook compiles it when it is first called, and so on
after each break. Resume code is cached per (code, target, stack, locals), so
recompiling a frame reuses it and its cache.

The frame's cell variables travel like its locals: the resume function makes its
own cells and stores their contents (a closure made before the break and still
alive would need the very same cells: it cannot be rebuilt, so that frame runs
eagerly). NULLs below the break (``print(t.item())``) are not passed: the resume
function pushes them again.

What cannot break (the frame then runs eagerly, with the reason recorded):
instructions inside ``try``/``with`` blocks, values that cannot be rebuilt.

>>> sorted(BREAKABLE)[:3]
['BINARY_OP', 'BINARY_SUBSCR', 'BUILD_STRING']
"""

from __future__ import annotations

import dataclasses
import dis
import inspect
import types
import weakref
from dataclasses import dataclass
from typing import Any

from ember.capture import bytecode_311 as bc
from ember.capture.assemble import CodeSpec, assemble
from ember.capture.bytecode_311 import Instr, Label

# Instructions that can run natively between two graphs: their operands are on the
# stack and they do not read or write names or jump (conditional jumps are handled apart).
BREAKABLE = frozenset(
    {
        "CALL", "CALL_FUNCTION_EX", "BINARY_OP", "BINARY_SUBSCR", "STORE_SUBSCR",
        "DELETE_SUBSCR", "STORE_ATTR", "LOAD_ATTR", "COMPARE_OP", "CONTAINS_OP", "IS_OP",
        "FORMAT_VALUE", "BUILD_STRING", "UNARY_NEGATIVE", "UNARY_POSITIVE", "UNARY_INVERT",
        "UNARY_NOT", "GET_ITER", "STORE_GLOBAL",
    }
)  # fmt: skip
CONDITIONAL = frozenset(
    f"POP_JUMP_{d}_IF_{c}"
    for d in ("FORWARD", "BACKWARD")
    for c in ("TRUE", "FALSE", "NONE", "NOT_NONE")
)
CO_FLAGS_DROPPED = inspect.CO_VARARGS | inspect.CO_VARKEYWORDS

PREFIX = "__ember_"


class CannotBreak(Exception):
    """This frame cannot break at this instruction; it runs eagerly."""


@dataclass(frozen=True, slots=True)
class Span:
    """The instructions run natively at a break: ``start`` .. ``end`` (indices, included).

    ``terminal`` spans (a raise) never fall through: nothing resumes after them.
    """

    start: int
    end: int
    conditional: bool
    terminal: bool = False
    # inside a ``with`` block: the block's exit sits at this stack index (its handler
    # restores the block's state if the span raises)
    block_exit: int | None = None

    def operands(self, instrs: list[Instr]) -> int:
        """How many stack values the span consumes."""
        last = instrs[self.end]
        if self.conditional:
            return 1
        if self.terminal:
            return int(last.arg or 0)
        if last.opname == "CALL":
            return int(last.arg or 0) + 2
        effect = dis.stack_effect(
            dis.opmap[last.opname], last.arg if last.arg is not None else None
        )
        produced = (
            0
            if last.opname in ("STORE_SUBSCR", "STORE_ATTR", "DELETE_SUBSCR", "STORE_GLOBAL")
            else 1
        )
        return produced - effect


def find_span(code: types.CodeType, index: int) -> Span:
    """The span to run natively when translation stopped at instruction ``index``."""
    instrs, entries = bc.decode(code)
    op = _opname(code, instrs[index])
    if op in CONDITIONAL:
        span = Span(index, index, conditional=True)
    elif op in ("CALL", "PRECALL"):
        call = index if op == "CALL" else index + 1
        start = call - 1
        if start > 0 and instrs[start - 1].opname == "KW_NAMES":
            start -= 1
        span = Span(start, call, conditional=False)
    elif op in BREAKABLE:
        span = Span(index, index, conditional=False)
    elif op == "RAISE_VARARGS":
        span = Span(index, index, conditional=False, terminal=True)
    else:
        raise CannotBreak(f"{op} cannot run on its own between two graphs")
    covering = _covering(instrs, entries, span)
    if covering is None:
        return span
    if not _with_handler(instrs, entries, covering):
        raise CannotBreak("the break is inside a try block (or a with block inside one)")
    return dataclasses.replace(span, block_exit=covering.depth - 1)


def _opname(code: types.CodeType, ins: Instr) -> str:
    assert ins.offset is not None
    return dis.opname[code.co_code[ins.offset]]


def _covering(
    instrs: list[Instr], entries: list[bc.ExceptionEntry], span: Span
) -> bc.ExceptionEntry | None:
    """The exception entry that handles the span (the innermost; later entries win)."""
    where = bc.label_index(instrs)
    found = [e for e in entries if where[e.start] <= span.end and span.start <= where[e.end]]
    if not found:
        return None
    if any(not (where[e.start] <= span.start and span.end <= where[e.end]) for e in found):
        raise CannotBreak("the break straddles the edge of a try or with block")
    return found[-1]


def _with_handler(
    instrs: list[Instr], entries: list[bc.ExceptionEntry], entry: bc.ExceptionEntry
) -> bool:
    """Whether ``entry`` is a top-level ``with`` block's handler: ``PUSH_EXC_INFO;
    WITH_EXCEPT_START`` at its target, and no other handler around that handler's code
    but its own cleanup (so that only the block's exit runs when the block raises)."""
    where = bc.label_index(instrs)
    target = where[entry.target]
    if [i.opname for i in instrs[target : target + 2]] != ["PUSH_EXC_INFO", "WITH_EXCEPT_START"]:
        return False
    around = [e for e in entries if where[e.start] <= target <= where[e.end]]
    if len(around) != 1:  # the handler's own cleanup entry (COPY 3; POP_EXCEPT; RERAISE 1)
        return False
    cleanup = where[around[0].target]
    return not any(where[e.start] <= cleanup <= where[e.end] for e in entries)


# -- resume functions --------------------------------------------------------------------------

_RESUME_CACHE: dict[tuple[Any, ...], types.CodeType] = {}
# id(resume code) -> (a weak reference to it, the original code, how many instructions
# earlier the original has each instruction): a resume function that breaks again resumes
# from the original code, so a loop that breaks on every turn reuses one resume function
# instead of making one per turn. Keyed by identity (code objects compare by value, so an
# equal resume code made after reset() must not lose its entry when the old one dies), and
# kept by clear_cache(): a resume function still running on another thread when reset()
# runs must resume from the original too (a resume of a resume read unbound locals).
_RESUME_ORIGIN: dict[int, tuple[weakref.ref[types.CodeType], types.CodeType, int]] = {}


def _origin(code: types.CodeType) -> tuple[types.CodeType, int] | None:
    found = _RESUME_ORIGIN.get(id(code))
    return (found[1], found[2]) if found is not None and found[0]() is code else None


def _set_origin(new: types.CodeType, original: types.CodeType, shift: int) -> None:
    key = id(new)

    # the dict is bound here, not looked up: a code object that dies while the interpreter
    # shuts down calls this after the module's globals were cleared to None
    def forget(ref: weakref.ref[types.CodeType], origins: dict[Any, Any] = _RESUME_ORIGIN) -> None:
        if origins.get(key, (None,))[0] is ref:
            del origins[key]

    _RESUME_ORIGIN[key] = (weakref.ref(new, forget), original, shift)


def resume_code(
    code: types.CodeType,
    target: int,
    kinds: tuple[int, ...],
    live: tuple[str, ...],
    cells: tuple[str, ...] = (),
) -> types.CodeType:
    """The code that continues ``code`` at instruction ``target`` (cached).

    Its arguments are the ``live`` locals, the contents of the bound cell variables
    ``cells``, then the stack values (bottom first; ``kinds`` says which are
    iterators, passed as lists, and where NULLs go, not passed).
    """
    origin = _origin(code)
    if origin is not None:  # a resume function breaking again: continue the original code
        original, shift = origin
        return resume_code(original, target - shift, kinds, live, cells)
    key = (code, target, kinds, live, cells)
    cached = _RESUME_CACHE.get(key)
    if cached is not None:
        return cached
    instrs, entries = bc.decode(code)
    body = [
        i for i in instrs if i.opname not in bc.PROLOGUE_OPS and not _is_first_resume(i, instrs)
    ]
    removed = len(instrs) - len(body)  # the original prologue, all at the front
    target_instr = instrs[target]
    label = target_instr.label or Label(f"resume_{target}")
    if target_instr.label is None:
        replaced = dataclasses.replace(target_instr, label=label)
        body = [replaced if i is target_instr else i for i in body]
    stack_names = tuple(f"{PREFIX}s{k}" for k, kind in enumerate(kinds) if kind != NULL_SLOT)
    args = carried_order(code, live + tuple(cell_argument(n) for n in cells)) + stack_names
    prologue = _prologue(code, with_cells=True)
    for name in cells:
        prologue += [Instr("LOAD_FAST", cell_argument(name)), Instr("STORE_DEREF", name)]
    names = iter(stack_names)
    for kind in kinds:
        if kind == NULL_SLOT:
            prologue.append(Instr("PUSH_NULL"))
            continue
        prologue.append(Instr("LOAD_FAST", next(names)))
        prologue += [Instr("GET_ITER")] if kind == ITER_SLOT else []
    prologue.append(Instr("JUMP_FORWARD", label))
    # (an argument that is also a cell is only a cell here: its content comes in as an argument)
    rest = tuple(n for n in code.co_varnames if n not in args and n not in code.co_cellvars)
    spec = CodeSpec.of(
        code,
        name=f"{PREFIX}resume_at_{target_instr.offset}_{code.co_name}",
        qualname=f"{code.co_qualname}.<resume at {target_instr.offset}>",
        argcount=len(args),
        posonlyargcount=0,
        kwonlyargcount=0,
        varnames=args + rest,
        flags=code.co_flags & ~CO_FLAGS_DROPPED,
    )
    new = assemble(prologue + body, entries, spec)
    _RESUME_CACHE[key] = new
    _set_origin(new, code, len(prologue) - removed)
    return new


def carried_order(code: types.CodeType, carried: tuple[str, ...]) -> tuple[str, ...]:
    """The order in which a resume function takes the frame's locals: the frame's first
    argument first (a plain local even if it was a cell), because a zero-argument
    ``super()`` reads the first local slot, with the ``__class__`` cell the resume
    function shares with the original.

    >>> carried_order((lambda self, x: 0).__code__, ("x", cell_argument("self")))
    ('__ember_c_self', 'x')
    """
    if not code.co_argcount:
        return carried
    first = code.co_varnames[0]
    for name in (first, cell_argument(first)):
        if name in carried:
            return (name, *(n for n in carried if n != name))
    return carried


def _is_first_resume(ins: Instr, instrs: list[Instr]) -> bool:
    first = next(i for i in instrs if i.opname == "RESUME")
    return ins is first


def cell_argument(name: str) -> str:
    """The argument (of a resume function) or local (of a replacement) holding a cell's content."""
    return f"{PREFIX}c_{name}"


def _prologue(code: types.CodeType, with_cells: bool = False) -> list[Instr]:
    out = [Instr("MAKE_CELL", n) for n in code.co_cellvars] if with_cells else []
    out += [Instr("COPY_FREE_VARS", len(code.co_freevars))] if code.co_freevars else []
    return [*out, Instr("RESUME", 0)]


# -- the replacement of the breaking frame ---------------------------------------------------------


# What a stack slot holds at a break.
NULL_SLOT, VALUE_SLOT, ITER_SLOT = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Layout:
    """What the prefix returns and how the replacement lays it out.

    ``stack`` has one entry per stack slot before the span: ``NULL_SLOT``, or a value
    taken from the prefix's result in order. An ``ITER_SLOT`` is a loop's iterator: the
    prefix returns its remaining items as a list, the replacement iterates it
    (``GET_ITER``), and the resume function receives a list again and does the same,
    so the translator only ever sees a plain list. ``live`` names the bound locals
    stored from the rest of the result (ember's own temporaries never are).
    """

    stack: tuple[int, ...]
    live: tuple[str, ...]
    cells: tuple[str, ...] = ()  # bound cell variables, their contents after the locals


def replacement_code(
    code: types.CodeType,
    span: Span,
    layout: Layout,
    prefix: types.FunctionType,
    resumes: tuple[types.FunctionType, ...],
) -> types.CodeType:
    """The code that replaces frames of ``code``: prefix, native span, resume call(s)."""
    instrs, _ = bc.decode(code)
    where = instrs[span.start].positions
    args = inspect_args(code)
    temp = f"{PREFIX}t"
    out: list[Instr] = _prologue(code)
    out += [Instr("PUSH_NULL"), Instr("LOAD_CONST", prefix)]
    out += [Instr("LOAD_FAST", a) for a in args]
    out += [Instr("PRECALL", len(args)), Instr("CALL", len(args)), Instr("STORE_FAST", temp)]
    k = 0
    for index, slot in enumerate(layout.stack):
        if slot == NULL_SLOT:
            out.append(Instr("PUSH_NULL"))
            continue
        out += [Instr("LOAD_FAST", temp), Instr("LOAD_CONST", k), Instr("BINARY_SUBSCR")]
        out += [Instr("GET_ITER")] if slot == ITER_SLOT else []
        if index == span.block_exit:  # kept apart for the handler below
            out += [Instr("COPY", 1), Instr("STORE_FAST", BLOCK_EXIT)]
        k += 1
    stored = layout.live + tuple(cell_argument(n) for n in layout.cells)  # prefix's order
    for name in stored:
        out += [Instr("LOAD_FAST", temp), Instr("LOAD_CONST", k), Instr("BINARY_SUBSCR")]
        out.append(Instr("STORE_FAST", name))
        k += 1
    out.append(Instr("DELETE_FAST", temp))  # do not keep the graph's outputs alive meanwhile
    native = [dataclasses.replace(i, label=None) for i in instrs[span.start : span.end + 1]]
    handler, entries = _block_handler(native) if span.block_exit is not None else ([], [])
    kinds = () if span.terminal else slots_after(instrs, span, layout)
    carried = carried_order(code, stored)  # the resume function's order
    if span.terminal:
        out += native
    elif span.conditional:
        other = Label("other_branch")
        native[-1] = dataclasses.replace(native[-1], argval=other)
        jumped = _call_resume(resumes[1], kinds, carried)
        jumped[0] = dataclasses.replace(jumped[0], label=other)
        out += native + _call_resume(resumes[0], kinds, carried) + jumped
    else:
        out += native + _call_resume(resumes[0], kinds, carried)
    out = [dataclasses.replace(i, positions=i.positions or where) for i in out + handler]
    temps = tuple(f"{PREFIX}r{j}" for j in range(len(kinds)))
    cell_temps = tuple(n for n in stored[len(layout.live) :] if n not in code.co_varnames)
    spec = CodeSpec.of(
        code,  # every argument slot positional, as the hook passes them
        argcount=len(args),
        posonlyargcount=0,
        kwonlyargcount=0,
        varnames=(*code.co_varnames, temp, *temps, *cell_temps, BLOCK_EXIT),
        cellvars=(),  # cell contents are plain locals here; the resume function has the cells
        flags=code.co_flags & ~CO_FLAGS_DROPPED,
    )
    return assemble(out, entries, spec)


BLOCK_EXIT = f"{PREFIX}exit"


def _block_handler(native: list[Instr]) -> tuple[list[Instr], list[bc.ExceptionEntry]]:
    """Protect the native span inside a ``with`` block as the block would: on an exception,
    call the block's exit, then raise again (``try: span finally: exit(None, None, None)``).

    Labels the span's first and last instructions in place; returns the handler's
    instructions (placed after the code, never fallen into) and its exception entries.
    """
    first, last, handler, reraise, cleanup = (
        Label(f"block_{n}") for n in ("first", "last", "handler", "reraise", "cleanup")
    )
    if len(native) == 1:
        last = first
    native[0] = dataclasses.replace(native[0], label=first)
    native[-1] = dataclasses.replace(native[-1], label=last)
    code = [
        Instr("PUSH_EXC_INFO", label=handler),
        Instr("PUSH_NULL"),
        Instr("LOAD_FAST", BLOCK_EXIT),
        *(Instr("LOAD_CONST", None) for _ in range(3)),
        Instr("PRECALL", 3),
        Instr("CALL", 3),
        Instr("POP_TOP"),
        Instr("RERAISE", 0, label=reraise),
        Instr("COPY", 3, label=cleanup),
        Instr("POP_EXCEPT"),
        Instr("RERAISE", 1),
    ]
    protected = bc.ExceptionEntry(first, last, handler, depth=0)
    cleaned = bc.ExceptionEntry(handler, reraise, cleanup, depth=1, lasti=True)
    return code, [protected, cleaned]


def slots_after(instrs: list[Instr], span: Span, layout: Layout) -> tuple[int, ...]:
    """The kinds of the stack slots after the span ran (no NULL may remain: it would
    crash the tuple the resume function's arguments are built in)."""
    below = len(layout.stack) - span.operands(instrs)
    if below < 0:
        raise CannotBreak("the break consumes more stack values than the frame has")
    results = () if span.conditional else (VALUE_SLOT,) * _results(instrs[span.end])
    return layout.stack[:below] + results


def resume_targets(code: types.CodeType, span: Span) -> list[int]:
    """Where execution continues after the span: the next instruction, and a jump's target."""
    instrs, _ = bc.decode(code)
    if span.terminal:
        return []
    targets = [span.end + 1]
    if span.conditional:
        label = instrs[span.end].target
        assert label is not None
        targets.append(bc.label_index(instrs)[label])
    return targets


def _results(ins: Instr) -> int:
    return 0 if ins.opname in ("STORE_SUBSCR", "STORE_ATTR", "DELETE_SUBSCR", "STORE_GLOBAL") else 1


def _call_resume(
    resume: types.FunctionType, kinds: tuple[int, ...], live: tuple[str, ...]
) -> list[Instr]:
    """Collect the stack and live locals and ``return resume(*locals, *stack)``.

    Iterators go as lists of their remaining items (``list(it)``).
    """
    out: list[Instr] = []
    temps = [f"{PREFIX}r{j}" for j in range(len(kinds))]
    out += [Instr("STORE_FAST", t) for t in reversed(temps)]  # a NULL stored unbinds its temp
    for kind, t in zip(kinds, temps, strict=True):
        if kind == NULL_SLOT:
            continue  # the resume function pushes it again
        if kind == ITER_SLOT:
            out += [Instr("PUSH_NULL"), Instr("LOAD_CONST", list), Instr("LOAD_FAST", t)]
            out += [Instr("PRECALL", 1), Instr("CALL", 1)]
        else:
            out.append(Instr("LOAD_FAST", t))
    out.append(Instr("BUILD_TUPLE", sum(kind != NULL_SLOT for kind in kinds)))
    out += [Instr("LOAD_FAST", n) for n in live]
    out += [Instr("BUILD_TUPLE", len(live)), Instr("SWAP", 2), Instr("BINARY_OP", 0)]
    out += [Instr("PUSH_NULL"), Instr("SWAP", 2), Instr("LOAD_CONST", resume), Instr("SWAP", 2)]
    out += [Instr("CALL_FUNCTION_EX", 0), Instr("RETURN_VALUE")]
    return out


def inspect_args(code: types.CodeType) -> tuple[str, ...]:
    """The argument slots of ``code``, in order."""
    n = code.co_argcount + code.co_kwonlyargcount
    n += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return code.co_varnames[:n]


def clear_cache() -> None:
    """Forget cached resume code (``ember.compiler.reset()`` calls this)."""
    _RESUME_CACHE.clear()
