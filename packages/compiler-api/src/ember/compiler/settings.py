"""ember.compiler's own settings section, ``config.debug``.

The troubleshooting tools keep their settings here (logging, replay records, the
minifier, the HTML report): each adds its fields to :class:`DebugSettings`, and the
one place it reads its ``EMBER_*`` variables is the field's ``env``.

>>> 'warn_modes' in section.describe()
True
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
    logs: str = setting(
        "", "log levels and artifacts to show, as TORCH_LOGS (read at import)", env="EMBER_LOGS"
    )
    debug_function: str = setting(
        "", "compile only the frames of functions of this name (read at import)",
        env="EMBER_DEBUG_FUNCTION",
    )  # fmt: skip
    progress: bool = setting(
        True, "show progress lines for compiles over 2 s (read at import)", env="EMBER_PROGRESS"
    )
    report: str = setting(
        "", "write the HTML compile report into this folder at exit (read at import)",
        env="EMBER_REPORT",
    )  # fmt: skip
    replay_record: bool = setting(
        False, "write a replay record when a frame fails to compile", env="EMBER_REPLAY_RECORD"
    )
    repro_after: str = setting(
        "", "where the minifier checks the backend: capture, aot or empty (off)",
        env="EMBER_REPRO_AFTER",
    )  # fmt: skip
    repro_level: int = setting(2, "the minifier's level, 1 to 4", env="EMBER_REPRO_LEVEL")
    optimize_ddp: bool = setting(
        True,
        "cut graphs captured inside DistributedDataParallel's forward at its gradient buckets",
        env="EMBER_OPTIMIZE_DDP",
    )
    repro_dir: str = setting(
        "ember_repro", "where replay records and repro scripts go", env="EMBER_REPRO_DIR"
    )
    artifacts: str = setting(
        "", "load this portable pack at import (ember.compiler.load_artifacts)",
        env="EMBER_ARTIFACTS",
    )  # fmt: skip
    artifacts_key: str = setting(
        "", "sign packs with this key (HMAC-SHA256) and load only packs signed with it",
        env="EMBER_ARTIFACTS_KEY",
    )  # fmt: skip


#: ember.compiler's own settings (``ember.compiler.config.debug``).
section: Section[DebugSettings] = Section("debug", DebugSettings)
