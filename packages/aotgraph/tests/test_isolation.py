"""ember-aotgraph works installed alone: a wheel of it, torch and networkx, nothing else of ember.

The wheel is built from a copy of the package and installed into a scratch
directory; a fresh interpreter imports it from there with every other ember
distribution made unimportable, and compiles a function with a custom compiler.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent(
    """
    import importlib.abc, sys
    TARGET = sys.argv[1]
    OTHERS = ("ember.capture", "ember.compiler", "ember.guards", "ember.inductor")

    class Uninstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.startswith(OTHERS):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, Uninstalled())
    sys.path.insert(0, TARGET)
    import torch
    import ember.aotgraph
    from ember.aotgraph import aot_compile

    assert ember.aotgraph.__file__.startswith(TARGET), ember.aotgraph.__file__
    compiled_ops = []

    def my_compiler(gm, example_inputs):
        compiled_ops.append(len(gm.graph.nodes))
        return gm

    def f(x, w):
        return torch.tanh(x @ w).sum()

    x, w = torch.randn(4, 3), torch.randn(3, 2, requires_grad=True)
    g = aot_compile(torch.fx.symbolic_trace(f), [x, w], fw_compiler=my_compiler)
    g(x, w).backward()
    torch.testing.assert_close(w.grad, torch.autograd.grad(f(x, w), w)[0])
    assert len(compiled_ops) == 2
    assert not [m for m in sys.modules if m.startswith(OTHERS)]
    print("ok")
    """
)


@pytest.mark.slow
def test_installed_alone_compiles_with_a_custom_compiler(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(PACKAGE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "tests"))
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, source], check=True
    )
    (wheel,) = wheels.glob("ember_aotgraph-*.whl")
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--target", target, wheel], check=True
    )
    (metadata,) = target.glob("ember_aotgraph-*.dist-info/METADATA")
    requires = [
        line for line in metadata.read_text().splitlines() if line.startswith("Requires-Dist")
    ]
    assert sorted(r.split()[1].split("<")[0].split(">")[0] for r in requires) == [
        "networkx",
        "torch",
    ]
    script = tmp_path / "alone.py"
    script.write_text(SCRIPT)
    result = subprocess.run([sys.executable, script, target], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
