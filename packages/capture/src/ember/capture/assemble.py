"""From an instruction list back to a code object: checking, layout and encoding.

:func:`assemble` is the inverse of :func:`ember.capture.bytecode_311.decode`.
It builds ``co_consts``/``co_names`` from the instructions' values, indexes
locals and cells the 3.11 way, picks each jump's direction, sizes
``EXTENDED_ARG`` prefixes until jump offsets are stable, writes zeroed
``CACHE`` units, encodes the location table (PEP 626/657) and the exception
table, and computes ``co_stacksize`` by data-flow. :func:`check` runs first and
refuses anything that could crash CPython; with ``EMBER_CHECK=1`` the result is
decoded again and compared with the input.

>>> from ember.capture.bytecode_311 import Instr, decode
>>> def add_one(x):
...     return x + 1
>>> instrs, entries = decode(add_one.__code__)
>>> code = assemble(instrs, entries, CodeSpec.of(add_one.__code__))
>>> code == add_one.__code__
True

Build code from scratch (a ``LOAD_FAST`` of a name missing from ``varnames``
would add a local variable):

>>> body = [Instr("RESUME", 0), Instr("LOAD_FAST", "x"), Instr("LOAD_CONST", 2),
...         Instr("BINARY_OP", 5), Instr("RETURN_VALUE")]
>>> double = assemble(body, [], CodeSpec(name="double", argcount=1, varnames=("x",)))
>>> types.FunctionType(double, {})(21)
42

The two formats written here (location table, exception table) are shared by
CPython 3.11 to 3.13; every opcode fact comes from :mod:`ember.capture.bytecode_311`.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import opcode
import struct
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ember.capture import settings
from ember.capture.bytecode_311 import (
    ARG_BOUNDS,
    ARG_KINDS,
    CACHE_ENTRIES,
    FAMILY_OF,
    JUMP_FAMILIES,
    JUMPS,
    PROLOGUE_OPS,
    TERMINAL,
    BytecodeError,
    ExceptionEntry,
    Instr,
    Label,
    Positions,
    decode,
    handlers,
    label_index,
    localsplus_names,
    stack_effect,
    stack_needs,
)

__all__ = [
    "CodeSpec",
    "StackFlow",
    "assemble",
    "check",
    "stack_flow",
]


# -- analysis and checking ----------------------------------------------------------------------


def _where(index: int, instr: Instr) -> str:
    return f"#{index} {dataclasses.replace(instr, label=None)}"


@dataclass(frozen=True, slots=True)
class StackFlow:
    """Result of :func:`stack_flow`.

    >>> stack_flow([Instr("LOAD_CONST", 1), Instr("RETURN_VALUE")])
    StackFlow(depths=(0, 1), max_depth=1)
    """

    depths: tuple[int | None, ...]  # depth before each instruction; None where unreachable
    max_depth: int  # what co_stacksize must be


def stack_flow(instrs: Sequence[Instr], entries: Sequence[ExceptionEntry] = ()) -> StackFlow:
    """Stack depths by forward data-flow over fall-through, jump and exception edges.

    Raises :class:`BytecodeError` on an underflow, on two depths meeting at one
    instruction, on an exception entry deeper than the stack it covers, and
    when control can run past the last instruction.

    >>> stack_flow([Instr("POP_TOP"), Instr("RETURN_VALUE")])
    Traceback (most recent call last):
    ...
    ember.capture.bytecode_311.BytecodeError: stack underflow at #0 POP_TOP: needs 1 value(s), has 0
    """
    index, covering = label_index(instrs), handlers(instrs, entries)
    depths: list[int | None] = [None] * len(instrs)
    todo: list[int] = []
    max_depth = 0

    def reach(source: int, dest: int, depth: int, how: str) -> None:
        nonlocal max_depth
        max_depth = max(max_depth, depth)
        if dest == len(instrs):
            raise BytecodeError(
                f"control runs past the last instruction after {_where(source, instrs[source])}"
            )
        known = depths[dest]
        if known is None:
            depths[dest] = depth
            todo.append(dest)
        elif known != depth:
            raise BytecodeError(
                f"inconsistent stack depth at {_where(dest, instrs[dest])}: {known} on one path,"
                f" {depth} {how} {_where(source, instrs[source])}"
            )

    if instrs:
        reach(0, 0, 0, "at entry")
    while todo:
        i = todo.pop()
        _flow_one(i, instrs[i], depths[i] or 0, index, covering[i], reach)
    return StackFlow(tuple(depths), max_depth)


def _flow_one(
    i: int,
    instr: Instr,
    depth: int,
    index: Mapping[Label, int],
    entry: ExceptionEntry | None,
    reach: Callable[[int, int, int, str], None],
) -> None:
    need = stack_needs(instr)
    if depth < need:
        raise BytecodeError(
            f"stack underflow at {_where(i, instr)}: needs {need} value(s), has {depth}"
        )
    if entry is not None:
        if entry.depth > depth:
            raise BytecodeError(
                f"exception entry {entry} keeps {entry.depth} value(s) but the stack at"
                f" {_where(i, instr)} has {depth}"
            )
        reach(i, index[entry.target], entry.depth + entry.lasti + 1, "via exception from")
    if instr.opname in JUMPS:
        target = instr.target
        if target is None or target not in index:
            raise BytecodeError(f"{_where(i, instr)}: jump target {target} is not in the list")
        reach(i, index[target], depth + stack_effect(instr, jump=True), "by jump from")
    if instr.opname not in TERMINAL:
        reach(i, i + 1, depth + stack_effect(instr), "after")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and 0 <= value < 2**32


def _is_global(value: object) -> bool:
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], bool)
        and isinstance(value[1], str)
    )


# ARG_KINDS kind -> (test of argval, what it should be).
_ARG_SHAPES: Final[dict[str, tuple[Callable[[object], bool], str]]] = {
    "none": (lambda v: v is None, "no argument (None)"),
    "int": (_is_int, "an int in [0, 2**32)"),
    "const": (lambda v: True, "a constant"),
    "name": (lambda v: isinstance(v, str), "a name (str)"),
    "global": (_is_global, "(push_null: bool, name: str)"),
    "local": (lambda v: isinstance(v, str), "a local variable name (str)"),
    "cell": (lambda v: isinstance(v, str), "a cell or free variable name (str)"),
    "jump": (lambda v: isinstance(v, Label), "a Label"),
}


def _check_arg(i: int, instr: Instr) -> None:
    if instr.opname not in ARG_KINDS or instr.opname in ("CACHE", "EXTENDED_ARG"):
        raise BytecodeError(f"#{i}: unknown opname {instr.opname!r}")
    accepts, wanted = _ARG_SHAPES[ARG_KINDS[instr.opname]]
    if not accepts(instr.argval):
        raise BytecodeError(f"{_where(i, instr)}: argval must be {wanted}, not {instr.argval!r}")
    low, high = ARG_BOUNDS.get(instr.opname, (0, 2**32 - 1))
    if ARG_KINDS[instr.opname] == "int" and not low <= _as_int(instr.argval) <= high:
        raise BytecodeError(f"{_where(i, instr)}: argument out of range [{low}, {high}]")


def _check_pairs(i: int, instr: Instr, instrs: Sequence[Instr]) -> None:
    """Instructions that only make sense next to a particular neighbour."""
    after = instrs[i + 1] if i + 1 < len(instrs) else None
    before = instrs[i - 1] if i else None
    if instr.opname == "KW_NAMES":
        names = instr.argval
        if not (isinstance(names, tuple) and all(isinstance(n, str) for n in names)):
            raise BytecodeError(f"{_where(i, instr)}: argval must be a tuple of str")
        if after is None or after.opname != "PRECALL" or not len(names) <= _as_int(after.argval):
            raise BytecodeError(
                f"{_where(i, instr)}: must come right before a PRECALL with"
                f" at least {len(names)} argument(s)"
            )
    alone = (instr.opname == "PRECALL" and (after is None or after.opname != "CALL")) or (
        instr.opname == "CALL" and (before is None or before.opname != "PRECALL")
    )
    if alone or (instr.opname == "CALL" and before and before.argval != instr.argval):
        raise BytecodeError(f"{_where(i, instr)}: PRECALL n and CALL n must be adjacent")
    if instr.opname == "YIELD_VALUE" and (after is None or after.opname != "RESUME"):
        raise BytecodeError(f"{_where(i, instr)}: must be followed by RESUME (gen.throw() looks)")
    if instr.opname == "MAKE_FUNCTION":
        code = before.argval if before is not None and before.opname == "LOAD_CONST" else None
        if not isinstance(code, types.CodeType):
            raise BytecodeError(f"{_where(i, instr)}: must come right after LOAD_CONST <code>")
        cells = instrs[i - 2] if i >= 2 and _as_int(instr.argval) & 8 else None
        found = _as_int(cells.argval) if cells and cells.opname == "BUILD_TUPLE" else 0
        if len(code.co_freevars) != found or (_as_int(instr.argval) & 8 and cells is None):
            raise BytecodeError(
                f"{_where(i, instr)}: {code.co_qualname} has"
                f" {len(code.co_freevars)} free variable(s); the closure must be"
                " BUILD_TUPLE of as many cells right before LOAD_CONST <code>"
            )


def _as_int(value: object) -> int:
    return value if isinstance(value, int) else 0


def _check_prologue(instrs: Sequence[Instr]) -> None:
    body = 0
    while body < len(instrs) and (
        instrs[body].opname in PROLOGUE_OPS
        or (
            instrs[body].opname == "POP_TOP"
            and body
            and instrs[body - 1].opname == "RETURN_GENERATOR"
        )
    ):
        body += 1
    for i in range(body, len(instrs)):
        if instrs[i].opname in PROLOGUE_OPS:
            raise BytecodeError(
                f"{_where(i, instrs[i])}: allowed only in the prologue"
                " (before any other instruction)"
            )
    if not any(instr.opname == "RESUME" for instr in instrs):
        raise BytecodeError("no RESUME instruction: tracing and tracebacks would skip the frame")


def _check_positions(i: int, instr: Instr) -> None:
    if instr.positions is None:
        return
    line, end_line, col, end_col = instr.positions
    bad = (line is None and (end_line, col, end_col) != (None, None, None)) or any(
        v is not None and v < 0 for v in (col, end_col)
    )
    if bad or (line is not None and end_line is not None and end_line < line):
        raise BytecodeError(f"{_where(i, instr)}: bad positions {tuple(instr.positions)}")


def check(instrs: Sequence[Instr], entries: Sequence[ExceptionEntry] = ()) -> StackFlow:
    """Check what the ``CodeType`` constructor does not, and return the stack flow.

    Invariants, each raised as a :class:`BytecodeError` naming the instruction:

    - every opname is a 3.11 opname or a direction-free jump (never ``CACHE``,
      ``EXTENDED_ARG`` or a specialised opname), and its ``argval`` has the
      shape :data:`ARG_KINDS` asks for, with plain numbers in range;
    - every label is attached to one instruction; every jump target and
      exception-entry label is attached to an instruction of the list;
    - instructions that CPython reads as pairs are adjacent: ``KW_NAMES``
      then ``PRECALL n`` then ``CALL n`` (a specialised ``PRECALL`` skips the
      next unit), ``YIELD_VALUE`` then ``RESUME``, ``LOAD_CONST <code>`` then
      ``MAKE_FUNCTION``, with a ``BUILD_TUPLE`` closure of the right size;
    - prologue instructions come first, and there is a ``RESUME``;
    - positions are ``None`` or well-formed (no end line before the line);
    - the stack never underflows, depths agree where paths join, exception
      entries never keep more values than the stack holds, and control never
      runs past the last instruction (:func:`stack_flow`).

    >>> check([Instr("RESUME", 0), Instr("LOAD_FAST", "x"), Instr("RETURN_VALUE")]).max_depth
    1
    >>> check([Instr("RESUME", 0), Instr("JUMP", Label("x"))])
    Traceback (most recent call last):
    ...
    ember.capture.bytecode_311.BytecodeError: #1 JUMP to x: jump target x is not in the list
    """
    if not instrs:
        raise BytecodeError("no instructions")
    index = label_index(instrs)
    for i, instr in enumerate(instrs):
        _check_arg(i, instr)
        if instr.opname in JUMPS and instr.target not in index:
            raise BytecodeError(
                f"{_where(i, instr)}: jump target {instr.target} is not in the list"
            )
        _check_pairs(i, instr, instrs)
        _check_positions(i, instr)
    _check_prologue(instrs)
    return stack_flow(instrs, entries)


# -- code specs ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CodeSpec:
    """Everything a code object holds besides its instructions and exception table.

    ``consts`` and ``names`` seed ``co_consts`` and ``co_names``: values the
    instructions use are looked up there first and appended when missing, so
    a round trip keeps every index. Keep ``consts[0]`` a docstring or None:
    CPython makes a ``str`` there the function's ``__doc__``. Edit a spec with
    ``dataclasses.replace`` or :meth:`of`.

    >>> spec = CodeSpec.of((lambda a, *rest: a).__code__, name="resume")
    >>> spec.name, spec.qualname, spec.argcount, spec.varnames, spec.flags & inspect.CO_VARARGS
    ('resume', '<lambda>', 1, ('a', 'rest'), 4)
    """

    name: str = "<ember>"
    qualname: str = ""  # "" means the same as name
    filename: str = "<ember>"
    firstlineno: int = 1
    argcount: int = 0  # positional arguments, posonly included
    posonlyargcount: int = 0
    kwonlyargcount: int = 0
    varnames: tuple[str, ...] = ()  # arguments first: positional, kw-only, *args, **kwargs
    cellvars: tuple[str, ...] = ()
    freevars: tuple[str, ...] = ()  # in the order of the closure tuple
    flags: int = inspect.CO_OPTIMIZED | inspect.CO_NEWLOCALS
    consts: tuple[object, ...] = (None,)
    names: tuple[str, ...] = ()

    @classmethod
    def of(cls, code: types.CodeType, **changes: Any) -> CodeSpec:
        """The spec of an existing code object, with ``changes`` applied.

        >>> CodeSpec.of((lambda: 0).__code__, firstlineno=7).firstlineno
        7
        """
        spec = cls(
            code.co_name,
            code.co_qualname,
            code.co_filename,
            code.co_firstlineno,
            code.co_argcount,
            code.co_posonlyargcount,
            code.co_kwonlyargcount,
            code.co_varnames,
            code.co_cellvars,
            code.co_freevars,
            code.co_flags,
            code.co_consts,
            code.co_names,
        )
        return dataclasses.replace(spec, **changes)


def _check_spec(spec: CodeSpec, instrs: Sequence[Instr]) -> None:
    """Rules tying the instructions to the spec that the CodeType constructor skips."""
    flags = spec.flags
    nargs = spec.argcount + spec.kwonlyargcount
    nargs += bool(flags & inspect.CO_VARARGS) + bool(flags & inspect.CO_VARKEYWORDS)
    problems = [
        (nargs > len(spec.varnames), f"{nargs} argument(s) but {len(spec.varnames)} varnames"),
        (spec.posonlyargcount > spec.argcount, "posonlyargcount exceeds argcount"),
        (
            len({*spec.varnames, *spec.freevars}) != len(spec.varnames) + len(spec.freevars)
            or len(set(spec.cellvars)) != len(spec.cellvars),
            "repeated names in varnames, cellvars or freevars",
        ),
        (
            bool(set(spec.cellvars) & set(spec.freevars)),
            f"{sorted(set(spec.cellvars) & set(spec.freevars))} both cell and free variables:"
            " unsupported, since instructions name their slots",
        ),
    ]
    ops = [instr.opname for instr in instrs]
    generator = bool(flags & _GENERATOR_FLAGS)
    made = sorted(str(i.argval) for i in instrs if i.opname == "MAKE_CELL")
    copied = [i.argval for i in instrs if i.opname == "COPY_FREE_VARS"]
    problems += [
        (
            generator != ("RETURN_GENERATOR" in ops),
            "RETURN_GENERATOR without generator flags"
            " (or generator flags without RETURN_GENERATOR)",
        ),
        ("YIELD_VALUE" in ops and not generator, "YIELD_VALUE outside a generator"),
        (  # it reads the frame's locals dict unchecked; optimized frames have none
            "LOAD_CLASSDEREF" in ops and bool(flags & inspect.CO_OPTIMIZED),
            "LOAD_CLASSDEREF in CO_OPTIMIZED code (segfaults: no locals dict)",
        ),
        (made != sorted(spec.cellvars), f"MAKE_CELL for {made}, cellvars are {spec.cellvars}"),
        (
            copied != ([len(spec.freevars)] if spec.freevars else []),
            f"COPY_FREE_VARS {copied} for {len(spec.freevars)} free variable(s)",
        ),
    ]
    for failed, message in problems:
        if failed:
            raise BytecodeError(f"{spec.qualname or spec.name}: {message}")


_GENERATOR_FLAGS: Final = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


# -- argument pools ------------------------------------------------------------------------------

_BY_VALUE: Final = (type(None), type(...), bool, int, str, bytes)


def _const_key(value: object) -> object:
    """Equal keys for constants CPython would merge: 1, 1.0, True and -0.0 stay apart."""
    kind = type(value)
    if isinstance(value, tuple | frozenset) and kind in (tuple, frozenset):
        return kind, kind(_const_key(item) for item in value)
    if isinstance(value, float) and kind is float:
        return kind, struct.pack("<d", value)
    if isinstance(value, complex) and kind is complex:
        return kind, struct.pack("<dd", value.real, value.imag)
    return (kind, value) if kind in _BY_VALUE else (object, id(value))


class _Pools:
    """``co_consts``, ``co_names`` and the frame slots, filled while opargs are computed."""

    def __init__(self, spec: CodeSpec, instrs: Sequence[Instr]) -> None:
        self.consts = list(spec.consts)
        self.names = list(spec.names)
        self._const_at: dict[object, int] = {}
        for i, value in enumerate(self.consts):
            self._const_at.setdefault(_const_key(value), i)
        self._name_at = {name: i for i, name in reversed(list(enumerate(self.names)))}
        self.cells = frozenset(spec.cellvars) | frozenset(spec.freevars)
        used = (i.argval for i in instrs if ARG_KINDS.get(i.opname) == "local")
        extra = {name: None for name in used if isinstance(name, str)}
        self.varnames = (
            *spec.varnames,
            *(n for n in extra if n not in spec.varnames + spec.cellvars),
        )
        slots = localsplus_names(self.varnames, spec.cellvars, spec.freevars)
        self._slot_at = {name: i for i, name in reversed(list(enumerate(slots)))}
        self.cellvars = frozenset(spec.cellvars)

    def const(self, value: object) -> int:
        key = _const_key(value)
        if key not in self._const_at:
            self._const_at[key] = len(self.consts)
            self.consts.append(value)
        return self._const_at[key]

    def name(self, value: object) -> int:
        name = str(value)
        if name not in self._name_at:
            self._name_at[name] = len(self.names)
            self.names.append(name)
        return self._name_at[name]

    def local(self, value: object) -> int:
        if value in self.cells:
            raise BytecodeError(f"{value!r} is a cell or free variable: use the DEREF opcodes")
        return self._slot_at[str(value)]

    def cell(self, value: object) -> int:
        if value not in self.cells:
            raise BytecodeError(f"{value!r} is not in cellvars or freevars")
        return self._slot_at[str(value)]


def _global_arg(pools: _Pools, value: object) -> int:
    assert isinstance(value, tuple)  # check() ensured (push_null, name)
    return pools.name(value[1]) << 1 | bool(value[0])


# ARG_KINDS kind -> oparg from the pools and the argval; jumps get theirs in _layout.
_ENCODE: Final[dict[str, Callable[[_Pools, object], int]]] = {
    "none": lambda pools, value: 0,
    "int": lambda pools, value: value if isinstance(value, int) else 0,
    "const": _Pools.const,
    "name": _Pools.name,
    "global": _global_arg,
    "local": _Pools.local,
    "cell": _Pools.cell,
    "jump": lambda pools, value: 0,
}


def _opargs(instrs: Sequence[Instr], pools: _Pools) -> list[int]:
    opargs = []
    for i, instr in enumerate(instrs):
        try:
            opargs.append(_ENCODE[ARG_KINDS[instr.opname]](pools, instr.argval))
        except BytecodeError as error:
            raise BytecodeError(f"{_where(i, instr)}: {error}") from None
        if instr.opname == "MAKE_CELL" and instr.argval not in pools.cellvars:
            raise BytecodeError(f"{_where(i, instr)}: {instr.argval!r} is not in cellvars")
    return opargs


# -- layout and encoding -------------------------------------------------------------------------


def _size(opname: str, oparg: int) -> int:
    """Code units: EXTENDED_ARG prefixes, the opcode, its CACHE units."""
    return 1 + (oparg > 0xFF) + (oparg > 0xFFFF) + (oparg > 0xFFFFFF) + CACHE_ENTRIES[opname]


def _layout(
    instrs: Sequence[Instr], opargs: list[int], index: Mapping[Label, int]
) -> tuple[list[str], list[int], list[int]]:
    """Real opnames, sizes and unit offsets; jump opargs are written into ``opargs``.

    Jumps start one unit long and only grow, so the loop ends (CPython's assembler
    does the same relaxation).
    """
    opnames, jumps = [], []
    for k, instr in enumerate(instrs):
        if instr.opname not in JUMPS:
            opnames.append(instr.opname)
            continue
        target = index[instr.target] if instr.target is not None else k
        forward, backward = JUMP_FAMILIES[FAMILY_OF[instr.opname]]
        real = forward if target > k else backward
        if real is None:
            raise BytecodeError(f"{_where(k, instr)}: 3.11 has no backward {instr.opname}")
        opnames.append(real)
        jumps.append((k, target))
    sizes = [_size(name, arg) for name, arg in zip(opnames, opargs, strict=True)]
    while True:
        offsets = list(itertools.accumulate(sizes, initial=0))
        grown = False
        for k, target in jumps:
            after = offsets[k] + sizes[k]
            opargs[k] = offsets[target] - after if target > k else after - offsets[target]
            size = max(sizes[k], _size(opnames[k], opargs[k]))
            grown, sizes[k] = grown or size != sizes[k], size
        if not grown:
            return opnames, sizes, offsets


def _emit(opnames: Sequence[str], opargs: Sequence[int], sizes: Sequence[int]) -> bytes:
    out = bytearray()
    for name, arg, size in zip(opnames, opargs, sizes, strict=True):
        caches = CACHE_ENTRIES[name]
        for shift in range(8 * (size - 1 - caches), 0, -8):  # most significant byte first
            out += bytes((opcode.EXTENDED_ARG, (arg >> shift) & 0xFF))
        out += bytes((opcode.opmap[name], arg & 0xFF)) + bytes(2 * caches)
    return bytes(out)


def _normal(positions: Positions | None) -> Positions:
    """The positions the location table can hold (what ``co_positions()`` will give back)."""
    if positions is None or positions.lineno is None:
        return Positions(None, None, None, None)
    line, end, col, end_col = positions
    end = line if end is None else end
    if col is None or end_col is None:
        return Positions(line, end, None, None)
    return Positions(line, end, col, end_col)


def _varint(value: int) -> bytes:
    """Location-table varint: 6-bit chunks, least significant first, bit 6 = more."""
    out = bytearray()
    while value >= 64:
        out.append(64 | (value & 63))
        value >>= 6
    return bytes((*out, value))


def _svarint(value: int) -> bytes:
    return _varint((-value) << 1 | 1 if value < 0 else value << 1)


def _location(pos: Positions, length: int, line: int) -> tuple[bytes, int]:
    """One location entry of ``length`` (1..8) units, and the line it leaves current.

    The form is chosen as CPython's compiler chooses it (code 15 none, 13 no
    columns, 0-9 short, 10-12 one line, 14 long), so round trips are exact.
    """
    lineno, end, col, end_col = pos
    if lineno is None:
        return bytes((0x80 | 15 << 3 | (length - 1),)), line
    assert end is not None  # _normal() filled it
    head, delta = 0x80 | (length - 1), lineno - line
    if col is None or end_col is None:
        if end == lineno:
            return bytes((head | 13 << 3,)) + _svarint(delta), lineno
    elif end == lineno:
        if delta == 0 and col < 80 and 0 <= end_col - col < 16:
            return bytes((head | (col >> 3) << 3, (col & 7) << 4 | (end_col - col))), line
        if 0 <= delta < 3 and col < 128 and end_col < 128:
            return bytes((head | (10 + delta) << 3, col, end_col)), lineno
    cols = _varint(col + 1 if col is not None else 0) + _varint(
        end_col + 1 if end_col is not None else 0
    )
    return bytes((head | 14 << 3,)) + _svarint(delta) + _varint(end - lineno) + cols, lineno


def _line_table(instrs: Sequence[Instr], sizes: Sequence[int], firstlineno: int) -> bytes:
    """Entries of at most 8 units per instruction, covering exactly ``sum(sizes)`` units.

    Like CPython 3.11, one instruction never shares an entry with the next.
    """
    out, line = bytearray(), firstlineno
    for instr, size in zip(instrs, sizes, strict=True):
        pos = _normal(instr.positions)
        for units in range(size, 0, -8):
            entry, line = _location(pos, min(8, units), line)
            out += entry
    return bytes(out)


def _exc_varint(value: int, first: bool = False) -> bytes:
    """Exception-table varint: 6-bit chunks, most significant first, bit 6 = more."""
    chunks = [value & 63]
    while value >= 64:
        value >>= 6
        chunks.append(64 | (value & 63))
    chunks.reverse()
    chunks[0] |= 128 if first else 0
    return bytes(chunks)


def _exception_table(
    instrs: Sequence[Instr],
    entries: Sequence[ExceptionEntry],
    offsets: Sequence[int],
    sizes: Sequence[int],
) -> bytes:
    """Sorted, disjoint ranges: runs of instructions with the same handler.

    A range starts at its first instruction's first EXTENDED_ARG and ends after
    its last instruction's CACHE units (a call inlined by the interpreter faults
    with ``prev_instr`` on the last cache unit).
    """
    index = label_index(instrs)
    keyed = [
        (i, None if e is None else (offsets[index[e.target]], e.depth, e.lasti))
        for i, e in enumerate(handlers(instrs, entries))
    ]
    out = bytearray()
    for key, run in itertools.groupby(keyed, key=lambda pair: pair[1]):
        if key is None:
            continue
        members = [i for i, _ in run]
        start, end = offsets[members[0]], offsets[members[-1]] + sizes[members[-1]]
        target, depth, lasti = key
        out += _exc_varint(start, first=True) + _exc_varint(end - start) + _exc_varint(target)
        out += _exc_varint(depth << 1 | lasti)
    return bytes(out)


# -- assemble ------------------------------------------------------------------------------------


def assemble(
    instrs: Sequence[Instr], entries: Sequence[ExceptionEntry], spec: CodeSpec
) -> types.CodeType:
    """Build a code object from instructions, exception entries and a spec.

    Raises :class:`BytecodeError` (naming the instruction) for anything
    :func:`check` or the spec rules reject. Under ``EMBER_CHECK=1`` the new code
    object is decoded again and must give back the same instructions.

    >>> from ember.capture.bytecode_311 import Instr, Label
    >>> neg, done = Label("neg"), Label("done")
    >>> body = [
    ...     Instr("RESUME", 0), Instr("LOAD_FAST", "x"), Instr("LOAD_CONST", 0),
    ...     Instr("COMPARE_OP", 0), Instr("POP_JUMP_IF_TRUE", neg),
    ...     Instr("LOAD_FAST", "x"), Instr("RETURN_VALUE"),
    ...     Instr("LOAD_FAST", "x", label=neg), Instr("UNARY_NEGATIVE"), Instr("RETURN_VALUE"),
    ... ]
    >>> code = assemble(body, [], CodeSpec(name="absval", argcount=1, varnames=("x",)))
    >>> f = types.FunctionType(code, {})
    >>> f(-3), f(4), code.co_consts, code.co_stacksize
    (3, 4, (None, 0), 2)
    """
    flow = check(instrs, entries)
    _check_spec(spec, instrs)
    pools = _Pools(spec, instrs)
    opargs = _opargs(instrs, pools)
    opnames, sizes, offsets = _layout(instrs, opargs, label_index(instrs))
    code = types.CodeType(
        spec.argcount,
        spec.posonlyargcount,
        spec.kwonlyargcount,
        len(pools.varnames),
        flow.max_depth,
        spec.flags,
        _emit(opnames, opargs, sizes),
        tuple(pools.consts),
        tuple(pools.names),
        pools.varnames,
        spec.filename,
        spec.name,
        spec.qualname or spec.name,
        spec.firstlineno,
        _line_table(instrs, sizes, spec.firstlineno),
        _exception_table(instrs, entries, offsets, sizes),
        spec.freevars,
        spec.cellvars,
    )
    if settings.section.get().check:
        _verify(code, instrs, entries)
    return code


def _shape(instrs: Sequence[Instr], entries: Sequence[ExceptionEntry]) -> list[tuple[object, ...]]:
    """What a round trip must preserve, label identity replaced by index."""
    index = label_index(instrs)
    shape: list[tuple[object, ...]] = []
    for i, (instr, entry) in enumerate(zip(instrs, handlers(instrs, entries), strict=True)):
        value = index.get(instr.argval) if isinstance(instr.argval, Label) else instr.argval
        handler = entry and (index[entry.target], entry.depth, entry.lasti)
        name = FAMILY_OF.get(instr.opname, instr.opname)
        if name == "JUMP_NO_INTERRUPT" and isinstance(value, int) and value > i:
            name = "JUMP"  # emitted as JUMP_FORWARD, which decodes as JUMP
        shape.append(
            (
                name,
                _const_key(value),
                _normal(instr.positions),
                handler,
            )
        )
    return shape


def _verify(
    code: types.CodeType, instrs: Sequence[Instr], entries: Sequence[ExceptionEntry]
) -> None:
    """EMBER_CHECK: the assembled code decodes back to what was assembled."""
    units = len(code.co_code) // 2
    if sum(1 for _ in code.co_positions()) != units:
        raise BytecodeError(f"{code.co_qualname}: location table does not cover {units} units")
    again, again_entries = decode(code)
    expected, found = _shape(instrs, entries), _shape(again, again_entries)
    for i, (want, got) in enumerate(zip(expected, found, strict=False)):
        if want != got:
            raise BytecodeError(f"{code.co_qualname}: #{i} assembled as {got}, expected {want}")
    if len(expected) != len(found):
        raise BytecodeError(
            f"{code.co_qualname}: {len(found)} instructions, expected {len(expected)}"
        )
