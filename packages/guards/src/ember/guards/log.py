"""Logging of ember.guards: its logger and its artifact channels.

Standard :mod:`logging`: facts go to the logger ``ember.guards``; each artifact (a piece of
text a person reads on its own) goes to the child logger ``ember.guards.<name>``, at DEBUG.
Artifacts of this package:
``guards`` (each guard set an entry is made with, with the source and line that
installed each guard) and ``recompiles`` (which guard of which entry failed, and where).
``ember.compiler.set_logs`` (or ``EMBER_LOGS``) turns them on; this module never imports
compiler-api. An artifact's text is built only when its channel is on.

>>> artifact("guards", lambda: "x: tensor float32[8]")  # off: not called
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["LOG", "Channels", "artifact", "enabled"]


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


_CHANNELS = Channels("ember.guards")
#: The package's logger (facts: what was compiled, what ran eagerly and why).
LOG = _CHANNELS.log
enabled = _CHANNELS.enabled  # whether an artifact of this package is on
artifact = _CHANNELS.artifact  # log an artifact's text, built only when it is on
