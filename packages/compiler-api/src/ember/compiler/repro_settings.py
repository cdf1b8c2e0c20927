"""The settings of ember's failure-reproduction tools: replay records and the minifiers.

One frozen dataclass, fed by environment variables (read in :func:`from_env`, the only
place that reads them) and overridden per compiled object by ``compile(...,
options={...})``. It is kept in one place so that it can become the ``debug`` section of
a single config object later.

>>> s = ReproSettings.from_env({"EMBER_REPRO_AFTER": "capture", "EMBER_REPRO_LEVEL": "4"})
>>> s.after, s.level, s.replay_record
('capture', 4, False)
>>> s, rest = s.with_options({"replay_record": True, "cflags": ["-O1"]})
>>> s.replay_record, rest
(True, {'cflags': ['-O1']})
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ember.compiler.settings import section as debug_section

# What each repro level does when a backend is checked (EMBER_REPRO_LEVEL); torch's
# repro_level, adapted. See docs/troubleshooting.md.
LEVELS: dict[int, str] = {
    1: "a backend raised: write repro.py with the whole graph (no minifying)",
    2: "a backend raised: write repro_full.py, then minify it into repro.py",
    3: "as 2, and write repro_full.py before each backend call (survives a crash)",
    4: "as 2, and compare each compiled graph with eager: beyond tolerance, minify that",
}
AFTER = ("capture", "aot")

# option key -> (field, environment variable)
KEYS: dict[str, tuple[str, str]] = {
    "replay_record": ("replay_record", "EMBER_REPLAY_RECORD"),
    "repro_after": ("after", "EMBER_REPRO_AFTER"),
    "repro_level": ("level", "EMBER_REPRO_LEVEL"),
    "repro_dir": ("directory", "EMBER_REPRO_DIR"),
}


@dataclass(frozen=True, slots=True)
class ReproSettings:
    """How ember records and reproduces failures of one compiled object.

    >>> ReproSettings().active
    False
    >>> ReproSettings(after="aot").active
    True
    """

    replay_record: bool = False  # write a replay record when a frame fails to compile
    after: str | None = None  # "capture" or "aot": where the minifier checks the backend
    level: int = 2  # one of LEVELS
    directory: str = "ember_repro"  # where records and repro scripts go

    def __post_init__(self) -> None:
        if self.after is not None and self.after not in AFTER:
            raise ValueError(f"repro_after must be one of {', '.join(AFTER)}, not {self.after!r}")
        if self.level not in LEVELS:
            raise ValueError(f"repro_level must be one of 1, 2, 3, 4, not {self.level!r}")
        if not isinstance(self.replay_record, bool):
            raise TypeError(f"replay_record must be a bool, not {self.replay_record!r}")

    @property
    def active(self) -> bool:
        """Whether any tool is on (otherwise compile() changes nothing)."""
        return self.replay_record or self.after is not None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ReproSettings:
        """The settings ``config.debug`` holds (its ``EMBER_REPRO_*`` and
        ``EMBER_REPLAY_RECORD`` variables, read there); or those a mapping of such variables
        gives."""
        if environ is None:
            debug = debug_section.get()
            after = debug.repro_after or None
            return cls(debug.replay_record, after, debug.repro_level, debug.repro_dir)
        env = environ
        raw: dict[str, Any] = {f: env[v] for f, v in KEYS.values() if env.get(v, "") != ""}
        if "replay_record" in raw:
            raw["replay_record"] = raw["replay_record"] not in ("0", "false", "False")
        if "level" in raw:
            raw["level"] = int(raw["level"]) if raw["level"].isdigit() else raw["level"]
        try:
            return cls(**raw)
        except (TypeError, ValueError) as e:  # name the variables, not the option keys
            names = ", ".join(f"{var}={env[var]!r}" for _, var in KEYS.values() if var in env)
            raise type(e)(f"{e} (from the environment: {names})") from None

    def with_options(self, options: Mapping[str, Any]) -> tuple[ReproSettings, dict[str, Any]]:
        """These settings with ``options``' repro keys applied, and the other options."""
        mine = {KEYS[k][0]: v for k, v in options.items() if k in KEYS}
        rest = {k: v for k, v in options.items() if k not in KEYS}
        return dataclasses.replace(self, **mine), rest
