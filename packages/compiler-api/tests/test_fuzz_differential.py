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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
import fuzzcheck
import fuzzgen

BACKENDS = ["eager", "aot_eager", "inductor"]
# Examples per backend in CI; inductor compiles C++ per graph, so it gets fewer.
CI_EXAMPLES = {"eager": 60, "aot_eager": 60, "inductor": 40}


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
    @settings(
        max_examples=examples(backend),
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(source=fuzzgen.programs(), plan=calls())
    def check(source: str, plan: list[fuzzcheck.Call]) -> None:
        problems = fuzzcheck.differential(source, plan, backend)
        assert not problems, fuzzcheck.repro(source, plan, backend, problems)

    check()


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_random_programs_match_eager(backend: str) -> None:
    _run(backend)
