"""max_autotune: every knob it times changes the generated code, and the choice it keeps
runs correctly (the thread count and the matmul path, which lowers the graph again)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import autotune
from ember.inductor.compile import compile_graph
from ember.inductor.knobs import Knobs, knobs


def linear_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(torch.addmm(b, x, w)) + x.sum()  # an addmm, and kernels after it


def inputs() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=gen) for s in ((32, 48), (48, 48), (48,))]


def compiled_with(
    monkeypatch: pytest.MonkeyPatch,
    where: Path,
    choices: tuple[Knobs, ...],
    seconds: Callable[[Any], float],
) -> Any:
    """``linear_gelu`` compiled under max_autotune, timing ``choices`` by ``seconds(trial)``
    (in a fresh cache: the choice is remembered on disk)."""
    monkeypatch.setenv("EMBER_CACHE_DIR", tempfile.mkdtemp(dir=where))
    monkeypatch.setattr(autotune, "candidates", lambda: choices)
    monkeypatch.setattr(autotune, "seconds_per_call", lambda call: seconds(call.func))
    args = inputs()
    options = {"max_autotune": True, "graph_cache": False}
    compiled = compile_graph(make_fx(linear_gelu)(*args), args, options)
    torch.testing.assert_close(compiled(*args), linear_gelu(*args))
    return compiled


def test_the_matmul_path_lowers_again_and_the_chosen_lowering_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def aten_is_faster(trial: Any) -> float:
        return 0.5 if "aten.addmm" in str(trial.schedule) else 1.0

    compiled = compiled_with(monkeypatch, tmp_path, (Knobs(), Knobs(addmm="aten")), aten_is_faster)
    assert "extern aten.addmm.default" in str(compiled.schedule)
    compiled = compiled_with(monkeypatch, tmp_path, (Knobs(), Knobs(addmm="aten")), lambda t: 1.0)
    assert "extern aten.mm.default" in str(compiled.schedule)  # a tie keeps the default


def test_a_thread_count_reaches_every_parallel_loop(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def fewer_threads_win(trial: Any) -> float:
        return 0.5 if "num_threads(2)" in trial.source else 1.0

    choices = (Knobs(parallel_min_work=1), Knobs(parallel_min_work=1, threads=2))
    compiled = compiled_with(monkeypatch, tmp_path, choices, fewer_threads_win)
    pragmas = [ln for ln in compiled.source.splitlines() if "omp parallel" in ln]
    assert pragmas and all("num_threads(2)" in ln for ln in pragmas)


def test_the_winners_of_each_knob_are_timed_together(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def both_win(trial: Any) -> float:
        aten, few = "aten.addmm" in str(trial.schedule), "num_threads(2)" in trial.source
        return 1.0 - 0.3 * aten - 0.2 * few

    base = Knobs(parallel_min_work=1)
    choices = (
        base,
        Knobs(parallel_min_work=1, addmm="aten"),
        Knobs(parallel_min_work=1, threads=2),
    )
    compiled = compiled_with(monkeypatch, tmp_path, choices, both_win)
    assert "extern aten.addmm.default" in str(compiled.schedule)
    assert "num_threads(2)" in compiled.source


def test_candidates_vary_one_knob_each_and_halve_threads_only_where_still_parallel() -> None:
    eight = autotune.candidates(threads=8)
    assert eight[0] == Knobs() and len(set(eight)) == len(eight)
    assert Knobs(threads=4) in eight and Knobs(addmm="aten") in eight
    assert all(k.threads == 0 for k in autotune.candidates(threads=2))
    with pytest.raises(ValueError, match="addmm path 'blas'"):
        Knobs(addmm="blas")
    with knobs(Knobs(threads=3)):
        assert Knobs(threads=3).num_threads == " num_threads(3)"
