"""The explainer (which guard failed, in words) is built only when asked, and says exactly
what the explainer built with the check said (the texts below are the eager one's)."""

from __future__ import annotations

import builtins

import pytest
import torch

from ember.guards import (
    Attr,
    CodeCache,
    FrameSpec,
    Global,
    GuardSet,
    Item,
    Local,
    TensorSize,
    dict_keys,
    equals,
    id_match,
    is_none,
    length,
    module_state,
    shape_relation,
    tensor_match,
    type_match,
)
from ember.guards.codegen import build_explainer


class _Config:
    eps = 0.5


def _setup() -> tuple[GuardSet, FrameSpec, dict[str, object], torch.nn.Module]:
    lin = torch.nn.Linear(2, 2)
    module_globals: dict[str, object] = {"SCALE": 2.0, "len": len, "lin": lin}
    frame = FrameSpec("step", ("x", "k", "cfg", "opt", "m"), module_globals, vars(builtins))
    guards = GuardSet(
        [
            tensor_match(Local("x"), torch.zeros(8, 4)),
            equals(Local("k"), 3),
            type_match(Local("cfg"), {}),
            dict_keys(Local("cfg"), {"a": 1, "b": 2}),
            length(Item(Local("opt"), 0), [1, 2]),
            is_none(Item(Local("opt"), 1)),
            equals(Attr(Local("m"), "eps"), 0.5),
            equals(Global("SCALE"), 2.0),
            id_match(Global("len"), len),
            id_match(Global("lin"), lin),
            module_state(Global("lin"), lin),
            shape_relation("Eq(s0 % 4, 0)", {"s0": TensorSize(Local("x"), 1)}),
        ]
    )
    return guards, frame, module_globals, lin


GOOD = (torch.zeros(8, 4), 3, {"a": 1, "b": 2}, ([1, 2], None), _Config())

# argument slot changed -> (its value, the failing guard's index, the text): the texts and
# indices the eagerly built explainer gave (main at bc3f77c)
CASES = {
    "size": (0, torch.zeros(12, 4), 10, "x: size[0] expected 8, got 12"),
    "dtype": (0, torch.zeros(8, 4, dtype=torch.float64), 10,
              "x: dtype expected torch.float32, got torch.float64"),
    "equals": (1, 4, 0, "k: expected 3, got 4"),
    "type": (2, [1], 2, "cfg: type expected dict, got list"),
    "keys": (2, {"a": 1, "c": 2}, 5, "cfg: keys expected ['a', 'b'], got ['a', 'c']"),
    "length": (3, ([1], None), 8, "opt[0]: length expected 2, got 1"),
    "none": (3, ([1, 2], 5), 7, "opt[1]: expected None, got int"),
    "attr": (4, object(), 6, "m.eps: AttributeError: 'object' object has no attribute 'eps'"),
    "attr-value": (4, type("N", (), {"eps": 0.25})(), 6, "m.eps: expected 0.5, got 0.25"),
}  # fmt: skip


def test_compiling_and_passing_checks_build_no_explainer() -> None:
    guards, frame, _, _ = _setup()
    compiled = guards.compile(frame)
    assert compiled.check(*GOOD) and compiled.explain_failure(*GOOD) is None
    cache = CodeCache("step")
    entry = cache.add(guards.compile(frame), "graph")
    assert cache.lookup(*GOOD) == "graph"  # a hit never explains
    assert entry.guards._explainer is None
    assert entry.guards.explain_failure(*GOOD) is None  # asking builds it, once
    built = entry.guards._explainer
    assert built is not None and entry.guards.explainer is built


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_failing_guard_explains_itself_as_before(case: str) -> None:
    slot, value, index, text = CASES[case]
    guards, frame, _, _ = _setup()
    compiled = guards.compile(frame)
    args = list(GOOD)
    args[slot] = value
    assert compiled._explainer is None
    assert compiled.check(*args) is False
    assert compiled.explain_failure(*args) == text
    assert compiled.explainer(*args)[0] == index
    # the same as an explainer built with the check
    assert build_explainer(guards.guards, frame)(*args)[0] == index


def test_globals_changed_after_compiling_are_explained_as_the_check_reads_them() -> None:
    guards, frame, module_globals, lin = _setup()
    compiled = guards.compile(frame)
    module_globals["SCALE"] = 3.0
    assert compiled.explain_failure(*GOOD) == "G['SCALE']: expected 2.0, got 3.0"
    module_globals["SCALE"] = 2.0
    lin.train(False)
    assert compiled.explain_failure(*GOOD) == "G['lin']: training expected True, got False"
    lin.train(True)
    other = module_globals["lin"] = torch.nn.Linear(2, 2)
    assert compiled.explain_failure(*GOOD) == (
        f"G['lin']: expected the Linear object at {id(lin):#x}, "
        f"got the Linear object at {id(other):#x}"
    )
    module_globals["lin"] = lin


def test_a_global_deleted_before_the_first_explanation_still_fails_there() -> None:
    """``len`` was a global when the check was built, so the check reads ``G['len']`` and
    fails once it is deleted; an explainer built only now must read it the same way, not
    fall back to the builtin (which would pass, and explain nothing)."""
    guards, frame, module_globals, _ = _setup()
    compiled = guards.compile(frame)
    del module_globals["len"]
    assert compiled.check(*GOOD) is False
    assert compiled.explain_failure(*GOOD) == "G['len']: KeyError: 'len'"
    index, error = compiled.explainer(*GOOD)
    assert guards.guards[index].source == Global("len") and isinstance(error, KeyError)
