"""Differential fuzzer: random programs give eager's answer on every backend (issue 16).

Hypothesis draws a program from the grammar in ``fuzzgen`` (tensor ops, views, in-place ops,
control flow, containers, aliasing between arguments) and three calls: two with inputs of one
shape, a third with another shape, dtype, layout or aliasing pattern. Each call compares,
against eager, the outputs (values within ``ember.compiler.testing.TOLERANCES``, dtype, shape,
requires_grad), aliasing among outputs and inputs, input mutations (values and whether
``_version`` moved), gradients, and the exception type where eager raises.

CI runs a fixed-seed sample; ``EMBER_FUZZ_EXAMPLES=N`` runs N examples per backend. A failure
prints the program and a script that reproduces it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
import fuzzcheck
import fuzzgen

BACKENDS = ["eager", "aot_eager", "inductor"]
# Examples per backend in CI; inductor compiles C++ per graph, so it gets fewer.
CI_EXAMPLES = {"eager": 150, "aot_eager": 150, "inductor": 80}


def examples(backend: str) -> int:
    return int(os.environ.get("EMBER_FUZZ_EXAMPLES", CI_EXAMPLES[backend]))


@st.composite
def calls(draw: st.DrawFn) -> list[fuzzcheck.Call]:
    """Two calls with one input pattern (the second hits the cache), then another pattern."""
    first = draw(fuzzcheck.call_specs())
    again = fuzzcheck.CallSpec(**{**first.__dict__, "seed": first.seed + 1})
    state = fuzzcheck.GlobalState()
    return [(first, state), (again, state), (draw(fuzzcheck.call_specs()), state)]


def _run(backend: str) -> None:
    @fuzzcheck.fuzz_settings(examples(backend))
    @given(source=fuzzgen.programs(), plan=calls())
    def check(source: str, plan: list[fuzzcheck.Call]) -> None:
        problems = fuzzcheck.differential(source, plan, backend)
        assert not problems, fuzzcheck.repro(source, plan, backend, problems)

    check()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")  # programs call float() on grad tensors
@pytest.mark.parametrize("backend", BACKENDS)
def test_random_programs_match_eager(backend: str) -> None:
    _run(backend)


def _nudged(gm, example_inputs):
    """A wrong backend: every float output is off by 1e-3."""

    def run(*args):
        outs = gm(*args)
        return type(outs)(o + 1e-3 if o.is_floating_point() else o for o in outs)

    return run


def _stale(gm, example_inputs):
    """A wrong backend: every call returns the first call's outputs."""
    first = []

    def run(*args):
        first.append(first[0] if first else gm(*args))
        return first[0]

    return run


SAMPLE = fuzzgen.PRELUDE + "    v1 = a.sin() * G_SCALE\n    c.add_(1)\n    return v1, c\n"


@pytest.mark.parametrize(
    ("backend", "expected"), [(_nudged, "value: out[0]"), (_stale, "call 1: value")]
)
def test_the_comparison_catches_a_wrong_backend(backend, expected) -> None:
    plan = [(fuzzcheck.CallSpec(seed=s), fuzzcheck.GlobalState()) for s in (0, 1)]
    problems = fuzzcheck.differential(SAMPLE, plan, backend)
    assert any(expected in p for p in problems), problems
    assert not fuzzcheck.differential(SAMPLE, plan, "eager")


def test_every_gate_is_used() -> None:
    """A gate name that no production or check reads is a typo that gates nothing."""
    here = Path(__file__).parent
    text = "".join((here / f).read_text() for f in ("fuzzgen.py", "fuzzcheck.py"))
    for gate in fuzzgen.GATES:
        aliasing = gate.removeprefix("alias_") in fuzzcheck.ALIASING
        assert text.count(f'"{gate}"') >= 2 or aliasing, gate
