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

from ember.aotgraph.log import Channels

__all__ = ["LOG", "artifact", "enabled"]

_CHANNELS = Channels("ember.inductor")
#: The package's logger (facts: what was compiled, what ran eagerly and why).
LOG = _CHANNELS.log
enabled = _CHANNELS.enabled  # whether an artifact of this package is on
artifact = _CHANNELS.artifact  # log an artifact's text, built only when it is on
