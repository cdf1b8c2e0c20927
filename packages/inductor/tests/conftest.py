"""One kernel cache for the whole inductor test session, empty at its start; the
``interpreted_triton`` mark (tests of the Triton printer on CPU tensors) and the ``options``
fixture that runs a test through both printers. A marked test runs under the interpreter,
from torch's seed 0."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

_REASON: str | None = None


def _interpreter_missing() -> str | None:
    """Why Triton's interpreter is unavailable here, or ``None``. Triton decides on its first
    import whether it interprets; without a GPU the root conftest sets ``TRITON_INTERPRET=1``
    before anything imports it."""
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton
    except ImportError:
        return "triton is not importable"
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before
    if type(triton.language.sum).__name__ != "InterpretedFunction":
        return "triton was imported before TRITON_INTERPRET=1 (its library is compiled for GPUs)"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    global _REASON
    if item.get_closest_marker("interpreted_triton") is None:
        return
    if _REASON is None:
        _REASON = _interpreter_missing() or ""
    if _REASON:
        pytest.skip(_REASON)


@pytest.fixture(autouse=True)
def _interpreted(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked ``interpreted_triton`` runs its kernels under the interpreter (Triton
    reads TRITON_INTERPRET per kernel) from torch's seed 0."""
    if request.node.get_closest_marker("interpreted_triton") is None:
        return
    import torch

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.manual_seed(0)


# compile options of the Triton printer on CPU tensors, under Triton's interpreter
TRITON = {"cpu_backend": "triton", "graph_cache": False}


@pytest.fixture(params=["cpp", pytest.param("triton", marks=pytest.mark.interpreted_triton)])
def options(request: pytest.FixtureRequest) -> Any:
    """A test that takes ``options`` runs once per printer: C++ (None, the defaults), and
    Triton under its interpreter (``TRITON``; Triton reads TRITON_INTERPRET per kernel)."""
    return None if request.param == "cpp" else TRITON


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = str(tmp_path_factory.mktemp("ember_cache"))
    old = os.environ.get("EMBER_CACHE_DIR")
    os.environ["EMBER_CACHE_DIR"] = path
    os.environ["EMBER_CHECK"] = "1"
    yield path
    if old is None:
        os.environ.pop("EMBER_CACHE_DIR", None)
    else:
        os.environ["EMBER_CACHE_DIR"] = old


@pytest.fixture
def in_threads() -> Callable[[Callable[[int], None]], None]:
    """Run ``work(seed)`` on 4 threads at once; re-raise the first failure in the test.

    An assertion failing on a worker thread would otherwise only print a warning."""

    def run(work: Callable[[int], None]) -> None:
        errors: list[BaseException] = []

        def guarded(seed: int) -> None:
            try:
                work(seed)
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=guarded, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[0]

    return run
