"""The graph cache for Triton graphs (``triton_cache.py``), under Triton's interpreter: a
warm compile in a new process skips lowering, scheduling and printing and imports the
cached module; a record whose module is gone compiles again.

Triton must be imported with ``TRITON_INTERPRET=1`` set (see ``test_triton.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.interpreted_triton  # skipped where no interpreter (conftest)

# one process: compile a softmax and a transposed add (printer: Triton's interpreter), check
# them against eager, and print whether the graph cache served them; with "cold-forbidden",
# lowering and printing raise (a warm process must not reach them)
SCRIPT = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from torch.fx.experimental.proxy_tensor import make_fx
import ember.inductor.compile as compile_module
from ember.inductor import compile_graph

if sys.argv[1] == "cold-forbidden":
    def forbidden(*args, **kwargs):
        raise AssertionError("lowered or printed in a warm process")
    compile_module._generate = forbidden
    compile_module.wrapper_triton.codegen = forbidden

fn = lambda x, y: (torch.softmax(x, -1) * 2, x + y.t(), x.sum())
torch.manual_seed(0)
x, y = torch.randn(37, 50), torch.randn(50, 37)
compiled = compile_graph(make_fx(fn)(x, y), [x, y], {"cpu_backend": "triton"})
assert compiled.target is not None and compiled.target.printer == "triton", compiled
# the sum of 1,850 numbers adds in another order than eager's: near 0 it can miss
# assert_close's float32 default (atol 1e-5) by a rounding of the larger partial sums
for got, want in zip(compiled(x, y), fn(x, y), strict=True):
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
x2, y2 = torch.randn(37, 50), torch.randn(50, 37)
for got, want in zip(compiled(x2, y2), fn(x2, y2), strict=True):
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
print("hit" if compiled.cache_hit else "miss", compiled.schedule is None)
"""


def _process(cache: Path, mode: str) -> str:
    env = {**os.environ, "EMBER_CACHE_DIR": str(cache), "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip()


def test_a_warm_process_loads_the_cached_module_without_lowering(tmp_path: Path) -> None:
    assert _process(tmp_path, "cold") == "miss False"
    (record,) = (tmp_path / "inductor" / "graphs").glob("*/*.json")
    module = json.loads(record.read_text())["module"]
    assert (tmp_path / "inductor" / "triton" / module[:2] / f"{module}.py").is_file()
    assert _process(tmp_path, "cold-forbidden") == "hit True"


def test_a_record_whose_module_is_gone_compiles_again(tmp_path: Path) -> None:
    assert _process(tmp_path, "cold") == "miss False"
    for module in (tmp_path / "inductor" / "triton").glob("*/*.py"):
        module.unlink()
    assert _process(tmp_path, "cold") == "miss False"  # compiled again, module rewritten
    assert _process(tmp_path, "cold-forbidden") == "hit True"
