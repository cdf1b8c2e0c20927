"""ember.aotgraph's settings: the one place ember.aotgraph reads the environment.

ember.inductor keeps its kernels under the same cache root (:attr:`AotSettings.cache_dir`).

>>> section.get().cache
True
>>> with section.patch(cache=False):
...     section.get().cache
False
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ember.aotgraph.section import Section, setting

__all__ = ["AotSettings", "cache_root", "section"]


@dataclass(frozen=True, slots=True)
class AotSettings:
    """What ember.aotgraph reads when it traces and caches a graph."""

    cache: bool = setting(
        True, "keep traced forward/backward graphs on disk and reuse them", env="EMBER_AOT_CACHE"
    )
    cache_dir: str = setting(
        "",
        "root of ember's disk caches (aotgraph/ and inductor/ under it); empty:"
        " $XDG_CACHE_HOME/ember, else ~/.cache/ember",
        env="EMBER_CACHE_DIR",
    )
    trace_memo: bool = setting(
        True,
        "trace each aten op once per argument layout (static sizes) and stamp its recorded"
        " nodes for the repeats: repeated layers traced once (ember.aotgraph.opmemo)",
        env="EMBER_AOT_TRACE_MEMO",
    )
    check: bool = setting(
        False,
        "run the checkers after each pass (graphs, loop IR, caches; slow; tests set it)",
        env="EMBER_CHECK",
    )


#: ember.aotgraph's settings (``ember.compiler.config.aotgraph``).
section: Section[AotSettings] = Section("aotgraph", AotSettings)


def cache_root() -> Path:
    """The root of ember's disk caches (the ``cache_dir`` setting, else the user's cache).

    >>> with section.patch(cache_dir="/tmp/x"):
    ...     str(cache_root())
    '/tmp/x'
    """
    root = section.get().cache_dir
    if root:
        return Path(root)
    user = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(user) / "ember"
