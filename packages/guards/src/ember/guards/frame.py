"""The frame a compiled check serves: argument slots and what is bound at compile time.

The check receives every argument slot of the frame, in ``co_varnames``
order (positional, keyword-only, then the ``*args`` tuple, then the
``**kwargs`` dict), and nothing else. Globals, builtins and closure cells are
bound when the check is compiled: ``ember.capture`` only lets an entry serve
frames whose function has the very same ``__globals__`` and cell objects.

>>> def f(x, *rest, scale=2.0, **options):
...     return x
>>> frame = FrameSpec.from_function(f)
>>> frame.arg_names
('x', 'scale', 'rest', 'options')
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from types import CellType, CodeType, FunctionType
from typing import Any

__all__ = ["FrameSpec", "arg_count"]


def arg_count(code: CodeType) -> int:
    """How many argument slots a frame of ``code`` has (the check's arity).

    >>> arg_count((lambda a, b=1, *c, d, **e: 0).__code__)
    5
    """
    flags = code.co_flags
    return (
        code.co_argcount
        + code.co_kwonlyargcount
        + bool(flags & inspect.CO_VARARGS)
        + bool(flags & inspect.CO_VARKEYWORDS)
    )


@dataclass(frozen=True, slots=True, eq=False)
class FrameSpec:
    """Argument names, globals, builtins and closure cells of the frames a
    check serves. Compared by identity.

    >>> FrameSpec("f", ("x",), {}, {}).cells
    {}
    """

    name: str
    arg_names: tuple[str, ...]
    globals: dict[str, Any]
    builtins: dict[str, Any]
    cells: dict[str, CellType] = field(default_factory=dict)

    @classmethod
    def from_function(cls, fn: FunctionType) -> FrameSpec:
        """The frame spec of ``fn``'s frames.

        >>> def outer():
        ...     n = 3
        ...     def inner(x):
        ...         return x + n
        ...     return inner
        >>> frame = FrameSpec.from_function(outer())
        >>> frame.name, list(frame.cells), frame.cells["n"].cell_contents
        ('outer.<locals>.inner', ['n'], 3)
        """
        code = fn.__code__
        cells = dict(zip(code.co_freevars, fn.__closure__ or (), strict=True))
        builtins = fn.__builtins__
        return cls(
            fn.__qualname__,
            code.co_varnames[: arg_count(code)],
            fn.__globals__,
            builtins if isinstance(builtins, dict) else vars(builtins),
            cells,
        )
