"""One kernel cache for the whole inductor test session, empty at its start."""

from __future__ import annotations

import os
from collections.abc import Iterator

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
