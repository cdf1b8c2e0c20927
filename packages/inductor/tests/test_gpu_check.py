"""benchmarks/gpu_check.py, the GPU check (benchmarks/gpu_run.sh runs it on a CUDA machine):
its tables, and what it does on a machine without CUDA (CI's)."""

from __future__ import annotations

import pytest
import torch

gpu_check = pytest.importorskip("gpu_check")  # benchmarks/ is on the path (root conftest)


def test_tables_mark_pass_and_fail_and_format_numbers() -> None:
    rows = [{"graph": "g", "ok": True, "ember ms": 0.12345, "max abs err": 1.5e-7}]
    rows.append({"graph": "h", "ok": False})
    lines = gpu_check.markdown(rows, ["graph", "ok", "ember ms", "max abs err"], "{:.3f}",
                               {"max abs err": "{:.3g}"})  # fmt: skip
    assert lines[2] == "| g | PASS | 0.123 | 1.5e-07 |"
    assert lines[3] == "| h | FAIL |  |  |"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_it_checks_nothing_and_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main() == 0
    assert "no CUDA device: nothing to check" in capsys.readouterr().out
