"""ember.guards' settings, and :class:`Section`, the holder every package's settings use.

Each ember package owns one settings section: a frozen dataclass whose fields say what
can be set, each with its meaning (``metadata["doc"]``) and, where it has one, the
``EMBER_*`` environment variable that gives its default (``metadata["env"]``). This
module is the only place ember.guards reads the environment. ``ember.compiler.config``
assembles the sections of every package (no package imports ember.compiler).

A value comes from, latest winning: the field's default, its environment variable (read
when the value is asked for, so a test's ``monkeypatch.setenv`` is seen), :meth:`Section.set`
(process-wide), :meth:`Section.patch` (this thread / async context, for a block).

>>> section.get().cache_size_limit
8
>>> with section.patch(cache_size_limit=3):
...     section.get().cache_size_limit
3
>>> section.patch(cache_limit=3)
Traceback (most recent call last):
KeyError: "guards has no setting 'cache_limit'; its settings are accumulated_cache_size_limit, \
cache_size_limit, no_cxx, pure_python, stamps"
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import shlex
import threading
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = ["GuardsSettings", "Section", "section", "setting"]

S = TypeVar("S")
_NOTHING: Mapping[str, Any] = types.MappingProxyType({})


def setting(default: Any, doc: str, env: str = "", minimum: int | None = None) -> Any:
    """A settings field: its default, its meaning, its environment variable, its floor.

    >>> @dataclass(frozen=True)
    ... class Demo:
    ...     level: int = setting(1, "how much", env="DEMO_LEVEL", minimum=0)
    >>> Section("demo", Demo).describe()["level"]
    'how much (env DEMO_LEVEL)'
    """
    meta = {"doc": doc, "env": env, "minimum": minimum}
    if isinstance(default, list | dict):
        raise TypeError("settings defaults must be immutable (use a tuple)")
    return field(default=default, metadata=meta)


def _parse(kind: type, text: str) -> Any:
    """An environment variable's text as a value of the field's type."""
    if kind is bool:
        return text.strip().lower() not in ("", "0", "false", "no", "off")
    if kind is tuple:
        return tuple(shlex.split(text))
    return kind(text)


class Section(Generic[S]):
    """One package's settings: defaults < environment < :meth:`set` < :meth:`patch`.

    ``set`` is process-wide (one lock; every thread sees it). ``patch`` is a context
    manager local to the calling thread (a :mod:`contextvars` variable): other threads
    keep their own values, and patches nest, the innermost winning, each restoring on exit
    exactly what it replaced.

    >>> @dataclass(frozen=True)
    ... class Demo:
    ...     on: bool = setting(False, "switch it on")
    >>> demo = Section("demo", Demo)
    >>> demo.set(on=True); demo.get().on
    True
    >>> demo.set(on="yes")
    Traceback (most recent call last):
    TypeError: demo.on must be a bool, not str ('yes')
    """

    def __init__(self, name: str, cls: Callable[..., S]) -> None:
        self.name, self.cls = name, cls
        self.fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        self._set: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._patch: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
            f"ember.{name}.settings", default=_NOTHING
        )

    def get(self) -> S:
        """The settings in effect here and now."""
        return self.cls(**(self.from_env() | self._set | dict(self._patch.get())))

    def from_env(self) -> dict[str, Any]:
        """The values the environment sets (a bad value is an error naming the variable)."""
        found = {}
        for name, f in self.fields.items():
            var = f.metadata.get("env")
            if var and (text := os.environ.get(var)) is not None:
                try:
                    found[name] = self.checked(name, _parse(type(f.default), text))
                except (TypeError, ValueError) as e:
                    raise ValueError(f"environment variable {var}={text!r}: {e}") from None
        return found

    def checked(self, name: str, value: Any) -> Any:
        """``value`` for setting ``name``, or a KeyError/TypeError/ValueError saying why not."""
        if name not in self.fields:
            raise KeyError(
                f"{self.name} has no setting {name!r}; its settings are "
                f"{', '.join(sorted(self.fields)) or '(none yet)'}"
            )
        f = self.fields[name]
        kind = type(f.default)
        if kind is tuple and isinstance(value, list):
            value = tuple(value)
        if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
            raise TypeError(
                f"{self.name}.{name} must be a {kind.__name__}, "
                f"not {type(value).__name__} ({value!r})"
            )
        if isinstance(value, tuple) and not all(isinstance(v, str) for v in value):
            raise TypeError(f"{self.name}.{name} must hold strings, not {value!r}")
        floor = f.metadata.get("minimum")
        if floor is not None and value < floor:
            raise ValueError(f"{self.name}.{name} must be at least {floor}, not {value!r}")
        return value

    def set(self, **changes: Any) -> None:
        """Change settings for the whole process (checked first: all or nothing)."""
        checked = {name: self.checked(name, value) for name, value in changes.items()}
        with self._lock:
            self._set = self._set | checked

    def unset(self, *names: str) -> None:
        """Forget :meth:`set` values: back to the environment's, else the defaults."""
        with self._lock:
            self._set = {k: v for k, v in self._set.items() if k not in names}

    def patch(self, **changes: Any) -> contextlib.AbstractContextManager[S]:
        """Change settings for a block, in this thread (checked here, before the block)."""
        checked = {name: self.checked(name, value) for name, value in changes.items()}
        return self._patched(checked)

    @contextlib.contextmanager
    def _patched(self, checked: dict[str, Any]) -> Iterator[S]:
        token = self._patch.set(dict(self._patch.get()) | checked)
        try:
            yield self.get()
        finally:
            self._patch.reset(token)

    def describe(self) -> dict[str, str]:
        """Each setting's meaning (and environment variable), by name."""
        return {
            name: f.metadata["doc"] + (f" (env {f.metadata['env']})" if f.metadata["env"] else "")
            for name, f in self.fields.items()
        }


@dataclass(frozen=True, slots=True)
class GuardsSettings:
    """What ember.guards reads: the cache limits, and whether to use its C accelerators."""

    cache_size_limit: int = setting(
        8,
        "translations kept per code object; at the limit its frames run eagerly",
        env="EMBER_CACHE_SIZE_LIMIT",
        minimum=1,
    )
    accumulated_cache_size_limit: int = setting(
        64,
        "translations made per code object over its life (entries dropped because what they"
        " guard died make room, up to this): then its frames run eagerly",
        env="EMBER_ACCUMULATED_CACHE_SIZE_LIMIT",
        minimum=1,
    )
    pure_python: bool = setting(
        False,
        "guards check in pure Python, without the C accelerators (read at import)",
        env="EMBER_GUARDS_PURE_PYTHON",
    )
    no_cxx: bool = setting(
        False,
        "tensor checks without the C++ accelerator (read at import)",
        env="EMBER_GUARDS_NO_CXX",
    )
    stamps: bool = setting(
        True,
        "checks skip the guards on long-lived objects (modules, functions, classes) while"
        " CPython's dict versions and class tags say none of them changed",
        env="EMBER_GUARD_STAMPS",
    )


#: ember.guards' settings (``ember.compiler.config.guards``).
section: Section[GuardsSettings] = Section("guards", GuardsSettings)
