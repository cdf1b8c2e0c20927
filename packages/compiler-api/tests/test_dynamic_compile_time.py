"""Compile time of dynamic graphs (issue 18): what a symbolic compile does that a static one
does not, kept to what the sizes need.

A fresh process compiles with ``dynamic=True`` without importing torch's own compiler
stack for the ShapeEnv's source locations, and a warm one (disk caches kept) does not
trace the symbolic graph again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

PROGRAM = textwrap.dedent(
    """
    import sys, torch
    import ember.compiler

    def f(x, y):
        return (x @ y).relu().sum(-1)

    fast = ember.compiler.compile(f, backend="{backend}", dynamic=True)
    for n in (3, 5):
        x, y = torch.randn(n, 4), torch.randn(4, 6)
        torch.testing.assert_close(fast(x, y), f(x, y))
    assert fast.stats.graphs == 1, fast.stats.graphs
    print([m for m in ("torch._inductor.sizevars", "torch.export._trace") if m in sys.modules])
    """
)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_symbolic_compile_does_not_import_torch_compiler_stack(backend: str) -> None:
    # torch's ShapeEnv finds a user line for each symbol by walking the stack past a list
    # of framework files; building that list imports torch._inductor (0.25 s a process)
    code = PROGRAM.format(backend=backend)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


WARM = textwrap.dedent(
    """
    import torch
    import ember.compiler

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 6)

        def forward(self, x):
            b, t, c = x.shape
            h = self.lin(x).view(b, t, 2, c // 2).transpose(1, 2)
            return (h @ h.transpose(-1, -2)).softmax(-1).sum((1, 2))

    torch.manual_seed(0)
    net = Net()
    fast = ember.compiler.compile(net, backend="{backend}", dynamic=True)
    with torch.no_grad():
        for b, t in ((3, 5), (4, 7), (2, 9)):
            x = torch.randn(b, t, 6)
            torch.testing.assert_close(fast(x), net(x))
    assert fast.stats.graphs == 1, fast.stats.graphs
    print(sorted(ember.compiler.compile_times().phases))
    """
)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_warm_symbolic_compile_does_not_trace_again(backend: str, tmp_path: Any) -> None:
    # the second process finds the symbolic graph's trace (and inductor its kernels) on disk
    env = {**os.environ, "EMBER_CACHE_DIR": str(tmp_path), "EMBER_PROGRESS": "0"}
    phases = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", WARM.format(backend=backend)],
            capture_output=True, text=True, timeout=300, check=False, env=env,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        phases.append(out.stdout.strip().splitlines()[-1])
    assert "aot trace" in phases[0] and "aot trace" not in phases[1], phases
    assert "lowering" not in phases[1], phases
