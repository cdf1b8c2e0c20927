"""``ember.compiler.config``: every setting of ember, one section per layer.

Each package owns its section and is the only place that reads its environment
variables (``ember.capture.settings``, ``ember.guards.settings``, ``ember.aotgraph.settings``,
``ember.inductor.settings``; ``debug`` is ember.compiler's own). This object assembles
them. A value comes from, the later winning:

1. the setting's default;
2. its ``EMBER_*`` environment variable (docs/configuration.md has the table);
3. ``config.<section>.<name> = value`` (process-wide);
4. ``with config.patch(...)`` (for the block, in this thread);
5. ``compile(..., options={...})`` and its ``mode`` (for that compiled object's compiles).

>>> from ember.compiler import config
>>> config.guards.cache_size_limit
8
>>> with config.patch({"guards.cache_size_limit": 2}):
...     config.guards.cache_size_limit
2
>>> with config.patch(cache_size_limit=3):  # a name that only one section has
...     config.guards.cache_size_limit
3
>>> config.guards.cache_limit = 3
Traceback (most recent call last):
AttributeError: guards has no setting 'cache_limit'; its settings are \
accumulated_cache_size_limit, cache_size_limit, no_cxx, pure_python, stamps
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar

from ember.aotgraph import settings as aotgraph_settings
from ember.capture import settings as capture_settings
from ember.compiler import settings as debug_settings
from ember.guards import settings as guards_settings
from ember.inductor import settings as inductor_settings

__all__ = ["MODE_OPTIONS", "Config", "SectionView", "config"]

S = TypeVar("S")
S_co = TypeVar("S_co", covariant=True)


class Section(Protocol[S_co]):
    """What a package's settings holder offers (``ember.guards.settings.Section``, and
    its copy in ember.aotgraph, which does not depend on ember.guards)."""

    name: str
    fields: dict[str, Any]

    def get(self) -> S_co: ...
    def set(self, **changes: Any) -> None: ...
    def unset(self, *names: str) -> None: ...
    def checked(self, name: str, value: Any) -> Any: ...
    def describe(self) -> dict[str, str]: ...
    def patch(self, **changes: Any) -> contextlib.AbstractContextManager[Any]: ...


#: What each ``compile(mode=...)`` sets (under the ``options`` given with it).
MODE_OPTIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "reduce-overhead": {"inductor.cudagraphs": True},
    "max-autotune": {"inductor.max_autotune": True, "inductor.cudagraphs": True},
    "max-autotune-no-cudagraphs": {"inductor.max_autotune": True},
}


class SectionView(Generic[S]):
    """One section of :data:`config`: its settings as attributes, read and set.

    >>> config.capture.verbose
    False
    >>> sorted(config.capture.describe())  # doctest: +NORMALIZE_WHITESPACE
    ['check', 'dynamic_output_shape_ops', 'freeze_heap', 'scalar_outputs',
     'suppress_errors', 'verbose']
    """

    __slots__ = ("_section",)

    _section: Section[S]

    def __init__(self, section: Section[S]) -> None:
        object.__setattr__(self, "_section", section)

    def get(self) -> S:
        """The section's settings now, as its typed frozen dataclass."""
        return self._section.get()

    def describe(self) -> dict[str, str]:
        """Each setting's meaning (and environment variable)."""
        return self._section.describe()

    def unset(self, *names: str) -> None:
        """Forget values set here (back to the environment's, else the defaults)."""
        self._section.unset(*names)

    def __getattr__(self, name: str) -> Any:
        if name not in self._section.fields:
            raise AttributeError(_unknown(self._section, name))
        return getattr(self._section.get(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            self._section.set(**{name: value})
        except KeyError:
            raise AttributeError(_unknown(self._section, name)) from None

    def __dir__(self) -> list[str]:
        return sorted(self._section.fields)

    def __repr__(self) -> str:
        return f"<ember config section {self._section.name}: {self._section.get()!r}>"


def _unknown(section: Section[Any], name: str) -> str:
    return (
        f"{section.name} has no setting {name!r}; its settings are "
        f"{', '.join(sorted(section.fields)) or '(none yet)'}"
    )


class Config:
    """Every setting of ember (see the module docstring for precedence).

    >>> sorted(config.list_options())[:2]
    ['aotgraph.cache', 'aotgraph.cache_dir']
    >>> config.list_mode_options("max-autotune")
    {'inductor.max_autotune': True, 'inductor.cudagraphs': True}
    """

    def __init__(self) -> None:
        self.capture = SectionView(capture_settings.section)
        self.guards = SectionView(guards_settings.section)
        self.aotgraph = SectionView(aotgraph_settings.section)
        self.inductor = SectionView(inductor_settings.section)
        self.debug = SectionView(debug_settings.section)
        self.sections: dict[str, Section[Any]] = {
            "capture": capture_settings.section,
            "guards": guards_settings.section,
            "aotgraph": aotgraph_settings.section,
            "inductor": inductor_settings.section,
            "debug": debug_settings.section,
        }

    def key(self, name: str) -> tuple[str, str]:
        """``(section, setting)`` of a dotted name, or of a bare name only one section has.

        >>> config.key("suppress_errors"), config.key("inductor.cxx")
        (('capture', 'suppress_errors'), ('inductor', 'cxx'))
        >>> config.key("check")
        Traceback (most recent call last):
        KeyError: "'check' is a setting of capture, aotgraph: write it as section.check"
        """
        if not isinstance(name, str):
            raise TypeError(f"setting names are strings, not {name!r}")
        section, _, field = name.rpartition(".")
        if section:
            if section in self.sections and field in self.sections[section].fields:
                return section, field
        else:
            owners = [s for s, sec in self.sections.items() if field in sec.fields]
            if len(owners) == 1:
                return owners[0], field
            if owners:
                raise KeyError(
                    f"{name!r} is a setting of {', '.join(owners)}: write it as section.{name}"
                )
        raise KeyError(
            f"ember has no setting {name!r}; the settings are {', '.join(self.list_options())}"
        )

    def split(self, changes: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """``changes`` by section, each value checked (an error names the bad key or value)."""
        by_section: dict[str, dict[str, Any]] = {}
        for name, value in changes.items():
            section, field = self.key(name)
            by_section.setdefault(section, {})[field] = self.sections[section].checked(field, value)
        return by_section

    def patch(
        self, changes: Mapping[str, Any] | None = None, /, **kwargs: Any
    ) -> contextlib.AbstractContextManager[None]:
        """Override settings for a ``with`` block, in the calling thread only (a
        :mod:`contextvars` variable: other threads, already running or started inside the
        block, keep their values). Patches nest; on exit each restores exactly what it
        replaced. Every key and value is checked before the block starts.

        >>> with config.patch({"inductor.cxx": "clang++"}, verbose=True):
        ...     config.inductor.cxx, config.capture.verbose
        ('clang++', True)
        >>> config.inductor.cxx
        'g++'
        """
        return self._patched(self.split({**(changes or {}), **kwargs}))

    @contextlib.contextmanager
    def _patched(self, by_section: dict[str, dict[str, Any]]) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for section, fields in by_section.items():
                stack.enter_context(self.sections[section].patch(**fields))
            yield

    def list_options(self) -> dict[str, Any]:
        """Every setting, as ``"section.name"``, with its value in effect here and now."""
        return {
            f"{section}.{name}": getattr(sec.get(), name)
            for section, sec in self.sections.items()
            for name in sec.fields
        }

    def describe(self) -> dict[str, str]:
        """Every setting's meaning (and environment variable), as ``"section.name"``."""
        return {
            f"{section}.{name}": text
            for section, sec in self.sections.items()
            for name, text in sec.describe().items()
        }

    def list_mode_options(self, mode: str | None = None) -> dict[str, Any]:
        """What ``compile(mode=mode)`` sets; with no mode, every mode's table.

        >>> config.list_mode_options("default")
        {}
        >>> config.list_mode_options("fastest")
        Traceback (most recent call last):
        ValueError: unknown mode 'fastest'; the modes are default, reduce-overhead, \
max-autotune, max-autotune-no-cudagraphs
        """
        if mode is None:
            return {m: dict(opts) for m, opts in MODE_OPTIONS.items()}
        if mode not in MODE_OPTIONS:
            raise ValueError(f"unknown mode {mode!r}; the modes are {', '.join(MODE_OPTIONS)}")
        return dict(MODE_OPTIONS[mode])

    def __repr__(self) -> str:
        return f"<ember.compiler.config: {len(self.list_options())} settings>"


#: ember's settings: ``ember.compiler.config``.
config = Config()
