"""Jumps. A conditional jump needs its condition known while tracing (loops unroll)."""

from __future__ import annotations

from collections.abc import Callable

from ember.capture.interpreter import handler
from ember.capture.pyrules import truth
from ember.capture.tracer import FrameState, Instr, Unsupported
from ember.capture.values import Const, TensorV, Value

MAX_STEPS = 500_000  # instructions one translation may step through (unrolled loops included)


def _is_none(fs: FrameState, v: Value) -> bool:
    return isinstance(v, Const) and v.value is None


# Condition of each POP_JUMP family: jump when it holds.
CONDITIONS: dict[str, Callable[[FrameState, Value], bool]] = {
    "TRUE": truth,
    "FALSE": lambda fs, v: not truth(fs, v),
    "NONE": _is_none,
    "NOT_NONE": lambda fs, v: not _is_none(fs, v),
}


def _check_budget(fs: FrameState) -> None:
    fs.tracer.steps += 1
    if fs.tracer.steps > MAX_STEPS:
        raise Unsupported(f"more than {MAX_STEPS} jumps while tracing (an unbounded loop?)", "loop")


@handler(
    *(
        f"POP_JUMP_{d}_IF_{c}"
        for d in ("FORWARD", "BACKWARD")
        for c in ("TRUE", "FALSE", "NONE", "NOT_NONE")
    )
)
def POP_JUMP_IF(fs: FrameState, inst: Instr) -> None:
    kind = inst.opname.split("_IF_")[1]
    value = fs.pop()
    if isinstance(value, TensorV) and kind in ("TRUE", "FALSE"):
        raise Unsupported(f"data-dependent jump (`{fs.location().text}`)", "data-dependent")
    if CONDITIONS[kind](fs, value):
        _check_budget(fs)
        fs.jump(inst)


@handler("JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP")
def JUMP_IF_OR_POP(fs: FrameState, inst: Instr) -> None:
    want = inst.opname == "JUMP_IF_TRUE_OR_POP"
    if truth(fs, fs.peek()) == want:
        fs.jump(inst)
    else:
        fs.pop()


@handler("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT")
def JUMP(fs: FrameState, inst: Instr) -> None:
    _check_budget(fs)
    fs.jump(inst)
