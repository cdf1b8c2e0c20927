"""The benchmark runner (benchmarks/run.py): its smoke run, its crash and wrong-answer reports.

The smoke run (``--quick``) starts one process per workload, configuration
and phase, as the full run does, at small sizes; it asserts what the run
found (rows, statuses, graphs, breaks), never how fast anything was.
"""

from __future__ import annotations

import dataclasses
import doctest
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
RUN = ROOT / "benchmarks" / "run.py"


def bench(*args: str, out: Path) -> tuple[subprocess.CompletedProcess[str], dict | None]:
    """Run run.py with ``args``; its output and the results it wrote (``None`` if none)."""
    proc = subprocess.run(
        [sys.executable, str(RUN), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,  # two test workers share the 2 cores of CI
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = out / "results.json"
    return proc, json.loads(written.read_text()) if written.exists() else None


@pytest.mark.slow
def test_quick_run_reports_every_workload_under_every_configuration(tmp_path):
    proc, results = bench("--quick", out=tmp_path)
    configs = results["meta"]["configs"]
    assert configs[0] == "eager" and "ember:eager" in configs and "torch:eager" in configs
    assert [c for c in configs if c.startswith("torch:")] == ["torch:eager"]
    assert results["meta"]["threads"] == 1 and results["meta"]["quick"]
    rows = {(r["workload"], r["config"]): r for r in results["results"]}
    assert set(rows) == {(w, c) for w in ("mlp-train", "graph-breaks-infer") for c in configs}
    for row in rows.values():
        assert row["status"] in ("ok", "wrong", "crash", "timeout"), row
        if row["status"] == "ok":
            assert row["median_ms"] > 0 and row["ratio"] > 0 and row["peak_mib"] is not None
        else:  # ember is the system under test: a failure is reported, with its error
            assert row["config"].startswith("ember:") and row["error"], row
        if row["config"] != "eager" and row["status"] == "ok":
            assert row["cold_s"] is not None and row["warm_s"] is not None, row
            assert row["graphs"] + row["breaks"] >= 1, row  # a graph, or a frame that ran eagerly
    assert rows["mlp-train", "eager"]["status"] == "ok"
    peer = rows["mlp-train", "torch:eager"]
    assert (peer["status"], peer["graphs"], peer["breaks"]) == ("ok", 1, 0)
    assert peer["overhead_us"] is not None and peer["max_error"] is not None
    peer_breaks = rows["graph-breaks-infer", "torch:eager"]
    assert (peer_breaks["graphs"], peer_breaks["breaks"]) == (3, 2)
    assert any("item()" in note for note in peer_breaks["notes"])
    assert proc.stdout.startswith("# ember benchmarks")
    assert (tmp_path / "results.md").read_text() == proc.stdout.rstrip("\n") + "\n"

    again = tmp_path / "again"
    saved = str(tmp_path / "results.json")
    compared, written = bench("--load", saved, "--compare", saved, out=again)
    assert "## Change" in compared.stdout and "ok → ok" in compared.stdout
    assert written is None, "--load runs nothing and writes nothing"


@pytest.mark.slow
def test_a_crashing_configuration_is_reported_not_dropped(tmp_path):
    _, results = bench(
        "--quick", "--workloads", "graph-breaks-infer", "--configs", "eager,torch:nonsense",
        out=tmp_path,
    )  # fmt: skip
    rows = {r["config"]: r for r in results["results"]}
    assert rows["eager"]["status"] == "ok"
    assert rows["torch:nonsense"]["status"] == "crash"
    assert "nonsense" in rows["torch:nonsense"]["error"]


def test_wrong_results_are_reported_with_the_error(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import run
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    want, got = tmp_path / "want.pt", tmp_path / "got.pt"
    torch.save({"results": [torch.ones(3)], "state": {}}, want)
    torch.save({"results": [torch.tensor([1.0, 1.5, 1.0])], "state": {}}, got)
    reference = {"status": "ok", "tensors": str(want)}
    verdict = run.check("infer", reference, {"status": "ok", "tensors": str(got)})
    assert verdict["status"] == "wrong" and verdict["max_error"] == 0.5
    assert "results" in verdict["error"]
    assert run.check("infer", reference, reference)["status"] == "ok"
    assert run.check("infer", None, reference)["status"] == "no reference"


def test_parameters_after_adam_steps_may_drift_but_gradients_may_not(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import run
        import workloads
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    bert, mlp = workloads.WORKLOADS["bert-train"], workloads.WORKLOADS["mlp-train"]
    assert bert.prepare(quick=True).drift(3) == pytest.approx(3e-3)  # AdamW, lr 1e-3
    assert mlp.prepare(quick=True).drift(3) == 0.0  # SGD: no drift allowed

    def verdict(state: float, grad: float, drift: float) -> str:
        want, got = tmp_path / "want.pt", tmp_path / "got.pt"
        base = {"results": [torch.ones(1)], "drift": drift}
        torch.save({**base, "state": {"b": torch.zeros(2)}, "grads": {"b": torch.zeros(2)}}, want)
        moved = {
            "state": {"b": torch.tensor([0.0, state])},
            "grads": {"b": torch.tensor([0.0, grad])},
        }
        torch.save({**base, **moved}, got)
        reference = {"status": "ok", "tensors": str(want)}
        return run.check("train", reference, {"status": "ok", "tensors": str(got)})["status"]

    assert verdict(state=1e-3, grad=0.0, drift=3e-3) == "ok"
    assert verdict(state=1e-3, grad=0.0, drift=0.0) == "wrong"
    assert verdict(state=0.0, grad=1e-3, drift=3e-3) == "wrong"  # gradients keep their tolerance


def test_transformers_workloads_run_eagerly_at_the_quick_size(tmp_path):
    pytest.importorskip("transformers", reason="a test dependency (noxfile REAL_MODEL_DEPS)")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import run
        import workloads
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    names = [name for name in workloads.WORKLOADS if name.startswith("hf-")]
    assert len(names) == 10  # gpt2, bert, llama, t5, vit; -infer and -train
    for name in names:
        prepared = workloads.WORKLOADS[name].prepare(quick=True)
        assert prepared.inputs and isinstance(prepared.inputs, dict), name
        first, second = prepared.step(), prepared.step()
        if prepared.mode == "train":
            assert first.ndim == 0 and torch.isfinite(first) and second < first, name
        else:  # a ModelOutput: the runner compares it field by field
            saved = tmp_path / f"{name}.pt"
            torch.save({"results": [first]}, saved)
            ok = {"status": "ok", "tensors": str(saved)}
            assert run.check("infer", ok, ok)["status"] == "ok"
            assert [n for n, *_ in run.pairs(first, second)] == [f"['{k}']" for k in first]


def test_a_workload_whose_package_is_missing_is_skipped_with_the_reason(monkeypatch):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import report
        import run
        import workloads
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    why = "transformers is not installed (a test/benchmark dependency)"
    family = dataclasses.replace(workloads.FAMILIES["hf-gpt2"], missing=lambda: why)
    monkeypatch.setitem(run.WORKLOADS, "hf-gpt2-infer", workloads.Workload(family, "infer"))
    args = run.parse_args(["--quick", "--workloads", "hf-gpt2-infer", "--configs", "eager"])
    results = run.run_all(args)
    assert results["results"] == [] and results["meta"]["skipped"] == {"hf-gpt2-infer": why}
    assert f"- hf-gpt2-infer: skipped: {why}" in report.markdown(results)


def test_benchmark_docstring_examples():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import models
        import models.hf
        import report
        import workloads
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    for module in (models, models.hf, report, workloads):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and result.attempted > 0, module.__name__


def test_the_whole_step_workload_is_the_training_step():
    """gpt-step (the whole step compiled as one function) computes what gpt-train does: the
    same losses, parameters and gradients from the same seed, run eagerly here."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import workloads
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    runs = []
    for name in ("gpt-train", "gpt-step"):
        prepared = workloads.WORKLOADS[name].prepare(quick=True)
        losses = [prepared.step() for _ in range(2)]
        runs.append((losses, prepared.state(), prepared.grads()))
    (loss_t, state_t, grads_t), (loss_s, state_s, grads_s) = runs
    torch.testing.assert_close(loss_s, loss_t)
    torch.testing.assert_close(state_s, state_t)
    assert grads_s and grads_s.keys() == grads_t.keys()
    torch.testing.assert_close(grads_s, grads_t)
