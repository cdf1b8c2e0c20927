"""One kernel cache for the whole inductor test session, empty at its start."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator

import pytest


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
