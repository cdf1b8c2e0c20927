"""Test settings shared by every ember package's tests.

Each package's ``tests/test_docs.py`` uses the ``doctests`` fixture to run the
docstring examples of every module in its package, so a public example that
stops working fails CI.
"""

from __future__ import annotations

import atexit
import doctest
import importlib
import os
import pkgutil
import shutil
import sys
import tempfile
from collections.abc import Callable

import pytest


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# IR checkers run after every pass in tests (see STYLE.md, rule 10).
os.environ.setdefault("EMBER_CHECK", "1")

# Triton decides once, when it is first imported, whether it runs kernels under its
# interpreter. Without a GPU the Triton printer's tests need the interpreter, and any test
# may import triton first (torch.compile, the peer some tests measure against, does), so
# the whole run sets it before anything imports triton. With a GPU it stays unset, and the
# CUDA tests compile for the GPU.
if "TRITON_INTERPRET" not in os.environ and not _has_cuda():
    os.environ["TRITON_INTERPRET"] = "1"

# Compiled kernels go to a cache of the test run's own, empty at its start, never the
# user's (a package's conftest may give its tests a narrower one).
if "EMBER_CACHE_DIR" not in os.environ:
    os.environ["EMBER_CACHE_DIR"] = tempfile.mkdtemp(prefix="ember-tests-")
    atexit.register(shutil.rmtree, os.environ["EMBER_CACHE_DIR"], ignore_errors=True)

# The model zoo (benchmarks/models) is shared by tests, the demo and the benchmarks.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "benchmarks"))


def _modules(package: str) -> list[str]:
    pkg = importlib.import_module(package)
    names = [package]
    for info in pkgutil.walk_packages(pkg.__path__, prefix=package + "."):
        names.append(info.name)
    return names


@pytest.fixture
def doctests() -> Callable[[str], int]:
    """Run the doctests of every module of a package; fail on any failure."""

    def run(package: str) -> int:
        attempted = 0
        for name in _modules(package):
            module = importlib.import_module(name)
            result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
            assert result.failed == 0, f"{result.failed} doctest(s) failed in {name}"
            attempted += result.attempted
        return attempted

    return run
