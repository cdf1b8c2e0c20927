"""Logging of ember.inductor: its logger and its artifact channels.

Standard :mod:`logging`: facts go to the logger ``ember.inductor``; each artifact (a piece of
text a person reads on its own) goes to the child logger ``ember.inductor.<name>``, at DEBUG.
Artifacts of this package:
``schedule`` (kernels, fusion and memory plan of a graph), ``output_code`` (the
generated C++ translation unit) and ``perf`` (seconds per phase of a graph).
``ember.compiler.set_logs`` (or ``EMBER_LOGS``) turns them on; this module never imports
compiler-api. An artifact's text is built only when its channel is on.

>>> artifact("output_code", lambda: "void kernel0() {}")  # off: not called
"""

from __future__ import annotations

import logging
from collections.abc import Callable

__all__ = ["LOG", "artifact", "enabled"]

#: The package's logger (facts: what was compiled, what ran eagerly and why).
LOG = logging.getLogger("ember.inductor")


def enabled(name: str) -> bool:
    """Whether artifact ``name`` of this package would be logged now.

    >>> enabled("no_such_artifact")
    False
    """
    return logging.getLogger(f"ember.inductor.{name}").isEnabledFor(logging.DEBUG)


def artifact(name: str, text_fn: Callable[[], str]) -> None:
    """Log ``text_fn()`` on channel ``ember.inductor.<name>`` if it is on; else do nothing
    (``text_fn`` is not called: no formatting cost when off).

    >>> artifact("no_such_artifact", lambda: 1 / 0)  # off: never called
    """
    logger = logging.getLogger(f"ember.inductor.{name}")
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s", text_fn())
