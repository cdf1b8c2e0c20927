"""ember.compiler's own settings section, ``config.debug``.

The troubleshooting tools keep their settings here (logging, replay records, the
minifier, the HTML report): each adds its fields to :class:`DebugSettings`, and the
one place it reads its ``EMBER_*`` variables is the field's ``env``.

>>> sorted(section.describe())
['warn_modes']
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.guards.settings import Section, setting

__all__ = ["DebugSettings", "section"]


@dataclass(frozen=True, slots=True)
class DebugSettings:
    """Settings of ember.compiler's troubleshooting tools (more fold in here)."""

    warn_modes: bool = setting(
        True,
        "say once (a UserWarning) when a compile mode has no effect on this machine or backend",
        env="EMBER_WARN_MODES",
    )


#: ember.compiler's own settings (``ember.compiler.config.debug``).
section: Section[DebugSettings] = Section("debug", DebugSettings)
