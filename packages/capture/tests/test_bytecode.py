"""The 3.11 bytecode layer: tables, decoding, exact round trips, and behaviour after assembly."""

from __future__ import annotations

import asyncio
import contextlib
import dis
import importlib
import itertools
import opcode
import operator
import sys
import traceback
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ember.capture.assemble import CodeSpec, assemble, stack_flow
from ember.capture.bytecode_311 import (
    ARG_KINDS,
    BACKWARD_JUMPS,
    BINARY_OPS,
    CACHE_ENTRIES,
    COMPARE_OPS,
    CONDITIONAL_JUMPS,
    FAMILY_OF,
    FORWARD_JUMPS,
    JUMP_FAMILIES,
    PARTNER,
    TERMINAL,
    UNCONDITIONAL_JUMPS,
    Instr,
    decode,
    format_instrs,
    stack_needs,
)

# -- tables ----------------------------------------------------------------------------------------


def test_every_opname_has_a_cache_count_and_an_argument_kind() -> None:
    for name, code in dis.opmap.items():
        assert CACHE_ENTRIES[name] == opcode._inline_cache_entries[code], name
        assert ARG_KINDS[name] in {
            "none",
            "int",
            "const",
            "name",
            "global",
            "local",
            "cell",
            "jump",
        }
    assert {n: c for n, c in CACHE_ENTRIES.items() if c} == {
        "BINARY_SUBSCR": 4,
        "STORE_SUBSCR": 1,
        "UNPACK_SEQUENCE": 1,
        "STORE_ATTR": 4,
        "LOAD_ATTR": 4,
        "COMPARE_OP": 2,
        "LOAD_GLOBAL": 5,
        "BINARY_OP": 1,
        "LOAD_METHOD": 10,
        "PRECALL": 1,
        "CALL": 4,
    }


def test_every_emittable_opname_knows_how_deep_a_stack_it_needs() -> None:
    for name in [*dis.opmap, *JUMP_FAMILIES]:
        if name not in ("CACHE", "EXTENDED_ARG"):
            arg = 1 if ARG_KINDS[name] == "int" else None
            assert stack_needs(Instr(name, arg)) >= 0, name


def test_binary_op_table_mirrors_nb_ops() -> None:
    assert len(BINARY_OPS) == 26
    assert [(op.name, op.symbol) for op in BINARY_OPS] == opcode._nb_ops
    assert BINARY_OPS[0].fn is operator.add and BINARY_OPS[13].fn is operator.iadd
    for op in BINARY_OPS:
        symbol = op.symbol.removesuffix("=")
        expected = eval(f"a {symbol} b", {}, {"a": 7, "b": 3}) if symbol != "@" else None
        if expected is not None:
            assert op.fn(7, 3) == expected, op
    assert [op.fn(2, 3) for op in COMPARE_OPS] == [True, True, False, True, False, False]
    assert [op.symbol for op in COMPARE_OPS] == list(dis.cmp_op)


def test_jump_families_cover_every_relative_jump() -> None:
    relative = {opcode.opname[code] for code in opcode.hasjrel}
    assert relative == FORWARD_JUMPS | BACKWARD_JUMPS
    assert all(name in FAMILY_OF for name in relative)
    assert {FAMILY_OF[name] for name in relative} == set(JUMP_FAMILIES)
    for forward, backward in JUMP_FAMILIES.values():
        assert forward in FORWARD_JUMPS and (backward is None or backward in BACKWARD_JUMPS)
    assert PARTNER["POP_JUMP_BACKWARD_IF_NOT_NONE"] == "POP_JUMP_FORWARD_IF_NOT_NONE"
    assert PARTNER["JUMP_BACKWARD_NO_INTERRUPT"] == "JUMP_FORWARD"
    assert "FOR_ITER" not in PARTNER and "SEND" in CONDITIONAL_JUMPS
    assert {"JUMP", "JUMP_FORWARD", "JUMP_BACKWARD"} <= UNCONDITIONAL_JUMPS <= TERMINAL
    assert CONDITIONAL_JUMPS.isdisjoint(TERMINAL)


# -- decoding --------------------------------------------------------------------------------------


def _outer(a, b):
    c = a + b

    def inner(d=3, *, e=4) -> int:
        return a + c + d + e

    return inner, print(a, sep=b, end="")


def test_decode_resolves_arguments() -> None:
    instrs, entries = decode(_outer.__code__)
    assert entries == []
    assert [i.opname for i in instrs[:3]] == ["MAKE_CELL", "MAKE_CELL", "RESUME"]
    assert [i.argval for i in instrs[:2]] == ["a", "c"]
    by_name = {i.opname: i for i in instrs}
    assert by_name["KW_NAMES"].argval == ("sep", "end")
    assert by_name["LOAD_GLOBAL"].argval == (True, "print")
    assert by_name["MAKE_FUNCTION"].argval == 15
    closures = [i.argval for i in instrs if i.opname == "LOAD_CLOSURE"]
    assert closures == ["a", "c"]
    code = _outer.__code__
    for instr in instrs:
        if ARG_KINDS[instr.opname] == "cell":
            assert instr.argval == code._varname_from_oparg(instr.arg)  # type: ignore[attr-defined]
        assert instr.offset is not None and instr.offset % 2 == 0


def test_decode_makes_jumps_direction_free_and_targets_labels() -> None:
    def loop(n):
        while n:
            n -= 1
        return n

    instrs, _ = decode(loop.__code__)
    jumps = [i for i in instrs if i.target is not None]
    assert {i.opname for i in jumps} <= set(JUMP_FAMILIES)
    targets = {i.label for i in instrs if i.label is not None}
    assert all(j.target in targets for j in jumps)
    text = format_instrs(instrs)
    assert "POP_JUMP_IF_TRUE" in text or "POP_JUMP_IF_FALSE" in text
    assert "FORWARD" not in text and "BACKWARD" not in text


# -- round trips -----------------------------------------------------------------------------------

ROUND_TRIP_MODULES = [
    "json",
    "json.decoder",
    "argparse",
    "dataclasses",
    "inspect",
    "typing",
    "asyncio.tasks",
    "email.message",
    "dis",
    "traceback",
    "collections",
    "contextlib",
    "functools",
]


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _module_code(name: str) -> types.CodeType:
    path = importlib.import_module(name).__file__
    assert path is not None
    with open(path, encoding="utf-8") as source:
        return compile(source.read(), path, "exec")


@pytest.mark.parametrize("module", ROUND_TRIP_MODULES)
def test_round_trip_is_exact(module: str) -> None:
    mismatches = []
    codes = list(_code_objects(_module_code(module)))
    for code in codes:
        new = assemble(*decode(code), CodeSpec.of(code))
        same = (
            new == code
            and new.co_code == code.co_code
            and new.co_linetable == code.co_linetable
            and new.co_exceptiontable == code.co_exceptiontable
            and new.co_stacksize == code.co_stacksize
            and list(new.co_positions()) == list(code.co_positions())
            and list(new.co_lines()) == list(code.co_lines())
        )
        if not same:
            mismatches.append(code.co_qualname)
    assert len(codes) > 5
    assert mismatches == []


def test_stack_flow_matches_cpython_stacksize() -> None:
    for code in _code_objects(_module_code("asyncio.tasks")):
        assert stack_flow(*decode(code)).max_depth == code.co_stacksize, code.co_qualname


# -- behaviour of assembled functions --------------------------------------------------------------


def f_loop(n):
    total = 0
    for i in range(n):
        if i % 3 == 0:
            continue
        total += i
    while n > 0:
        n -= 2
    return total, n


def f_try(x):
    log = []
    try:
        log.append(1 / x)
    except ZeroDivisionError as e:
        log.append(type(e).__name__)
    else:
        log.append("else")
    finally:
        log.append("finally")
    return log


def f_raise(x):
    if x > 1:
        return {}[x]
    try:
        raise ValueError(x)
    finally:
        x += 1


def f_with(flag):
    events = []
    with contextlib.suppress(KeyError):
        events.append("body")
        if flag:
            raise KeyError("boom")
        events.append("no raise")
    with contextlib.ExitStack() as stack:
        stack.callback(events.append, "exit")
    return events


def f_closure(a):
    b = a * 2

    def inner(c):
        nonlocal b
        b += c
        return a + b + c

    return inner(1), inner(2), b


def f_signature(a, /, b, *args, c, d=4, **kw):
    return a, b, args, c, d, sorted(kw.items())


def f_calls(x):
    first = f_signature(x, 2, 3, c=5, e=6)
    second = f_signature(*[x, 1], **{"c": 2})
    return first, second, dict(a=x, b=2), sorted([3, 1, x], reverse=True), "-".join(["a", "b"])


def f_comprehensions(n):
    squares = [i * i for i in range(n) if i % 2]
    names = {i: str(i) for i in range(n)}
    rests = {i % 3 for i in range(n)}
    return squares, names, rests, sum(i for i in range(n))


def f_generator(n):
    for i in range(n):
        got = yield i
        if got:
            yield from range(got)
    return "done"


def f_chains(a, b, c):
    return a < b < c, a == b != c, 1 <= a <= b <= c <= 10, a if b else c


async def f_async(n):
    total = 0
    for i in range(n):
        await asyncio.sleep(0)
        total += i
    return total


def _make_long() -> Callable[..., Any]:
    """A function whose jumps span more than 256 code units (EXTENDED_ARG on jumps)."""
    body = "".join(f"        total += {i} * x\n" for i in range(150))
    loop = "".join(f"        total -= i * {i}\n" for i in range(100))
    source = (
        "def f_long(x):\n    total = 0\n    if x:\n"
        + body
        + "    else:\n        total = -1\n    for i in range(3):\n"
        + loop
        + "    return total\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, "<f_long>", "exec"), namespace)
    fn: Callable[..., Any] = namespace["f_long"]
    return fn


f_long = _make_long()

CASES: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [
    (f_loop, (10,)),
    (f_loop, (0,)),
    (f_try, (2,)),
    (f_try, (0,)),
    (f_try, ("x",)),
    (f_raise, (2,)),
    (f_raise, (0,)),
    (f_with, (True,)),
    (f_with, (False,)),
    (f_closure, (5,)),
    (f_signature, (1, 2, 3, 4)),
    (f_calls, (7,)),
    (f_comprehensions, (7,)),
    (f_chains, (1, 2, 3)),
    (f_chains, (3, 3, 4)),
    (f_long, (1,)),
    (f_long, (0,)),
]


def _rebuild(fn: Callable[..., Any], edit: Callable[[list[Instr]], list[Instr]]) -> Any:
    code = fn.__code__  # type: ignore[attr-defined]
    instrs, entries = decode(code)
    new_code = assemble(edit(instrs), entries, CodeSpec.of(code))
    new = types.FunctionType(new_code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)  # type: ignore[attr-defined]
    new.__kwdefaults__ = fn.__kwdefaults__  # type: ignore[attr-defined]
    return new


def _pad(instrs: list[Instr], count: int = 3) -> list[Instr]:
    """Put NOPs (with the next instruction's positions) before most instructions."""
    out: list[Instr] = []
    started = False
    for instr in instrs:
        before = out[-1].opname if out else ""
        movable = before not in ("KW_NAMES", "PRECALL", "YIELD_VALUE") and not (
            instr.opname == "MAKE_FUNCTION" or isinstance(instr.argval, types.CodeType)
        )
        if started and movable:
            out += [Instr("NOP", positions=instr.positions)] * count
        out.append(instr)
        started = started or instr.opname == "RESUME"
    return out


EDITS = {"exact": lambda instrs: instrs, "padded": _pad}


def _outcome(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, ...]:
    try:
        result = fn(*args)
    except Exception as error:
        frames = traceback.extract_tb(error.__traceback__)[1:]  # drop this helper's frame
        return ("raised", type(error), str(error), [(f.name, f.lineno, f.line) for f in frames])
    if isinstance(result, types.GeneratorType):
        return ("generator", _drive(result))
    return ("returned", result)


def _drive(gen: Any) -> list[Any]:
    seen = []
    for sent in [None, 2, None, None, None, None, 1, None, None]:
        try:
            seen.append(gen.send(sent))
        except StopIteration as stop:
            return [*seen, ("stop", stop.value)]
    return seen


def _trace(fn: Callable[..., Any], args: tuple[Any, ...]) -> list[tuple[str, str, int | None]]:
    names = {fn.__name__, "inner", "<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"}
    events: list[tuple[str, str, int | None]] = []

    def tracer(frame: types.FrameType, event: str, arg: object) -> Any:
        if frame.f_code.co_name in names:
            events.append((event, frame.f_code.co_name, frame.f_lineno))
        return tracer

    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        _outcome(fn, args)
    finally:
        sys.settrace(old)
    return events


@pytest.mark.parametrize("edit", EDITS)
@pytest.mark.parametrize(("fn", "args"), [*CASES, (f_generator, (4,))])
def test_assembled_function_behaves_like_the_original(
    fn: Callable[..., Any], args: tuple[Any, ...], edit: str
) -> None:
    new = _rebuild(fn, EDITS[edit])
    assert new.__code__ is not fn.__code__  # type: ignore[attr-defined]
    assert _outcome(new, args) == _outcome(fn, args)
    assert _trace(new, args) == _trace(fn, args)


def test_coroutine_round_trip_runs() -> None:
    for edit in EDITS.values():
        assert asyncio.run(_rebuild(f_async, edit)(5)) == asyncio.run(f_async(5)) == 10


def test_padding_puts_extended_args_on_jumps() -> None:
    new = _rebuild(f_long, _pad)
    instrs = list(dis.get_instructions(new))
    extended = [b.opname for a, b in itertools.pairwise(instrs) if a.opname == "EXTENDED_ARG"]
    assert any(name.startswith(("JUMP", "POP_JUMP")) for name in extended)
    assert new(1) == f_long(1) and new(0) == f_long(0)
    assert new.__code__.co_stacksize == f_long.__code__.co_stacksize  # type: ignore[attr-defined]


def test_tracebacks_keep_line_numbers() -> None:
    for edit in EDITS.values():
        new = _rebuild(f_raise, edit)
        for arg in (2, 0):
            with pytest.raises(Exception) as caught:
                new(arg)
            with pytest.raises(Exception) as expected:
                f_raise(arg)
            got = [(f.lineno, f.line) for f in traceback.extract_tb(caught.value.__traceback__)]
            want = [(f.lineno, f.line) for f in traceback.extract_tb(expected.value.__traceback__)]
            assert got[1:] == want[1:] and len(got) == 2
