"""The depth sweep (benchmarks/bench_depth.py): a real run of two depths, and its report.

Asserts what the sweep records (every point has a cold time, phases for ember, a slope per
configuration, pooled runs keep each point's least value), never how fast anything was.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from models.hf import missing


@pytest.fixture(scope="module")
def bench_depth() -> Any:
    import bench_depth  # benchmarks/ is on sys.path (the root conftest)

    return bench_depth


@pytest.mark.slow
@pytest.mark.skipif(missing() is not None, reason=str(missing()))
def test_sweep_times_each_depth_in_a_fresh_process(bench_depth: Any, tmp_path: Path) -> None:
    out = tmp_path / "depth.json"
    bench_depth.main(["--depths", "1,2", "--configs", "ember", "--out", str(out)])
    result = json.loads(out.read_text())
    points = result["runs"]["ember"]
    assert sorted(points) == ["1", "2"]
    for (proc,) in points.values():
        assert proc["cold_cpu_s"] > 0 and proc["cold_s"] > 0, proc
        assert proc["phases"]["lowering"] > 0 and proc["phases"]["C++ build"] > 0
        assert proc["thread_phases"]["aot trace"] > 0 and proc["thread_phases"]["capture"] > 0
        assert proc["gc"]["young"] > 0
    report = bench_depth.markdown(bench_depth.merged([result]))
    assert "| s/layer |" in report and "| 2 |" in report
    assert "ember's phases, thread CPU s" in report and "| aot trace |" in report


def test_pooled_runs_keep_each_points_least_value(bench_depth: Any) -> None:
    def run(config: str, seconds: list[float]) -> dict[str, Any]:
        depths = zip((2, 6, 12), seconds, strict=True)
        procs = {d: [{"cold_s": 2 * s, "cold_cpu_s": s}] for d, s in depths}
        return {"meta": {"model": "gpt2", "mode": "infer", "threads": 1}, "runs": {config: procs}}

    a = run("ember", [1.0, 3.0, 6.0])
    b = run("ember", [2.0, 2.0, 9.0])  # a second, noisier sweep of the same build
    c = run("torch", [10.0, 30.0, 60.0])
    pooled = bench_depth.merged([a, b, c])
    assert bench_depth.best(pooled, "cold_cpu_s")["ember"] == {2: 1.0, 6: 2.0, 12: 6.0}
    slopes = bench_depth.slopes(bench_depth.best(pooled, "cold_cpu_s"))
    assert slopes["torch"] == pytest.approx(5.0)
    report = bench_depth.markdown(pooled)
    assert "ember 2, torch 1" in report
    assert f"slope ratio ember / torch: {slopes['ember'] / 5.0:.3f}" in report


def test_the_phase_table_keeps_each_points_least_and_fits_a_slope(bench_depth: Any) -> None:
    def proc(aot: float) -> dict[str, Any]:
        return {"cold_s": 1.0, "cold_cpu_s": 1.0, "thread_phases": {"aot trace": aot},
                "gc": {"full": 0.0, "full_s": 0.0, "young": 3.0, "young_s": 0.01}}  # fmt: skip

    result = {
        "meta": {"model": "gpt2", "mode": "infer", "threads": 1},
        "runs": {"ember": {2: [proc(0.3), proc(0.2)], 12: [proc(0.7)]}},
    }
    lines = bench_depth.phase_table(result, "ember")
    assert "| aot trace | 0.200 | 0.700 | 0.0500 |" in lines
    assert "| gc: full | 0.000 | 0.000 | 0.0000 |" in lines
