"""A compiled frame's guard explainer is built only when a guard fails: compiling and cache
hits never build it, and a recompile says in words which guard failed, exactly as the
eagerly built explainer did, for an entry compiled here and for one loaded from a pack."""

from __future__ import annotations

import pytest
import torch

import ember.compiler
import ember.guards
from ember.capture import prebuilt

SCALE = 2.0


def step(x, mode, cfg):
    if mode == "double":
        return x * SCALE * cfg["k"]
    return x + len(cfg)


GOOD = (torch.ones(8, 4), "double", {"k": 2})

# what changed since the entry was made -> the recompile's reason, as the eagerly built
# explainer worded it (main at bc3f77c)
CASES = {
    "size": ((torch.ones(12, 4), "double", {"k": 2}), "x: size[0] expected 8, got 12"),
    "constant": ((torch.ones(8, 4), "half", {"k": 2}), "mode: expected 'double', got 'half'"),
    "keys": ((torch.ones(8, 4), "double", {"k": 2, "j": 1}),
             "cfg: keys expected ['k'], got ['k', 'j']"),
    "global": ("SCALE", "G['SCALE']: expected 2.0, got 3.0"),
    "dtype": ((torch.ones(8, 4, dtype=torch.float64), "double", {"k": 2}),
              "x: dtype expected torch.float32, got torch.float64"),
}  # fmt: skip


@pytest.fixture(autouse=True)
def _fresh():
    ember.compiler.reset()
    yield
    ember.compiler.reset()
    prebuilt.clear()


def _call_changed(f, case: str) -> None:
    global SCALE
    changed, _ = CASES[case]
    if changed == "SCALE":
        SCALE = 3.0
        try:
            torch.testing.assert_close(f(*GOOD), step(*GOOD))
        finally:
            SCALE = 2.0
    else:
        torch.testing.assert_close(f(*changed), step(*changed))


def _entries():
    (cache,) = [c for c in ember.guards.all_caches() if c.name.startswith("step (")]
    return cache.entries


def _check(f, case: str) -> None:
    torch.testing.assert_close(f(*GOOD), step(*GOOD))
    (entry,) = _entries()
    assert entry.guards._explainer is None  # compiled (or loaded) and hit: never built
    _call_changed(f, case)
    assert [r.failures for r in ember.guards.recompile_reasons()] == [(CASES[case][1],)]
    assert entry.guards._explainer is not None  # the miss asked why


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_recompile_explains_the_failed_guard_as_before(case):
    _check(ember.compiler.compile(step, backend="eager", dynamic=False), case)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_packed_entry_explains_its_failed_guard_as_before(case, tmp_path):
    f = ember.compiler.compile(step, backend="eager", dynamic=False)
    f(*GOOD)
    pack = tmp_path / "step.ember"
    assert ember.compiler.save_artifacts(pack).entries == 1
    ember.compiler.reset()
    assert ember.compiler.load_artifacts(pack).entries == 1
    f = ember.compiler.compile(step, backend="eager", dynamic=False)
    _check(f, case)
    assert f.stats.prebuilt and f.stats.graphs == 1  # the entry came from the pack
