"""``set_stance``: how every compiled callable behaves, process-wide (torch's stances).

The stances and their rules live in :mod:`ember.capture.stance`; this is the public
entry, usable as a call or as a context manager.
"""

from __future__ import annotations

from types import TracebackType

from ember.capture import stance as _stance
from ember.capture.stance import STANCES, RecompileError

__all__ = ["STANCES", "RecompileError", "get_stance", "set_stance"]


class set_stance:
    """Set the stance of every compiled callable, for the whole process.

    ``"default"`` compiles on a cache miss; ``"force_eager"`` runs the original code
    (no cached graph, no compile); ``"eager_on_recompile"`` serves cached graphs and runs
    a miss eagerly, compiling nothing new; ``"fail_on_recompile"`` serves cached graphs
    and raises :class:`RecompileError` where a compile would be needed;
    ``"eager_then_compile"`` runs each code eagerly the first time and compiles it the
    second. As a call it sets the stance until changed; as a context manager it
    restores the previous stance on exit. A stance set in one thread holds for all;
    switching is safe while other threads call compiled code.

    >>> import torch, ember.compiler
    >>> cf = ember.compiler.compile(lambda x: x * 2, backend="eager")
    >>> with ember.compiler.set_stance("force_eager"):
    ...     _ = cf(torch.ones(2))
    >>> cf.stats.graphs
    0
    >>> _ = cf(torch.ones(2)); cf.stats.graphs
    1
    """

    def __init__(self, stance: str = "default") -> None:
        self.previous = _stance.set_stance(stance)
        self.stance = stance

    def __enter__(self) -> set_stance:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _stance.set_stance(self.previous)

    def __repr__(self) -> str:
        return f"set_stance({self.stance!r})"


def get_stance() -> str:
    """The stance in effect.

    >>> get_stance()
    'default'
    """
    return _stance.current()
