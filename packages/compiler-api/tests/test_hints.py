"""Every graph-break category has its own hint, and a real break shows the right one."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

import ember.capture
import ember.compiler
from ember.capture.tracer import HINTS

BACKENDS = ["eager", "aot_eager", "inductor"]
CAPTURE_SRC = pathlib.Path(ember.capture.__file__).parent


def _raised_categories() -> set[str]:
    """Every category string a raise site in ember.capture gives ``Unsupported``: the
    second argument, or a string assigned to a name passed there (``category = ...``)."""
    found: set[str] = set()
    for path in CAPTURE_SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Unsupported"):
                continue
            arg = node.args[1] if len(node.args) > 1 else None
            if isinstance(arg, ast.Constant):
                found.add(arg.value)
            elif arg is None:
                found.add("unsupported")  # the default
        for node in ast.walk(tree):  # category = "a" if ... else "b"
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "category":
                found |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
    return found


def test_every_raised_category_has_a_hint():
    raised = _raised_categories()
    assert {"graph-break", "disabled", "data-dependent", "call"} <= raised  # the scan works
    assert raised - set(HINTS) == set()


def test_hints_are_distinct_and_not_empty():
    assert all(hint.strip() for hint in HINTS.values())
    assert len(set(HINTS.values())) == len(HINTS)


@ember.compiler.disable
def _noisy(x):
    return x + 1


def _inner(x):
    return x * 3


_inner_not_recursive = ember.compiler.disable(_inner, recursive=False)


def _calls_disabled(x):
    return _noisy(x.sin()).cos()


def _calls_disabled_not_recursive(x):
    return _inner_not_recursive(x.sin()).cos()


def _breaks_on_purpose(x):
    x = x.sin()
    ember.compiler.graph_break()
    return x.cos()


def _branches_on_data(x):
    if x.sum() > 0:
        return x.sin()
    return x.cos()


# (function, category, a phrase only the right hint has)
CASES = [
    (_calls_disabled, "disabled", "ember.compiler.disable"),
    (_calls_disabled_not_recursive, "disabled", "ember.compiler.disable"),
    (_breaks_on_purpose, "graph-break", "graph_break() was called here on purpose"),
    (_branches_on_data, "data-dependent", "torch.where"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("fn", "category", "phrase"), CASES, ids=[c[0].__name__ for c in CASES])
def test_a_real_break_shows_its_own_hint(backend, fn, category, phrase):
    compiled = ember.compiler.compile(fn, backend=backend)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), fn(x))
    (brk,) = compiled.stats.breaks
    assert (brk.category, brk.hint) == (category, HINTS[category])
    assert phrase in brk.hint


def test_explain_no_longer_says_on_purpose_for_disable():
    out = ember.compiler.explain(_calls_disabled)(torch.randn(4))
    (reason,) = out.break_reasons
    assert reason.category == "disabled"
    assert "on purpose" not in str(reason) and "ember.compiler.disable" in reason.hint
