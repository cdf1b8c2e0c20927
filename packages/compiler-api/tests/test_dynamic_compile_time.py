"""Compile time of dynamic graphs (issue 18): what a symbolic compile does that a static one
does not, kept to what the sizes need.

A fresh process compiles with ``dynamic=True`` without importing torch's own compiler
stack for the ShapeEnv's source locations.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

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
