"""Editing decoded code, building code from scratch, and the checker's refusals."""

from __future__ import annotations

import dataclasses
import dis
import inspect
import itertools
import re
import sys
import traceback
import types
from typing import Any

import pytest

from ember.capture import assemble as assemble_module
from ember.capture.assemble import CodeSpec, assemble, check
from ember.capture.bytecode_311 import (
    BytecodeError,
    ExceptionEntry,
    Instr,
    Label,
    Positions,
    decode,
    format_instrs,
)


def _function(code: types.CodeType, fn: Any = None) -> Any:
    """A function running ``code`` with ``fn``'s globals, defaults and closure."""
    if fn is None:
        return types.FunctionType(code, globals())
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def _ops(code: types.CodeType) -> list[str]:
    return [i.opname for i in dis.get_instructions(code)]


# -- edits -----------------------------------------------------------------------------------------


def counted_loop(n):
    total = 0
    for i in range(n):
        try:
            total += 10 // i
        except ZeroDivisionError:
            total -= 1
    return total


def test_insert_a_pair_at_the_start() -> None:
    code = counted_loop.__code__
    instrs, entries = decode(code)
    resume = next(i for i, instr in enumerate(instrs) if instr.opname == "RESUME")
    pair = [Instr("LOAD_CONST", "marker"), Instr("POP_TOP")]
    new = assemble(instrs[: resume + 1] + pair + instrs[resume + 1 :], entries, CodeSpec.of(code))
    assert "marker" in new.co_consts and new.co_consts[: len(code.co_consts)] == code.co_consts
    assert _function(new, counted_loop)(5) == counted_loop(5) == 19


def test_inserts_inside_an_exception_range_are_covered() -> None:
    code = counted_loop.__code__
    instrs, entries = decode(code)
    binary = next(i for i, instr in enumerate(instrs) if instr.opname == "BINARY_OP")
    # total += 10 // (i * 1): the division's operand grows, still inside the try range
    extra = [Instr("LOAD_CONST", 1), Instr("BINARY_OP", 5)]
    edited = instrs[:binary] + extra + instrs[binary:]
    new = assemble(edited, entries, CodeSpec.of(code))
    assert _function(new, counted_loop)(5) == 19


def test_growth_puts_extended_arg_on_a_backward_jump() -> None:
    code = counted_loop.__code__
    instrs, entries = decode(code)
    body = next(i for i, instr in enumerate(instrs) if instr.opname == "FOR_ITER") + 2
    padding = [Instr("NOP", positions=instrs[body].positions)] * 300
    new = assemble(instrs[:body] + padding + instrs[body:], entries, CodeSpec.of(code))
    found = list(dis.get_instructions(new))
    after_prefix = [b.opname for a, b in itertools.pairwise(found) if a.opname == "EXTENDED_ARG"]
    assert "JUMP_BACKWARD" in after_prefix and "FOR_ITER" in after_prefix
    assert _function(new, counted_loop)(5) == 19


def test_moving_a_label_retargets_jumps() -> None:
    def pick(flag):
        if flag:
            return "yes"
        return "no"

    instrs, entries = decode(pick.__code__)
    at = next(i for i, instr in enumerate(instrs) if instr.label is not None)
    label = instrs[at].label
    # jumps now land on a new instruction that returns early
    early = [Instr("LOAD_CONST", "early", label=label), Instr("RETURN_VALUE")]
    edited = [*instrs[:at], *early, dataclasses.replace(instrs[at], label=None), *instrs[at + 1 :]]
    new = assemble(edited, entries, CodeSpec.of(pick.__code__))
    assert (_function(new, pick)(True), _function(new, pick)(False)) == ("yes", "early")


def test_the_assembler_picks_jump_directions_from_the_layout() -> None:
    neg, start = Label("neg"), Label("start")
    body = [
        Instr("RESUME", 0),
        Instr("JUMP", start),
        Instr("LOAD_CONST", "negative", label=neg),
        Instr("RETURN_VALUE"),
        Instr("LOAD_FAST", "x", label=start),
        Instr("LOAD_CONST", 0),
        Instr("COMPARE_OP", 0),
        Instr("POP_JUMP_IF_TRUE", neg),
        Instr("LOAD_CONST", "positive"),
        Instr("RETURN_VALUE"),
    ]
    code = assemble(body, [], CodeSpec(name="sign", argcount=1, varnames=("x",)))
    assert "JUMP_FORWARD" in _ops(code) and "POP_JUMP_BACKWARD_IF_TRUE" in _ops(code)
    assert (_function(code)(-1), _function(code)(1)) == ("negative", "positive")
    assert [i.opname for i in decode(code)[0]] == [i.opname for i in body]
    with pytest.raises(BytecodeError, match=re.escape("#7 FOR_ITER to neg: 3.11 has no backward")):
        assemble(
            [*body[:7], Instr("FOR_ITER", neg), *body[8:]],
            [],
            CodeSpec(name="sign", argcount=1, varnames=("x",)),
        )


def test_jump_no_interrupt_keeps_its_meaning_in_both_directions() -> None:
    top, done, skip = Label("top"), Label("done"), Label("skip")
    body = [
        Instr("RESUME", 0),
        Instr("JUMP_NO_INTERRUPT", skip),
        Instr("LOAD_CONST", "skipped"),
        Instr("RETURN_VALUE"),
        Instr("LOAD_CONST", 0, label=skip),
        Instr("STORE_FAST", "i"),
        Instr("LOAD_FAST", "i", label=top),
        Instr("LOAD_CONST", 3),
        Instr("COMPARE_OP", 0),
        Instr("POP_JUMP_IF_FALSE", done),
        Instr("LOAD_FAST", "i"),
        Instr("LOAD_CONST", 1),
        Instr("BINARY_OP", 13),
        Instr("STORE_FAST", "i"),
        Instr("JUMP_NO_INTERRUPT", top),
        Instr("LOAD_FAST", "i", label=done),
        Instr("RETURN_VALUE"),
    ]
    code = assemble(body, [], CodeSpec(name="count"))
    assert _ops(code).count("JUMP_FORWARD") == 1 and "JUMP_BACKWARD_NO_INTERRUPT" in _ops(code)
    assert code.co_varnames == ("i",) and _function(code)() == 3


# -- code from scratch -----------------------------------------------------------------------------


def test_add_one_from_scratch_matches_the_compiler() -> None:
    body = [
        Instr("RESUME", 0),
        Instr("LOAD_FAST", "x"),
        Instr("LOAD_CONST", 1),
        Instr("BINARY_OP", 0),
        Instr("RETURN_VALUE"),
    ]
    code = assemble(body, [], CodeSpec(name="f", argcount=1, varnames=("x",)))

    def f(x):
        return x + 1

    assert code.co_code == f.__code__.co_code
    assert (code.co_consts, code.co_stacksize, code.co_nlocals) == ((None, 1), 2, 1)
    assert _function(code)(41) == 42
    # no positions: "no location" entries that still cover every code unit
    assert list(code.co_positions()) == [(None, None, None, None)] * (len(code.co_code) // 2)


def _safe_inverse(spec: CodeSpec) -> tuple[list[Instr], list[ExceptionEntry]]:
    """try: return 1 / x / except ZeroDivisionError: return "inf", by hand."""
    start, last, handler, matched, cleanup = (Label(n) for n in "start last h matched c".split())
    reraise, swap = Label("reraise"), Label("swap")
    line = Positions(2, 2, 4, 20)
    instrs = [
        Instr("RESUME", 0),
        Instr("LOAD_CONST", 1.0, label=start, positions=line),
        Instr("LOAD_FAST", "x", positions=line),
        Instr("BINARY_OP", 11, label=last, positions=line),
        Instr("RETURN_VALUE", positions=line),
        Instr("PUSH_EXC_INFO", label=handler),
        Instr("LOAD_GLOBAL", (False, "ZeroDivisionError"), positions=Positions(3, 3, 4, 20)),
        Instr("CHECK_EXC_MATCH"),
        Instr("POP_JUMP_IF_TRUE", matched),
        Instr("RERAISE", 0, label=reraise),
        Instr("LOAD_CONST", "inf", label=matched),
        Instr("SWAP", 2),
        Instr("POP_TOP"),
        Instr("SWAP", 2, label=swap),
        Instr("POP_EXCEPT"),
        Instr("RETURN_VALUE"),
        Instr("COPY", 3, label=cleanup),
        Instr("POP_EXCEPT"),
        Instr("RERAISE", 1),
    ]
    entries = [
        ExceptionEntry(start, last, handler, depth=0),
        ExceptionEntry(handler, reraise, cleanup, depth=1, lasti=True),
        ExceptionEntry(matched, swap, cleanup, depth=1, lasti=True),
    ]
    return instrs, entries


def test_try_except_from_scratch() -> None:
    spec = CodeSpec(name="safe_inverse", argcount=1, varnames=("x",), firstlineno=1)
    code = assemble(*_safe_inverse(spec), spec)
    f = _function(code)
    assert (f(4), f(0), code.co_stacksize) == (0.25, "inf", 4)
    assert sys.exc_info() == (None, None, None)
    with pytest.raises(TypeError) as caught:
        f("a")
    assert traceback.extract_tb(caught.value.__traceback__)[-1].lineno == 2
    assert "    exception start to last -> h [depth 0]" in format_instrs(*_safe_inverse(spec))


def test_nested_entries_are_flattened_into_sorted_disjoint_ranges() -> None:
    a, b, c, d, outer, inner = (Label(n) for n in "a b c d outer inner".split())
    body = [
        Instr("RESUME", 0),
        Instr("LOAD_FAST", "x", label=a),
        Instr("UNARY_NEGATIVE"),  # fails for a str: the outer handler
        Instr("POP_TOP"),
        Instr("LOAD_CONST", 1, label=b),
        Instr("LOAD_FAST", "x"),
        Instr("BINARY_OP", 11, label=c),  # fails for 0: the inner handler
        Instr("POP_TOP", label=d),
        Instr("LOAD_CONST", "ok"),
        Instr("RETURN_VALUE"),
        *(Instr("POP_TOP", label=outer), Instr("LOAD_CONST", "outer"), Instr("RETURN_VALUE")),
        *(Instr("POP_TOP", label=inner), Instr("LOAD_CONST", "inner"), Instr("RETURN_VALUE")),
    ]
    entries = [ExceptionEntry(a, d, outer, 0), ExceptionEntry(b, c, inner, 0)]
    code = assemble(body, entries, CodeSpec(name="nested", argcount=1, varnames=("x",)))
    table = [(e.start, e.end, e.target) for e in dis.Bytecode(code).exception_entries]
    starts = [start for start, _, _ in table]
    assert len(table) == 3 and starts == sorted(starts)
    assert all(first[1] <= second[0] for first, second in itertools.pairwise(table))
    assert table[0][2] == table[2][2] != table[1][2]
    f = _function(code)
    assert (f(2), f("s"), f(0)) == ("ok", "outer", "inner")


def test_exception_and_jump_targets_point_at_the_first_extended_arg() -> None:
    # 300 constants first, so LOAD_CONST 1.0 and "inf" need an EXTENDED_ARG prefix
    spec = CodeSpec(
        name="safe_inverse", argcount=1, varnames=("x",), consts=(None, *range(1000, 1300))
    )
    code = assemble(*_safe_inverse(spec), spec)
    found = {i.offset: i for i in dis.get_instructions(code)}
    first_entry = next(iter(dis.Bytecode(code).exception_entries))
    assert found[first_entry.start].opname == "EXTENDED_ARG"
    jump = next(i for i in found.values() if i.opname == "POP_JUMP_FORWARD_IF_TRUE")
    assert found[jump.argval].opname == "EXTENDED_ARG"
    f = _function(code)
    assert (f(4), f(0)) == (0.25, "inf")


def test_constants_are_deduplicated_by_type_and_value() -> None:
    inner = compile("lambda: 0", "<x>", "eval").co_consts[0]
    values = [1, 1.0, True, -0.0, 0.0, (1,), (1.0,), (True,), "1", b"1", inner, 1, (1,), inner]
    body = [Instr("RESUME", 0)]
    body += [op for value in values for op in (Instr("LOAD_CONST", value), Instr("POP_TOP"))]
    body += [Instr("LOAD_CONST", None), Instr("RETURN_VALUE")]
    code = assemble(body, [], CodeSpec())
    assert [repr(c) for c in code.co_consts] == [repr(v) for v in [None, *values[:11]]]
    assert str(code.co_consts[4]) == "-0.0" and code.co_consts[-1] is inner


def test_closures_and_cells_from_a_spec() -> None:
    def outer(a):
        def inner():
            return a

        return inner

    instrs, entries = decode(outer.__code__)
    spec = CodeSpec.of(outer.__code__, name="renamed", qualname="ember.renamed")
    new = _function(assemble(instrs, entries, spec), outer)
    assert new.__qualname__ == "ember.renamed" and new(7)() == 7
    with pytest.raises(BytecodeError, match=re.escape("'a' is a cell or free variable: use the")):
        assemble([*instrs[:2], Instr("LOAD_FAST", "a"), Instr("POP_TOP"), *instrs[2:]], [], spec)
    with pytest.raises(BytecodeError, match=re.escape("renamed: MAKE_CELL for [], cellvars are")):
        assemble(instrs[1:], entries, spec)


def test_a_str_first_constant_would_be_the_docstring() -> None:
    body = [Instr("RESUME", 0), Instr("LOAD_CONST", "hello"), Instr("RETURN_VALUE")]
    assert _function(assemble(body, [], CodeSpec())).__doc__ is None
    assert _function(assemble(body, [], CodeSpec(consts=()))).__doc__ == "hello"


# -- the checker -----------------------------------------------------------------------------------

RESUME = Instr("RESUME", 0)
CLOSURE_CODE = (lambda a: lambda: a)(1).__code__
RETURN = [Instr("LOAD_CONST", None), Instr("RETURN_VALUE")]
A, B, H = Label("a"), Label("b"), Label("h")

BROKEN: list[tuple[list[Instr], list[ExceptionEntry], str]] = [
    ([RESUME, Instr("LOAD_FOO"), *RETURN], [], "#1: unknown opname 'LOAD_FOO'"),
    ([RESUME, Instr("CACHE"), *RETURN], [], "#1: unknown opname 'CACHE'"),
    (
        [RESUME, Instr("LOAD_GLOBAL", "len"), *RETURN],
        [],
        "#1 LOAD_GLOBAL 'len': argval must be (push_null: bool, name: str), not 'len'",
    ),
    (
        [RESUME, Instr("BINARY_OP", 26), *RETURN],
        [],
        "#1 BINARY_OP 26: argument out of range [0, 25]",
    ),
    (
        [RESUME, *RETURN, Instr("JUMP", Label("gone"))],
        [],
        "#3 JUMP to gone: jump target gone is not in the list",
    ),
    (
        [RESUME, Instr("POP_TOP"), *RETURN],
        [],
        "stack underflow at #1 POP_TOP: needs 1 value(s), has 0",
    ),
    (
        [
            RESUME,
            Instr("LOAD_CONST", 1),
            Instr("LOAD_FAST", "x"),
            Instr("POP_JUMP_IF_TRUE", A),
            Instr("LOAD_CONST", 2),
            Instr("RETURN_VALUE", label=A),
        ],
        [],
        "inconsistent stack depth at #5 RETURN_VALUE: 1 on one path, 2 after #4 LOAD_CONST 2",
    ),
    (
        [
            RESUME,
            Instr("NOP", label=A),
            *RETURN,
            Instr("PUSH_EXC_INFO", label=H),
            Instr("RERAISE", 0),
        ],
        [ExceptionEntry(A, A, H, depth=3)],
        "exception entry a to a -> h [depth 3] keeps 3 value(s) but the stack at #1 NOP has 0",
    ),
    (
        [RESUME, Instr("NOP", label=A), *RETURN],
        [ExceptionEntry(A, B, A, depth=0)],
        "exception entry 0 (a to b -> a [depth 0]): label b is not in the list",
    ),
    (
        [RESUME, Instr("LOAD_CONST", 1)],
        [],
        "control runs past the last instruction after #1 LOAD_CONST 1",
    ),
    (
        [RESUME, Instr("NOP", label=A), Instr("NOP", label=A), *RETURN],
        [],
        "label a is attached to #1 and #2",
    ),
    (
        [RESUME, Instr("LOAD_CONST", None), Instr("KW_NAMES", ("k",)), *RETURN],
        [],
        "#2 KW_NAMES ('k',): must come right before a PRECALL with at least 1 argument(s)",
    ),
    (
        [RESUME, Instr("PUSH_NULL"), Instr("LOAD_FAST", "f"), Instr("PRECALL", 0), *RETURN],
        [],
        "#3 PRECALL 0: PRECALL n and CALL n must be adjacent",
    ),
    (
        [
            RESUME,
            Instr("PUSH_NULL"),
            Instr("LOAD_FAST", "f"),
            Instr("PRECALL", 0),
            Instr("CALL", 1),
        ],
        [],
        "#4 CALL 1: PRECALL n and CALL n must be adjacent",
    ),
    (
        [RESUME, Instr("LOAD_CONST", 1), Instr("YIELD_VALUE"), Instr("POP_TOP"), *RETURN],
        [],
        "#2 YIELD_VALUE: must be followed by RESUME",
    ),
    (
        [RESUME, Instr("LOAD_CONST", CLOSURE_CODE), Instr("MAKE_FUNCTION", 0), *RETURN],
        [],
        "#2 MAKE_FUNCTION 0: <lambda>.<locals>.<lambda> has 1 free variable(s); the closure must",
    ),
    ([Instr("LOAD_CONST", None), Instr("RETURN_VALUE")], [], "no RESUME instruction"),
    (
        [RESUME, Instr("MAKE_CELL", "c"), *RETURN],
        [],
        "#1 MAKE_CELL c: allowed only in the prologue",
    ),
    (
        [RESUME, Instr("NOP", positions=Positions(5, 4, None, None)), *RETURN],
        [],
        "#1 NOP: bad positions (5, 4, None, None)",
    ),
]


@pytest.mark.parametrize(("instrs", "entries", "message"), BROKEN)
def test_check_names_the_broken_instruction(
    instrs: list[Instr], entries: list[ExceptionEntry], message: str
) -> None:
    with pytest.raises(BytecodeError) as caught:
        check(instrs, entries)
    assert str(caught.value).startswith(message)
    with pytest.raises(BytecodeError):
        assemble(instrs, entries, CodeSpec(varnames=("x", "f")))


def test_make_function_needs_a_closure_of_the_right_size() -> None:
    def outer(a):
        return lambda: a

    instrs, entries = decode(outer.__code__)
    at = next(i for i, instr in enumerate(instrs) if instr.opname == "BUILD_TUPLE")
    broken = [*instrs[:at], Instr("BUILD_TUPLE", 2), *instrs[at + 1 :]]
    with pytest.raises(BytecodeError, match="has 1 free variable"):
        check(broken, entries)


SPEC_RULES: list[tuple[list[Instr], CodeSpec, str]] = [
    (
        [RESUME, Instr("LOAD_DEREF", "q"), Instr("RETURN_VALUE")],
        CodeSpec(name="f"),
        "#1 LOAD_DEREF q: 'q' is not in cellvars or freevars",
    ),
    (
        [RESUME, *RETURN],
        CodeSpec(name="f", freevars=("z",)),
        "f: COPY_FREE_VARS [] for 1 free variable(s)",
    ),
    (
        [RESUME, *RETURN],
        CodeSpec(name="f", flags=inspect.CO_GENERATOR),
        "f: RETURN_GENERATOR without generator flags",
    ),
    (
        [RESUME, Instr("LOAD_CONST", 1), Instr("YIELD_VALUE"), Instr("RESUME", 1), *RETURN],
        CodeSpec(name="f"),
        "f: YIELD_VALUE outside a generator",
    ),
    (
        [Instr("COPY_FREE_VARS", 1), RESUME, Instr("LOAD_CLASSDEREF", "z"), Instr("RETURN_VALUE")],
        CodeSpec(name="f", freevars=("z",)),
        "f: LOAD_CLASSDEREF in CO_OPTIMIZED code",
    ),
    (
        [RESUME, *RETURN],
        CodeSpec(name="f", argcount=2, varnames=("x",)),
        "f: 2 argument(s) but 1 varnames",
    ),
    (
        [RESUME, *RETURN],
        CodeSpec(name="f", cellvars=("a",), freevars=("a",)),
        "f: ['a'] both cell and free variables: unsupported",
    ),
]


@pytest.mark.parametrize(("instrs", "spec", "message"), SPEC_RULES)
def test_assemble_checks_instructions_against_the_spec(
    instrs: list[Instr], spec: CodeSpec, message: str
) -> None:
    with pytest.raises(BytecodeError) as caught:
        assemble(instrs, [], spec)
    assert str(caught.value).startswith(message)


def test_ember_check_verifies_the_assembled_code(monkeypatch: pytest.MonkeyPatch) -> None:
    def short_table(*args: Any) -> bytes:
        return b"\x80\x00"  # one entry covering one unit

    monkeypatch.setattr(assemble_module, "_line_table", short_table)
    monkeypatch.setenv("EMBER_CHECK", "1")
    body = [RESUME, *RETURN]
    with pytest.raises(BytecodeError, match="location table does not cover 3 units"):
        assemble(body, [], CodeSpec())
    monkeypatch.setenv("EMBER_CHECK", "0")
    assert assemble(body, [], CodeSpec()).co_linetable == b"\x80\x00"
