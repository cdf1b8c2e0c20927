"""``import ember.compiler`` stays light: a fresh process that imports it (and loads no pack)
has not imported sympy, capture's translator or inductor's lowerings, which the first
translation or inductor compile imports when it needs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = (
    "sympy",
    "torch.fx.experimental.symbolic_shapes",
    "ember.capture.translate",
    "ember.capture.tracer",
    "ember.capture.calls",
    "ember.inductor.lowering",
    "ember.inductor.compile",
    "ember.aotgraph.trace",
)


def run(code: str) -> dict:
    """Run ``code`` in a fresh interpreter (this one's environment); return its JSON line."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_import_ember_compiler_imports_no_tracing_machinery():
    got = run(
        "import json, sys, torch, ember.compiler\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    assert got == [], got


# debugging tools a run that does not ask for them never needs (a pack's warm start pays
# ~8 ms of CPU for importing them)
TOOLS = (
    "ember.compiler.profiler",
    "ember.compiler.replay_record",
    "ember.compiler.repro",
    "ember.compiler.repro_script",
    "ember.compiler.minifier",
)


def test_debugging_tools_are_imported_where_used():
    got = run(
        "import json, sys, torch, ember.compiler\n"
        "f = ember.compiler.compile(lambda x: x + 1, backend='eager')\n"
        "f(torch.ones(2))\n"
        f"before = [m for m in {TOOLS!r} if m in sys.modules]\n"
        "from ember.compiler.profiler import CompilationProfiler\n"
        "from ember.compiler.replay_record import replay\n"
        "from ember.compiler.repro import AccuracyError\n"
        "print(json.dumps([before, ember.compiler.CompilationProfiler is CompilationProfiler,\n"
        "    ember.compiler.replay is replay, ember.compiler.AccuracyError is AccuracyError]))"
    )
    assert got == [[], True, True, True], got


PACKAGES = ["ember.compiler", "ember.capture", "ember.aotgraph", "ember.inductor"]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_resolves(package):
    got = run(
        f"import importlib, json; m = importlib.import_module({package!r})\n"
        "print(json.dumps([n for n in m.__all__ if getattr(m, n, None) is None]))"
    )
    assert got == [], got


def test_a_lazy_name_is_the_object_its_module_defines():
    got = run(
        "import json, ember.compiler, ember.inductor, ember.aotgraph\n"
        "from ember.capture.calls import allow_in_graph\n"
        "from ember.inductor.lowering import LOWERINGS\n"
        "from ember.aotgraph.api import aot_compile\n"
        "print(json.dumps([ember.compiler.allow_in_graph is allow_in_graph,\n"
        "    ember.inductor.LOWERINGS is LOWERINGS,\n"
        "    ember.aotgraph.aot_compile is aot_compile]))"
    )
    assert got == [True, True, True]


def test_an_unknown_name_is_an_attribute_error():
    import ember.compiler

    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        ember.compiler.not_a_name  # noqa: B018


def test_compile_after_a_light_import_translates():
    # the translator (and its polyfills) is imported by the first frame that needs it
    got = run(
        "import json, sys, torch, ember.compiler\n"
        "f = ember.compiler.compile(lambda x: torch.relu(x) * 2, backend='eager')\n"
        "x = torch.randn(4)\n"
        "same = bool(torch.equal(f(x), torch.relu(x) * 2))\n"
        "print(json.dumps([same, f.stats.graphs, 'ember.capture.translate' in sys.modules]))"
    )
    assert got == [True, 1, True]


def test_compiled_autograd_stays_the_class_after_its_module_is_imported() -> None:
    """Importing the module behind a lazy name (as doctest collection does) must not replace
    the name: ``ember.compiler.compiled_autograd`` is the context manager, and its module
    has another name."""
    import importlib

    import ember.compiler

    importlib.import_module("ember.compiler.autograd_compiled")
    assert isinstance(ember.compiler.compiled_autograd, type)
    with ember.compiler.compiled_autograd(compiler="eager") as ca:
        pass
    assert ca.stats.compiles == 0
