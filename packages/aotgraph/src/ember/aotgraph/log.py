"""Logging of ember.aotgraph: its logger and its artifact channels.

Standard :mod:`logging`: facts go to the logger ``ember.aotgraph``; each artifact (a piece of
text a person reads on its own) goes to the child logger ``ember.aotgraph.<name>``, at DEBUG.
Artifacts of this package:
``aot_graphs`` (the forward, backward or inference graph handed to the caller's
compilers).
``ember.compiler.set_logs`` (or ``EMBER_LOGS``) turns them on; this module never imports
compiler-api. An artifact's text is built only when its channel is on.

>>> artifact("aot_graphs", lambda: "def forward(self, primals_1): ...")  # off: not called
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["LOG", "Channels", "artifact", "current_graph", "enabled", "graph"]


@dataclass(frozen=True)
class Channels:
    """One package's logger ``ember.<pkg>`` (facts) and its artifact channels, the child
    loggers ``ember.<pkg>.<name>`` (a text a person reads on its own, at DEBUG).

    >>> ch = Channels("ember.example")
    >>> ch.enabled("graph_code"), ch.log.name
    (False, 'ember.example')
    >>> ch.artifact("graph_code", lambda: 1 / 0)  # off: never called
    """

    package: str

    @property
    def log(self) -> logging.Logger:
        return logging.getLogger(self.package)

    def enabled(self, name: str) -> bool:
        """Whether artifact ``name`` would be logged now."""
        return logging.getLogger(f"{self.package}.{name}").isEnabledFor(logging.DEBUG)

    def artifact(self, name: str, text_fn: Callable[[], str]) -> None:
        """Log ``text_fn()`` on channel ``<pkg>.<name>`` if it is on; else do nothing
        (``text_fn`` is not called: no formatting cost when off)."""
        logger = logging.getLogger(f"{self.package}.{name}")
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s", text_fn())


_CHANNELS = Channels("ember.aotgraph")
#: The package's logger (facts: what was compiled, what ran eagerly and why).
LOG = _CHANNELS.log
enabled = _CHANNELS.enabled  # whether an artifact of this package is on
artifact = _CHANNELS.artifact  # log an artifact's text, built only when it is on


_current: list[tuple[int, int, str]] = []  # the graphs being compiled now, innermost last


@contextlib.contextmanager
def graph(n: int, of: int, what: str) -> Iterator[None]:
    """The block compiles graph ``n`` of ``of`` (``what``: forward, backward, inference);
    logged on ``ember.aotgraph`` at DEBUG, and shown by ember.compiler's progress lines.

    >>> with graph(1, 2, "forward"):
    ...     current_graph()
    (1, 2, 'forward')
    """
    entry = (n, of, what)
    LOG.debug("compiling graph %d of %d (%s)", n, of, what)
    _current.append(entry)
    try:
        yield
    finally:
        _current.remove(entry)


def current_graph() -> tuple[int, int, str] | None:
    """``(n, of, what)`` of the graph being compiled now, or None.

    >>> current_graph() is None
    True
    """
    return _current[-1] if _current else None
