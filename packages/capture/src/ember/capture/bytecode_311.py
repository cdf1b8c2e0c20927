"""CPython 3.11 bytecode as an editable list of instructions: ember's version seam.

Every fact about 3.11 bytecode that ember relies on lives in this module (and
in its assembler, :mod:`ember.capture.assemble`): inline cache counts, jump
families, stack effects, the localsplus indexing of cells, the exception-table
format. Supporting 3.12 means writing a sibling ``bytecode_312.py``.

:func:`decode` turns a code object into a list of :class:`Instr` plus a list of
:class:`ExceptionEntry`. ``CACHE`` units and ``EXTENDED_ARG`` prefixes are
dropped, arguments are resolved (constants, names, locals, cells), and jumps
point at :class:`Label` objects attached to their target instruction:

>>> def absval(x):
...     if x < 0:
...         return -x
...     return x
>>> instrs, entries = decode(absval.__code__)
>>> print(format_instrs(instrs))
   1        RESUME               0
   2        LOAD_FAST            x
            LOAD_CONST           0
            COMPARE_OP           0 (<)
            POP_JUMP_IF_FALSE    to L20
   3        LOAD_FAST            x
            UNARY_NEGATIVE
            RETURN_VALUE
   4   L20: LOAD_FAST            x
            RETURN_VALUE

Jumps are direction-free in this form: ``POP_JUMP_FORWARD_IF_FALSE`` and
``POP_JUMP_BACKWARD_IF_FALSE`` both decode to ``POP_JUMP_IF_FALSE`` (and
``JUMP_FORWARD``/``JUMP_BACKWARD`` to ``JUMP``), the names 3.12 uses; the
assembler picks the direction from the final layout (see :data:`JUMP_FAMILIES`).
Edit the list freely (``dataclasses.replace`` an instruction, insert new ones,
move a label) and assemble it back with :func:`ember.capture.assemble.assemble`.
"""

from __future__ import annotations

import dis
import functools
import itertools
import opcode
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import CodeType, MappingProxyType
from typing import Any, Final

__all__ = [
    "ARG_BOUNDS",
    "ARG_KINDS",
    "BACKWARD_JUMPS",
    "BINARY_OPS",
    "CACHE_ENTRIES",
    "COMPARE_OPS",
    "CONDITIONAL_JUMPS",
    "FAMILY_OF",
    "FORWARD_JUMPS",
    "JUMPS",
    "JUMP_FAMILIES",
    "PARTNER",
    "PROLOGUE_OPS",
    "RESUME_DELEGATING",
    "TERMINAL",
    "UNCONDITIONAL_JUMPS",
    "BytecodeError",
    "ExceptionEntry",
    "Instr",
    "Label",
    "Operator",
    "Positions",
    "Unwind",
    "decode",
    "format_instrs",
    "handlers",
    "label_index",
    "localsplus_names",
    "parse_exception_table",
    "stack_effect",
    "stack_needs",
    "unwind_table",
]

Positions = dis.Positions
"""Source span of an instruction: ``(lineno, end_lineno, col_offset, end_col_offset)``.

>>> Positions(3, 3, 4, 9).lineno
3
"""

# -- tables --------------------------------------------------------------------------------------
# 3.11 keeps two facts only in private attributes of ``opcode``; this module is where they are read.
_PRIVATE: Final[dict[str, Any]] = vars(opcode)
_CACHES: Final[list[int]] = _PRIVATE["_inline_cache_entries"]
_NB_OPS: Final[list[tuple[str, str]]] = _PRIVATE["_nb_ops"]


def _family_name(opname: str) -> str:
    return opname.replace("_FORWARD", "").replace("_BACKWARD", "")


def _derive_families() -> dict[str, tuple[str | None, str | None]]:
    """Group the relative jumps by the name left once FORWARD/BACKWARD is dropped."""
    families: dict[str, tuple[str | None, str | None]] = {}
    for code in opcode.hasjrel:
        name = opcode.opname[code]
        forward, backward = families.get(_family_name(name), (None, None))
        pair = (forward, name) if "BACKWARD" in name else (name, backward)
        families[_family_name(name)] = pair
    # Forward jumps never check the eval breaker, so JUMP_FORWARD is the forward
    # form of JUMP_BACKWARD_NO_INTERRUPT too (used by ``yield from`` and ``await`` loops).
    families["JUMP_NO_INTERRUPT"] = ("JUMP_FORWARD", families["JUMP_NO_INTERRUPT"][1])
    return families


JUMP_FAMILIES: Final[Mapping[str, tuple[str | None, str | None]]] = MappingProxyType(
    _derive_families()
)
"""Direction-free jump name -> (forward opname, backward opname); None where 3.11 has none.

The editable form uses the direction-free names; the assembler emits the forward
opname when the target comes later in the list and the backward one otherwise.

>>> JUMP_FAMILIES["POP_JUMP_IF_NONE"]
('POP_JUMP_FORWARD_IF_NONE', 'POP_JUMP_BACKWARD_IF_NONE')
>>> JUMP_FAMILIES["FOR_ITER"]
('FOR_ITER', None)
"""

FAMILY_OF: Final[Mapping[str, str]] = MappingProxyType(
    {family: family for family in JUMP_FAMILIES}
    | {opcode.opname[code]: _family_name(opcode.opname[code]) for code in opcode.hasjrel}
)
"""Every name that takes a jump target -> its direction-free name.

>>> FAMILY_OF["JUMP_BACKWARD"], FAMILY_OF["JUMP"]
('JUMP', 'JUMP')
"""

FORWARD_JUMPS: Final = frozenset(op for op, _ in JUMP_FAMILIES.values() if op)
"""Real 3.11 opnames that jump forward.

>>> sorted(FORWARD_JUMPS)[:3]
['FOR_ITER', 'JUMP_FORWARD', 'JUMP_IF_FALSE_OR_POP']
"""

BACKWARD_JUMPS: Final = frozenset(op for _, op in JUMP_FAMILIES.values() if op)
"""Real 3.11 opnames that jump backward.

>>> "JUMP_BACKWARD_NO_INTERRUPT" in BACKWARD_JUMPS
True
"""

PARTNER: Final[Mapping[str, str]] = MappingProxyType(
    {b: f for f, b in JUMP_FAMILIES.values() if f and b}
    | {
        f: b
        for family, (f, b) in JUMP_FAMILIES.items()
        if f and b and family != "JUMP_NO_INTERRUPT"
    }
)
"""Each relative jump that has one -> the same jump in the other direction.

>>> PARTNER["POP_JUMP_FORWARD_IF_TRUE"], PARTNER["JUMP_FORWARD"]
('POP_JUMP_BACKWARD_IF_TRUE', 'JUMP_BACKWARD')
"""

JUMPS: Final = frozenset(FAMILY_OF)
"""Every name (direction-free or real) whose argument is a jump target.

>>> "FOR_ITER" in JUMPS and "POP_JUMP_IF_TRUE" in JUMPS
True
"""

UNCONDITIONAL_JUMPS: Final = frozenset(
    name for name, family in FAMILY_OF.items() if family in ("JUMP", "JUMP_NO_INTERRUPT")
)
"""Jumps that always jump (no fall-through).

>>> sorted(UNCONDITIONAL_JUMPS)[:2]
['JUMP', 'JUMP_BACKWARD']
"""

CONDITIONAL_JUMPS: Final = JUMPS - UNCONDITIONAL_JUMPS
"""Jumps that may fall through (``FOR_ITER`` and ``SEND`` included).

>>> "JUMP_IF_TRUE_OR_POP" in CONDITIONAL_JUMPS
True
"""

TERMINAL: Final = frozenset({"RETURN_VALUE", "RAISE_VARARGS", "RERAISE"}) | UNCONDITIONAL_JUMPS
"""Instructions after which control never falls through to the next one.

>>> "RERAISE" in TERMINAL, "YIELD_VALUE" in TERMINAL
(True, False)
"""

PROLOGUE_OPS: Final = frozenset({"MAKE_CELL", "COPY_FREE_VARS", "RETURN_GENERATOR"})
"""Instructions allowed only in the frame prologue, before any other instruction but
the ``POP_TOP`` after ``RETURN_GENERATOR``.

>>> sorted(PROLOGUE_OPS)
['COPY_FREE_VARS', 'MAKE_CELL', 'RETURN_GENERATOR']
"""

CACHE_ENTRIES: Final[Mapping[str, int]] = MappingProxyType(
    {name: _CACHES[code] for name, code in opcode.opmap.items()}
    | {family: 0 for family in JUMP_FAMILIES}
)
"""Opname -> number of inline ``CACHE`` units that follow it in ``co_code``.

>>> CACHE_ENTRIES["LOAD_GLOBAL"], CACHE_ENTRIES["CALL"], CACHE_ENTRIES["POP_TOP"]
(5, 4, 0)
"""


def _derive_arg_kinds() -> dict[str, str]:
    kinds = {
        name: "none" if code < opcode.HAVE_ARGUMENT else "int"
        for name, code in opcode.opmap.items()
    }
    by_table = (
        (opcode.hasconst, "const"),
        (opcode.hasname, "name"),
        (opcode.haslocal, "local"),
        (opcode.hasfree, "cell"),
        (opcode.hasjrel, "jump"),
    )
    for codes, kind in by_table:
        kinds.update((opcode.opname[code], kind) for code in codes)
    kinds["LOAD_GLOBAL"] = "global"  # argval (push_null, name): the low oparg bit pushes a NULL
    return kinds | {family: "jump" for family in JUMP_FAMILIES}


ARG_KINDS: Final[Mapping[str, str]] = MappingProxyType(_derive_arg_kinds())
"""Opname -> what :attr:`Instr.argval` holds, and so how the oparg is computed.

``none`` (no argument), ``int`` (the oparg itself), ``const`` (a constant; a
tuple of str for ``KW_NAMES``), ``name`` (a ``co_names`` entry), ``global``
(``(push_null, name)``), ``local`` (a ``co_varnames`` name), ``cell`` (a cell or
free variable name) and ``jump`` (a :class:`Label`).

>>> ARG_KINDS["LOAD_DEREF"], ARG_KINDS["KW_NAMES"], ARG_KINDS["BUILD_TUPLE"]
('cell', 'const', 'int')
"""


@dataclass(frozen=True, slots=True)
class Operator:
    """One entry of :data:`BINARY_OPS` or :data:`COMPARE_OPS`.

    >>> BINARY_OPS[13]
    Operator(name='NB_INPLACE_ADD', symbol='+=', fn=<built-in function iadd>)
    """

    name: str
    symbol: str
    fn: Callable[[Any, Any], Any]


_NB_FUNCTIONS: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "ADD": operator.add,
    "AND": operator.and_,
    "FLOOR_DIVIDE": operator.floordiv,
    "LSHIFT": operator.lshift,
    "MATRIX_MULTIPLY": operator.matmul,
    "MULTIPLY": operator.mul,
    "REMAINDER": operator.mod,
    "OR": operator.or_,
    "POWER": operator.pow,
    "RSHIFT": operator.rshift,
    "SUBTRACT": operator.sub,
    "TRUE_DIVIDE": operator.truediv,
    "XOR": operator.xor,
}


def _nb_function(name: str) -> Callable[[Any, Any], Any]:
    """``NB_ADD`` -> operator.add, ``NB_INPLACE_ADD`` -> operator.iadd."""
    base = name.removeprefix("NB_")
    if base.startswith("INPLACE_"):
        plain = _NB_FUNCTIONS[base.removeprefix("INPLACE_")]
        fn: Callable[[Any, Any], Any] = getattr(operator, "i" + plain.__name__.rstrip("_"))
        return fn
    return _NB_FUNCTIONS[base]


BINARY_OPS: Final[tuple[Operator, ...]] = tuple(
    Operator(name, symbol, _nb_function(name)) for name, symbol in _NB_OPS
)
"""``BINARY_OP`` oparg -> operator, mirroring ``opcode._nb_ops`` (26 entries).

>>> BINARY_OPS[0].symbol, BINARY_OPS[0].fn(2, 3), BINARY_OPS[10].symbol
('+', 5, '-')
"""

COMPARE_OPS: Final[tuple[Operator, ...]] = tuple(
    Operator(fn.__name__, symbol, fn)
    for symbol, fn in zip(
        dis.cmp_op,
        (operator.lt, operator.le, operator.eq, operator.ne, operator.gt, operator.ge),
        strict=True,
    )
)
"""``COMPARE_OP`` oparg -> operator, in ``dis.cmp_op`` order.

>>> [op.symbol for op in COMPARE_OPS]
['<', '<=', '==', '!=', '>', '>=']
"""

# Minimum stack depth each instruction needs: the values it pops or peeks at (ceval.c, 3.11).
# dis.stack_effect gives only the net change, which cannot tell a BINARY_OP on one value.
_Needs = int | Callable[[int], int]
_NEEDS: Final[dict[str, _Needs]] = {
    **dict.fromkeys(
        """LOAD_ASSERTION_ERROR LOAD_BUILD_CLASS NOP PUSH_NULL RETURN_GENERATOR SETUP_ANNOTATIONS
        COPY_FREE_VARS DELETE_DEREF DELETE_FAST DELETE_GLOBAL DELETE_NAME KW_NAMES LOAD_CLASSDEREF
        LOAD_CLOSURE LOAD_CONST LOAD_DEREF LOAD_FAST LOAD_GLOBAL LOAD_NAME MAKE_CELL RESUME JUMP
        JUMP_NO_INTERRUPT JUMP_FORWARD JUMP_BACKWARD JUMP_BACKWARD_NO_INTERRUPT""".split(),
        0,
    ),
    **dict.fromkeys(
        """ASYNC_GEN_WRAP BEFORE_ASYNC_WITH BEFORE_WITH GET_AITER GET_ANEXT GET_ITER GET_LEN
        GET_YIELD_FROM_ITER IMPORT_STAR LIST_TO_TUPLE MATCH_MAPPING MATCH_SEQUENCE POP_EXCEPT
        POP_TOP PRINT_EXPR PUSH_EXC_INFO RETURN_VALUE UNARY_INVERT UNARY_NEGATIVE UNARY_NOT
        UNARY_POSITIVE YIELD_VALUE DELETE_ATTR FOR_ITER GET_AWAITABLE IMPORT_FROM LOAD_ATTR
        LOAD_METHOD STORE_DEREF STORE_FAST STORE_GLOBAL STORE_NAME UNPACK_EX
        UNPACK_SEQUENCE""".split(),
        1,
    ),
    **dict.fromkeys(
        """BINARY_SUBSCR CHECK_EG_MATCH CHECK_EXC_MATCH DELETE_SUBSCR END_ASYNC_FOR MATCH_KEYS
        PREP_RERAISE_STAR BINARY_OP COMPARE_OP CONTAINS_OP IMPORT_NAME IS_OP SEND
        STORE_ATTR""".split(),
        2,
    ),
    **{name: 1 for name in FAMILY_OF if "IF" in name},  # conditional jumps pop or test TOS
    "STORE_SUBSCR": 3,
    "MATCH_CLASS": 3,
    "WITH_EXCEPT_START": 4,  # reads __exit__ at PEEK(4)
    "BUILD_CONST_KEY_MAP": lambda n: n + 1,
    "BUILD_LIST": lambda n: n,
    "BUILD_MAP": lambda n: 2 * n,
    "BUILD_SET": lambda n: n,
    "BUILD_SLICE": lambda n: n,
    "BUILD_STRING": lambda n: n,
    "BUILD_TUPLE": lambda n: n,
    "PRECALL": lambda n: n + 2,  # dis counts PRECALL n as -n, then the CALL right after as -1:
    "CALL": 2,  # [NULL or method, callable] are what is left for CALL in that accounting
    "CALL_FUNCTION_EX": lambda n: 3 + (n & 1),  # NULL, callable, args tuple, kwargs dict
    "COPY": lambda n: n,
    "SWAP": lambda n: n,
    "DICT_MERGE": lambda n: n + 3,  # its error path names the callable at PEEK(n + 2)
    "DICT_UPDATE": lambda n: n + 1,
    "LIST_APPEND": lambda n: n + 1,
    "LIST_EXTEND": lambda n: n + 1,
    "SET_ADD": lambda n: n + 1,
    "SET_UPDATE": lambda n: n + 1,
    "MAP_ADD": lambda n: n + 2,
    "FORMAT_VALUE": lambda n: 1 + ((n & 4) >> 2),
    "MAKE_FUNCTION": lambda n: 1 + (n & 15).bit_count(),
    "RAISE_VARARGS": lambda n: n,
    "RERAISE": lambda n: n + 1,  # reads lasti at PEEK(n + 1)
}

# Inclusive bounds on plain-number arguments beyond 0 <= oparg < 2**32.
ARG_BOUNDS: Final[Mapping[str, tuple[int, int]]] = {
    "BINARY_OP": (0, len(BINARY_OPS) - 1),
    "COMPARE_OP": (0, len(COMPARE_OPS) - 1),
    "IS_OP": (0, 1),
    "CONTAINS_OP": (0, 1),
    "RESUME": (0, 3),
    "RAISE_VARARGS": (0, 2),
    "BUILD_SLICE": (2, 3),
    "COPY": (1, 2**32 - 1),
    "SWAP": (1, 2**32 - 1),
    "MAKE_FUNCTION": (0, 15),
    "FORMAT_VALUE": (0, 7),
    "CALL_FUNCTION_EX": (0, 1),
    "GET_AWAITABLE": (0, 2),
    "RERAISE": (0, 2),
}


# -- the editable form ---------------------------------------------------------------------------


class BytecodeError(ValueError):
    """Instructions that would not make a valid, safe code object.

    >>> raise BytecodeError("#3 POP_TOP: stack underflow")
    Traceback (most recent call last):
    ...
    ember.capture.bytecode_311.BytecodeError: #3 POP_TOP: stack underflow
    """


@dataclass(frozen=True, slots=True, eq=False)
class Label:
    """A jump target or exception-range boundary, attached to one instruction.

    Labels compare by identity, so two ``Label("loop")`` are different targets.
    ``name`` only helps dumps and error messages (:func:`decode` names labels
    after the byte offset of their instruction).

    >>> top = Label("top")
    >>> str(Instr("JUMP", top)), str(Instr("NOP", label=top))
    ('JUMP to top', 'top: NOP')
    """

    name: str = ""

    def __str__(self) -> str:
        return self.name or f"L@{id(self):x}"


@dataclass(frozen=True, slots=True)
class Instr:
    """One instruction, without its ``EXTENDED_ARG`` prefixes and ``CACHE`` units.

    ``argval`` is what the instruction is about (see :data:`ARG_KINDS`): the
    constant, the name, the local or cell name, ``(push_null, name)`` for
    ``LOAD_GLOBAL``, the :class:`Label` a jump goes to, or the number itself for
    plain-number arguments (``BINARY_OP 0``). The assembler computes opargs from
    ``argval`` alone; ``arg`` is the oparg seen by :func:`decode`, kept for reading.

    >>> i = Instr("LOAD_GLOBAL", (True, "len"))
    >>> str(i), i.target
    ('LOAD_GLOBAL NULL + len', None)
    """

    opname: str
    argval: object = None
    arg: int | None = None  # the decoded oparg (EXTENDED_ARG included); informational
    label: Label | None = None  # set when jumps or exception entries refer to this instruction
    positions: Positions | None = None  # None: no source location (tracebacks say "line None")
    offset: int | None = None  # byte offset of the opcode unit when decoded, past any prefix

    @property
    def target(self) -> Label | None:
        """The label a jump goes to, None for other instructions.

        >>> Instr("FOR_ITER", Label("done")).target
        Label(name='done')
        """
        return self.argval if self.opname in JUMPS and isinstance(self.argval, Label) else None

    def __str__(self) -> str:
        text = f"{self.opname} {_argrepr(self, str)}".rstrip()
        return f"{self.label}: {text}" if self.label else text


@dataclass(frozen=True, slots=True)
class ExceptionEntry:
    """Instructions ``start`` .. ``end`` (both included) are handled at ``target``.

    On an exception the stack is cut to ``depth`` values, ``lasti`` pushes the
    offset of the faulting instruction, then the exception is pushed: the
    handler starts at depth ``depth + lasti + 1``. Entries may overlap; where
    they do, the later entry in the list wins (list outer ranges first).

    >>> a, b, h = Label("a"), Label("b"), Label("h")
    >>> print(ExceptionEntry(a, b, h, depth=1, lasti=True))
    a to b -> h [depth 1, lasti]
    """

    start: Label
    end: Label
    target: Label
    depth: int
    lasti: bool = False

    def __str__(self) -> str:
        lasti = ", lasti" if self.lasti else ""
        return f"{self.start} to {self.end} -> {self.target} [depth {self.depth}{lasti}]"


def _argrepr(instr: Instr, name_of: Callable[[Label], str]) -> str:
    kind, value = ARG_KINDS.get(instr.opname), instr.argval
    if kind == "jump" and isinstance(value, Label):
        return f"to {name_of(value)}"
    if kind == "global" and isinstance(value, tuple) and len(value) == 2:
        return f"NULL + {value[1]}" if value[0] else str(value[1])
    if kind == "int" and isinstance(value, int):
        table = {"BINARY_OP": BINARY_OPS, "COMPARE_OP": COMPARE_OPS}.get(instr.opname, ())
        return f"{value} ({table[value].symbol})" if 0 <= value < len(table) else str(value)
    if kind in ("name", "local", "cell"):
        return str(value)
    if isinstance(value, CodeType):
        return f"<code {value.co_qualname}>"
    return "" if kind == "none" and value is None else repr(value)


# -- decoding ------------------------------------------------------------------------------------


def localsplus_names(
    varnames: Sequence[str], cellvars: Sequence[str], freevars: Sequence[str]
) -> tuple[str, ...]:
    """Names of the frame slots in 3.11 order: locals, cells that are not locals, free vars.

    ``LOAD_DEREF``, ``LOAD_CLOSURE``, ``MAKE_CELL`` and friends take an index
    into this tuple; a cell that is also an argument keeps the argument's slot.

    >>> localsplus_names(("a", "b", "n"), ("a", "c"), ("z",))
    ('a', 'b', 'n', 'c', 'z')
    """
    return (*varnames, *(c for c in cellvars if c not in varnames), *freevars)


def parse_exception_table(table: bytes) -> Iterator[tuple[int, int, int, int, bool]]:
    """Yield ``(start, end, target, depth, lasti)`` in code units (end exclusive).

    Each entry is four varints of 6-bit chunks, most significant first; bit 6
    means "more", bit 7 marks the first byte of an entry.

    >>> list(parse_exception_table(bytes([148, 8, 65, 36, 6])))
    [(20, 28, 100, 3, False)]
    """
    data = iter(table)

    def varint(first: int) -> int:
        value, byte = first & 63, first
        while byte & 64:
            byte = next(data)
            value = (value << 6) | (byte & 63)
        return value

    for first in data:
        start = varint(first)
        size, target, depth_lasti = (varint(next(data)) for _ in range(3))
        yield start, start + size, target, depth_lasti >> 1, bool(depth_lasti & 1)


@dataclass(frozen=True, slots=True)
class _Raw:
    """One instruction as found in ``co_code``, in code units."""

    first: int  # first unit, at its first EXTENDED_ARG if any
    unit: int  # the opcode's own unit
    end: int  # one past its last CACHE unit
    opname: str
    arg: int


def _scan(code: bytes) -> list[_Raw]:
    raws: list[_Raw] = []
    unit, first, ext = 0, 0, 0
    while unit < len(code) // 2:
        op, arg = code[2 * unit], code[2 * unit + 1]
        if op == opcode.EXTENDED_ARG:
            ext, unit = (ext | arg) << 8, unit + 1
            continue
        if opcode.opname[op] not in ARG_KINDS:
            raise BytecodeError(f"unknown opcode {op} at byte {2 * unit}")
        end = unit + 1 + _CACHES[op]
        raws.append(_Raw(first, unit, end, opcode.opname[op], ext | arg))
        unit = first = end
        ext = 0
    if ext or first != len(code) // 2:
        raise BytecodeError("co_code ends inside an instruction")
    return raws


def _jump_unit(raw: _Raw) -> int:
    delta = -raw.arg if raw.opname in BACKWARD_JUMPS else raw.arg
    return raw.unit + 1 + delta


def decode(code: CodeType) -> tuple[list[Instr], list[ExceptionEntry]]:
    """Decode ``code`` into instructions and exception entries referring to them.

    Prologue instructions (``MAKE_CELL``, ``COPY_FREE_VARS``,
    ``RETURN_GENERATOR``, ``RESUME``) stay visible. Decoded entries are
    disjoint and sorted; labels are named ``L<byte offset>``.

    >>> def safe_div(a, b):
    ...     try:
    ...         return a / b
    ...     except ZeroDivisionError:
    ...         return None
    >>> instrs, entries = decode(safe_div.__code__)
    >>> print(entries[0])
    L4 to L8 -> L14 [depth 0]
    >>> str(instrs[4]), instrs[4].positions, instrs[4].offset
    ('L8: BINARY_OP 11 (/)', Positions(lineno=3, end_lineno=3, col_offset=15, end_col_offset=20), 8)
    """
    raws = _scan(code.co_code)
    at_first = {raw.first: i for i, raw in enumerate(raws)}
    owner = {u: i for i, raw in enumerate(raws) for u in range(raw.first, raw.end)}
    labels: dict[int, Label] = {}

    def label_at(unit: int, what: str) -> Label:
        if unit not in at_first:
            raise BytecodeError(f"{code.co_qualname}: {what} points inside an instruction")
        index = at_first[unit]
        return labels.setdefault(index, Label(f"L{2 * unit}"))

    targets = [label_at(_jump_unit(r), r.opname) if r.opname in JUMPS else None for r in raws]
    entries = []
    for start, end, target, depth, lasti in parse_exception_table(code.co_exceptiontable):
        if start not in owner or end - 1 not in owner:
            raise BytecodeError(
                f"{code.co_qualname}: exception range {start}..{end} outside the code"
            )
        first, last = label_at(start, "exception range"), owner[end - 1]
        end_label = labels.setdefault(last, Label(f"L{2 * raws[last].first}"))
        entries.append(ExceptionEntry(first, end_label, label_at(target, "handler"), depth, lasti))
    positions = list(code.co_positions())
    cells = localsplus_names(code.co_varnames, code.co_cellvars, code.co_freevars)
    instrs = []
    for i, raw in enumerate(raws):
        kind = ARG_KINDS[raw.opname]
        instrs.append(
            Instr(
                FAMILY_OF.get(raw.opname, raw.opname),
                _RESOLVE[kind](code, cells, raw.arg, targets[i]),
                raw.arg if kind != "none" else None,
                labels.get(i),
                Positions(*positions[raw.unit]),
                2 * raw.unit,
            )
        )
    return instrs, entries


# ARG_KINDS kind -> argval from (code, localsplus names, oparg, jump target).
_RESOLVE: Final[dict[str, Callable[[CodeType, tuple[str, ...], int, Label | None], object]]] = {
    "none": lambda code, cells, arg, target: None,
    "int": lambda code, cells, arg, target: arg,
    "const": lambda code, cells, arg, target: code.co_consts[arg],
    "name": lambda code, cells, arg, target: code.co_names[arg],
    "global": lambda code, cells, arg, target: (bool(arg & 1), code.co_names[arg >> 1]),
    "local": lambda code, cells, arg, target: code.co_varnames[arg],
    "cell": lambda code, cells, arg, target: cells[arg],
    "jump": lambda code, cells, arg, target: target,
}


# -- labels and entries ---------------------------------------------------------------------


def label_index(instrs: Sequence[Instr]) -> dict[Label, int]:
    """Map each attached label to the index of its instruction.

    >>> here = Label("here")
    >>> label_index([Instr("NOP"), Instr("NOP", label=here)])[here]
    1
    """
    index: dict[Label, int] = {}
    for i, instr in enumerate(instrs):
        if instr.label is not None:
            if instr.label in index:
                raise BytecodeError(
                    f"label {instr.label} is attached to #{index[instr.label]} and #{i}"
                )
            index[instr.label] = i
    return index


def handlers(
    instrs: Sequence[Instr], entries: Sequence[ExceptionEntry]
) -> list[ExceptionEntry | None]:
    """The entry that handles each instruction (the later one where entries overlap).

    >>> a, h = Label("a"), Label("h")
    >>> code = [Instr("NOP", label=a), Instr("NOP"), Instr("PUSH_EXC_INFO", label=h)]
    >>> [e and str(e.target) for e in handlers(code, [ExceptionEntry(a, a, h, 0)])]
    ['h', None, None]
    """
    index = label_index(instrs)
    result: list[ExceptionEntry | None] = [None] * len(instrs)
    for n, entry in enumerate(entries):
        for what in (entry.start, entry.end, entry.target):
            if what not in index:
                raise BytecodeError(
                    f"exception entry {n} ({entry}): label {what} is not in the list"
                )
        first, last = index[entry.start], index[entry.end]
        if first > last or entry.depth < 0:
            raise BytecodeError(f"exception entry {n} ({entry}): empty range or negative depth")
        result[first : last + 1] = [entry] * (last + 1 - first)
    return result


@dataclass(frozen=True, slots=True)
class Unwind:
    """Where an exception raised at an instruction goes: handler index, depth, lasti."""

    target: int
    depth: int
    lasti: bool


@functools.lru_cache(maxsize=512)
def unwind_table(code: CodeType) -> tuple[Unwind | None, ...]:
    """For each instruction of ``code`` (indices as :func:`decode` numbers them), its handler.

    >>> unwind_table((lambda d: d["k"]).__code__)
    (None, None, None, None, None)
    """
    instrs, entries = decode(code)
    where = label_index(instrs)
    found = handlers(instrs, entries)
    return tuple(e if e is None else Unwind(where[e.target], e.depth, e.lasti) for e in found)


# RESUME's oparg from here up: a generator suspended in ``yield from`` (``_PyGen_yf``).
RESUME_DELEGATING: Final = 2


# -- stack effects ---------------------------------------------------------------------------------


def stack_effect(instr: Instr, *, jump: bool = False) -> int:
    """Net stack change of ``instr`` when it falls through (or jumps, with ``jump=True``).

    ``RETURN_GENERATOR`` counts +1: a resumed generator finds the sent value
    there for the ``POP_TOP`` that follows.

    >>> stack_effect(Instr("LOAD_GLOBAL", (True, "len"))), stack_effect(Instr("PRECALL", 2))
    (2, -2)
    >>> loop = Instr("FOR_ITER", Label())
    >>> stack_effect(loop), stack_effect(loop, jump=True)
    (1, -1)
    """
    if instr.opname == "RETURN_GENERATOR":
        return 1
    real = JUMP_FAMILIES[instr.opname][0] or "" if instr.opname in JUMP_FAMILIES else instr.opname
    code = opcode.opmap[real]
    return dis.stack_effect(code, _effect_arg(instr, code), jump=jump)


def _effect_arg(instr: Instr, code: int) -> int | None:
    if code < opcode.HAVE_ARGUMENT:
        return None
    kind, value = ARG_KINDS[instr.opname], instr.argval
    if kind == "int" and isinstance(value, int):
        return value
    if kind == "global" and isinstance(value, tuple):
        return int(bool(value[0]))
    return 0


def stack_needs(instr: Instr) -> int:
    """How many values ``instr`` pops or peeks at: the least stack depth it runs on.

    >>> [stack_needs(Instr(*i)) for i in [("BINARY_OP", 0), ("PRECALL", 2), ("COPY", 3)]]
    [2, 4, 3]
    """
    need = _NEEDS[instr.opname]
    return (
        need
        if isinstance(need, int)
        else need(instr.argval if isinstance(instr.argval, int) else 0)
    )


# -- dumps ---------------------------------------------------------------------------------------


def format_instrs(instrs: Sequence[Instr], entries: Sequence[ExceptionEntry] = ()) -> str:
    """A ``dis``-like listing: source line where it changes, label, opname, argument.

    Unnamed labels are numbered in order of appearance.

    >>> loop = Label("loop")
    >>> dump = format_instrs(
    ...     [Instr("NOP", label=loop), Instr("JUMP", loop), Instr("JUMP", Label())]
    ... )
    >>> print(dump)
          loop: NOP
                JUMP                 to loop
                JUMP                 to label1
    """
    names: dict[Label, str] = {}
    unnamed = itertools.count(1)

    def name_of(label: Label) -> str:
        if label not in names:
            names[label] = label.name or f"label{next(unnamed)}"
        return names[label]

    lines, shown_line = [], None
    for instr in instrs:
        line = instr.positions.lineno if instr.positions else None
        column = f"{line:>4}" if line is not None and line != shown_line else ""
        shown_line = line if line is not None else shown_line
        label = f"{name_of(instr.label)}:" if instr.label else ""
        lines.append(
            f"{column:>4} {label:>6} {instr.opname:<20} {_argrepr(instr, name_of)}".rstrip()
        )
    for entry in entries:
        lasti = ", lasti" if entry.lasti else ""
        lines.append(
            f"      exception {name_of(entry.start)} to {name_of(entry.end)}"
            f" -> {name_of(entry.target)} [depth {entry.depth}{lasti}]"
        )
    return "\n".join(lines)
