"""The per-op microbenchmark (benchmarks/bench_ops.py): its smoke run and its wrong-answer rows.

Runs in-process at the quick size; asserts what the run found (statuses, which ops
were lowered, coverage bookkeeping), never how fast anything was.
"""

from __future__ import annotations

import pytest
import torch

import ember.inductor


@pytest.fixture(scope="module")
def bench_ops():
    import bench_ops  # benchmarks/ is on sys.path (the root conftest)

    return bench_ops


@pytest.mark.slow
def test_quick_run_checks_each_row_against_eager_and_times_it(bench_ops, tmp_path, capsys):
    out = tmp_path / "ops.json"
    results = bench_ops.main(
        ["--quick", "--no-torch", "--ops", "sin,add,sum_last", "--json", str(out)]
    )
    rows = {(r["op"], r["dtype"], r["layout"]): r for r in results["rows"]}
    assert set(rows) == {
        (op, dtype, layout)
        for op in ("sin", "add", "sum_last")
        for dtype in ("float32", "bfloat16")
        for layout in ("contig", "t")
    }
    for row in rows.values():
        assert row["status"] == "ok", row
        assert row["eager_us"] > 0 and row["ember_x"] > 0 and row["torch_x"] is None, row
        assert row["aten"] == [], row  # every op of these graphs became a kernel
    assert "aten.sin.default" in rows["sin", "float32", "contig"]["lowered"]
    assert "aten.sum.dim_IntList" in rows["sum_last", "bfloat16", "t"]["lowered"]
    assert "no case" in results["not_reached"]["aten.cos.default"]
    assert "decomposition" in results["not_reached"]["aten.mean.dim"]
    assert results["meta"]["threads"] == 1 and results["meta"]["torch"] == "none"
    assert out.exists()
    printed = capsys.readouterr().out
    assert printed.startswith("# ember per-op microbenchmark") and "| sin | float32 |" in printed
    assert bench_ops.main(["--load", str(out)]) == results


def test_a_mismatch_is_a_wrong_row_and_is_not_timed(bench_ops, monkeypatch):
    def off_by_one(fn, **kwargs):
        return lambda *args: fn(*args) + 1  # a compiler that gets every element wrong

    monkeypatch.setattr(bench_ops.ember.compiler, "compile", off_by_one)
    results = bench_ops.run(bench_ops.parse_args(["--quick", "--no-torch", "--ops", "sin"]))
    assert len(results["rows"]) == 4
    for row in results["rows"]:
        assert row["status"] == "WRONG" and "from float64" in row["error"], row
        assert row["eager_us"] is None and row["ember_x"] is None
    assert "## Wrong or failing (4)" in bench_ops.report(results)


def test_summation_order_is_not_a_mismatch(bench_ops):
    # a float32 sum over 1024 values in another order misses assert_close's default
    # tolerance (1.3e-6 relative); against a float64 sum it is as close as eager's
    x = torch.randn(1024, 1024)
    reordered = x.view(1024, 8, 128).sum(-1).sum(-1)
    bench_ops._close(reordered, x.sum(-1), lambda x: x.sum(-1), [x])


def test_every_lowered_op_has_a_case_or_a_reason(bench_ops):
    calls = " ".join(case.call for case in bench_ops.CASES.values())
    for op, reason in bench_ops.LEFT_OUT.items():
        assert reason and op in {str(k) for k in ember.inductor.LOWERINGS}, op
    # the aten ops a user calls directly, by their packet name (prims come from decompositions)
    for op in ("sin", "cos", "erf", "gather", "embedding", "addmm", "constant_pad_nd"):
        assert op in calls or op.replace("constant_pad_nd", "F.pad") in calls, op
    assert len(bench_ops.CASES) == len(set(bench_ops.CASES))
    assert all(name in bench_ops.CASES for name in bench_ops.QUICK)
