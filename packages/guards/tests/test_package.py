"""Package-level promises: doctests run, the API is documented, imports stay local."""

from __future__ import annotations

import doctest
import importlib
import os
import pkgutil
import subprocess
import sys

import pytest
import torch

import ember.guards

MODULES = sorted(
    info.name for info in pkgutil.walk_packages(ember.guards.__path__, "ember.guards.")
)


@pytest.mark.parametrize("name", ["ember.guards", *MODULES])
def test_doctests(name: str) -> None:
    module = importlib.import_module(name)
    api = {n: getattr(ember.guards, n) for n in ember.guards.__all__}
    result = doctest.testmod(module, extraglobs={**api, "torch": torch}, report=True)
    assert result.failed == 0, f"{result.failed} doctest failures in {name}"


def test_every_public_callable_has_a_docstring_example() -> None:
    missing = [
        name
        for name in ember.guards.__all__
        if callable(getattr(ember.guards, name))
        and ">>>" not in (getattr(ember.guards, name).__doc__ or "")
    ]
    assert missing == []


def test_version_and_all() -> None:
    assert ember.guards.__version__ == "0.1.0"
    assert all(hasattr(ember.guards, name) for name in ember.guards.__all__)
    assert sorted(set(ember.guards.__all__)) == sorted(ember.guards.__all__)


def test_importing_guards_imports_no_other_ember_package() -> None:
    code = (
        "import sys, ember.guards; "
        "print(sorted(m for m in sys.modules if m.startswith('ember') "
        "and m != 'ember' and not m.startswith('ember.guards')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_pure_python_mode_gives_the_same_answers() -> None:
    code = """if True:
        import torch, ember.guards as eg
        assert not eg.NATIVE
        x, m = eg.Local("x"), eg.Local("m")
        guards = [eg.tensor_match(x, torch.zeros(2)), eg.module_state(m, torch.nn.ReLU())]
        g = eg.GuardSet(guards).compile(eg.FrameSpec("f", ("x", "m"), {}, {}))
        assert g.check(torch.ones(2), torch.nn.ReLU())
        assert not g.check(torch.ones(3), torch.nn.ReLU())
        print(g.explain_failure(torch.ones(3), torch.nn.ReLU()))
    """
    env = {**os.environ, "EMBER_GUARDS_PURE_PYTHON": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "x: size[0] expected 2, got 3"
