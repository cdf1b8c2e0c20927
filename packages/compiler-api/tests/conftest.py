"""Fixtures shared by compiler-api's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import ember.compiler


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    """Every test starts and ends with no compiled code cached (``ember.compiler.reset()``).
    A test file that needs more (a cache folder of its own, warnings off) defines its own
    ``fresh``, which replaces this one."""
    ember.compiler.reset()
    yield
    ember.compiler.reset()
