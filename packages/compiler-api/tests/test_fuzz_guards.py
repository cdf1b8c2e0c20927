"""Guard-soundness fuzzer: a cached graph never runs where eager's answer differs (issue 16).

Each program is compiled once, then called over a sequence of inputs and global states that
vary what guards must cover: shapes, dtypes, strides, aliasing between arguments,
requires_grad, grad mode, the default dtype, and the globals the program reads (``G_FLAG``,
``G_SCALE``). Calls revisit earlier states, so cache entries are hit as well as made. Every
call is compared with eager under the same state, as in the differential fuzzer.

CI runs a fixed-seed sample; ``EMBER_FUZZ_EXAMPLES=N`` runs N examples per backend.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
import fuzzcheck
import fuzzgen

BACKENDS = ["eager", "aot_eager", "inductor"]
CI_EXAMPLES = {"eager": 60, "aot_eager": 60, "inductor": 40}


def examples(backend: str) -> int:
    return int(os.environ.get("EMBER_FUZZ_EXAMPLES", CI_EXAMPLES[backend]))


def global_states() -> st.SearchStrategy[fuzzcheck.GlobalState]:
    return st.builds(
        fuzzcheck.GlobalState,
        grad=st.booleans(),
        default_dtype=st.sampled_from(["float32", "float64"]),
        flag=st.booleans(),
        scale=st.sampled_from([0.5, 2.0, -1.0]),
    )


@st.composite
def call_sequences(draw: st.DrawFn) -> list[fuzzcheck.Call]:
    """Five calls: each changes some facts of an earlier one (or takes fresh ones)."""
    seen: list[fuzzcheck.Call] = [(draw(fuzzcheck.call_specs()), fuzzcheck.GlobalState())]
    for k in range(4):
        spec, state = seen[draw(st.integers(0, len(seen) - 1))]
        change = draw(st.sampled_from(["same", "inputs", "state", "both"]))
        if change in ("inputs", "both"):
            spec = draw(fuzzcheck.call_specs())
        if change in ("state", "both"):
            state = draw(global_states())
        seen.append((replace(spec, seed=spec.seed + k + 1), state))
    return seen


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")  # programs call float() on grad tensors
@pytest.mark.parametrize("backend", BACKENDS)
def test_cached_graphs_only_run_where_eager_agrees(backend: str) -> None:
    @fuzzcheck.fuzz_settings(examples(backend))
    @given(source=fuzzgen.programs(), plan=call_sequences())
    def check(source: str, plan: list[fuzzcheck.Call]) -> None:
        problems = fuzzcheck.differential(source, plan, backend)
        assert not problems, fuzzcheck.repro(source, plan, backend, problems)

    check()
