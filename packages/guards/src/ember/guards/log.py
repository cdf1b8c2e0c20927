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

__all__ = ["LOG", "artifact", "enabled"]

#: The package's logger (facts: what was compiled, what ran eagerly and why).
LOG = logging.getLogger("ember.guards")


def enabled(name: str) -> bool:
    """Whether artifact ``name`` of this package would be logged now.

    >>> enabled("no_such_artifact")
    False
    """
    return logging.getLogger(f"ember.guards.{name}").isEnabledFor(logging.DEBUG)


def artifact(name: str, text_fn: Callable[[], str]) -> None:
    """Log ``text_fn()`` on channel ``ember.guards.<name>`` if it is on; else do nothing
    (``text_fn`` is not called: no formatting cost when off).

    >>> artifact("no_such_artifact", lambda: 1 / 0)  # off: never called
    """
    logger = logging.getLogger(f"ember.guards.{name}")
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s", text_fn())
