"""Global torch state that a translation depends on, and the current backend.

A translation is only valid under the global state it was traced in: grad mode
changes which graph autograd records, autocast changes dtypes, a
torch-function mode intercepts every call. Each piece of state is a
:class:`StateField` in the :data:`STATE_FIELDS` table: how to read it, how to
print it, and how to test it in one cheap expression inside a compiled check.

>>> snap = snapshot()
>>> snap["grad_mode"], snap["default_dtype"]
(True, torch.float32)
>>> STATE_FIELDS["grad_mode"].fmt(False)
'disabled'

The backend a compiled callable runs for is state too: ``ember.capture`` sets
it with :class:`backend_scope` around every compiled call, so that one code
object compiled for two backends never serves one with the other's code.

>>> with backend_scope("eager"):
...     current_backend()
'eager'
>>> current_backend() is None
True
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch
import torch.nn.modules.module as _nn_module

__all__ = [
    "BACKEND_VAR",
    "STATE_FIELDS",
    "StateField",
    "backend_scope",
    "current_backend",
    "reset_backend",
    "set_backend",
    "snapshot",
]

#: Binds an object into a compiled check's namespace and returns its name there.
Bind = Callable[[object], str]

_C: Any = torch._C
#: The backend of the running compiled callable. ``ember.capture`` sets it once per
#: compiled call (in C); :func:`backend_scope` and :func:`set_backend` are the Python ways.
BACKEND_VAR: contextvars.ContextVar[object] = contextvars.ContextVar("ember_backend", default=None)
_BACKEND = BACKEND_VAR
_AUTOCAST_DEVICES: tuple[str, ...] = tuple(_C._autocast_supported_devices())
_GLOBAL_HOOK_DICTS = (
    "_global_forward_pre_hooks",
    "_global_forward_hooks",
    "_global_backward_pre_hooks",
    "_global_backward_hooks",
)


#: Calls that return exactly these values when a field has its expected value.
Probes = tuple[tuple[Callable[[], object], object], ...]


@dataclass(frozen=True, slots=True)
class StateField:
    """One piece of global torch state a guard set checks.

    ``read`` returns the current value (comparable with ``==``) and ``fmt``
    words a value for messages. ``probes(expected)`` lists cheap calls that
    return exactly the given values when, and only when, ``read() ==
    expected`` (a compiled check makes them all in one C call); when it lists
    none, ``emit(expected, bind)`` gives the test as a Python expression.

    >>> field = STATE_FIELDS["deterministic"]
    >>> field.label, field.fmt(field.read())
    ('deterministic algorithms', 'disabled')
    >>> [(fn.__name__, value) for fn, value in field.probes((False, False))]
    [('_get_deterministic_algorithms', False)]
    """

    label: str
    read: Callable[[], object]
    fmt: Callable[[Any], str]
    probes: Callable[[Any], Probes] = lambda expected: ()
    emit: Callable[[Any, Bind], str] | None = None

    def test(self, expected: object, bind: Bind) -> str:
        """A Python expression that is true exactly when ``read() == expected``.

        >>> STATE_FIELDS["grad_mode"].test(True, lambda obj: "K")
        'K() == K'
        """
        probes = self.probes(expected)
        if probes:
            return " and ".join(f"{bind(fn)}() == {bind(value)}" for fn, value in probes)
        if self.emit is not None:
            return self.emit(expected, bind)
        return f"{bind(self.read)}() == {bind(expected)}"


def _on_off(value: bool) -> str:
    return "enabled" if value else "disabled"


def _read_autocast() -> tuple[tuple[str, torch.dtype], ...]:
    if not _C._is_any_autocast_enabled():
        return ()
    return tuple(
        (device, torch.get_autocast_dtype(device))
        for device in _AUTOCAST_DEVICES
        if torch.is_autocast_enabled(device)
    )


def _fmt_autocast(value: tuple[tuple[str, torch.dtype], ...]) -> str:
    if not value:
        return "disabled"
    return "enabled for " + ", ".join(f"{device} ({dtype})" for device, dtype in value)


def _read_deterministic() -> tuple[bool, bool]:
    enabled = bool(_C._get_deterministic_algorithms())
    return enabled, enabled and bool(_C._get_deterministic_algorithms_warn_only())


def _fmt_deterministic(value: tuple[bool, bool]) -> str:
    return ("enabled (warn only)" if value[1] else "enabled") if value[0] else "disabled"


def _read_torch_function() -> tuple[str, tuple[type, ...]]:
    if _C._is_torch_function_enabled():
        state = "enabled"
    else:
        state = "disabled" if _C._is_torch_function_all_disabled() else "subclasses disabled"
    depth = _C._len_torch_function_stack()
    return state, tuple(type(_C._get_function_stack_at(i)) for i in range(depth))


def _fmt_torch_function(value: tuple[str, tuple[type, ...]]) -> str:
    modes = ", ".join(mode.__qualname__ for mode in value[1]) or "no modes"
    return f"{value[0]}, {modes}"


def _probe_torch_function(expected: tuple[str, tuple[type, ...]]) -> Probes:
    if expected != ("enabled", ()):
        return ()
    return ((_C._is_torch_function_enabled, True), (_C._len_torch_function_stack, 0))


def _read_module_hooks() -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(getattr(_nn_module, name)) for name in _GLOBAL_HOOK_DICTS)


def _fmt_module_hooks(value: tuple[tuple[int, ...], ...]) -> str:
    count = sum(len(ids) for ids in value)
    return f"{count} global module hooks" if count else "no global module hooks"


def _emit_module_hooks(expected: tuple[tuple[int, ...], ...], bind: Bind) -> str:
    if any(expected):
        return f"{bind(_read_module_hooks)}() == {bind(expected)}"
    module = bind(_nn_module)  # read the dicts through the module: rebinding them is seen
    return "not (" + " or ".join(f"{module}.{name}" for name in _GLOBAL_HOOK_DICTS) + ")"


#: Every piece of global state a guard set checks, in check order (most
#: likely to change first). Keys are the names used by ``TorchState`` sources.
STATE_FIELDS: dict[str, StateField] = {
    "grad_mode": StateField(
        "grad mode", _C.is_grad_enabled, _on_off, lambda e: ((_C.is_grad_enabled, e),)
    ),
    "inference_mode": StateField(
        "inference mode",
        _C.is_inference_mode_enabled,
        _on_off,
        lambda e: ((_C.is_inference_mode_enabled, e),),
    ),
    "autocast": StateField(
        "autocast",
        _read_autocast,
        _fmt_autocast,
        lambda e: () if e else ((_C._is_any_autocast_enabled, False),),
    ),
    "default_dtype": StateField(
        "default dtype", torch.get_default_dtype, str, lambda e: ((torch.get_default_dtype, e),)
    ),
    "deterministic": StateField(
        "deterministic algorithms",
        _read_deterministic,
        _fmt_deterministic,
        lambda e: () if e[0] else ((_C._get_deterministic_algorithms, False),),
    ),
    "torch_function": StateField(
        "torch function", _read_torch_function, _fmt_torch_function, _probe_torch_function
    ),
    "module_hooks": StateField(
        "global module hooks", _read_module_hooks, _fmt_module_hooks, emit=_emit_module_hooks
    ),
}


def snapshot() -> dict[str, object]:
    """Read every field of :data:`STATE_FIELDS` now.

    >>> with torch.no_grad():
    ...     snapshot()["grad_mode"]
    False
    """
    return {name: field.read() for name, field in STATE_FIELDS.items()}


def current_backend() -> object:
    """The backend the running compiled callable was compiled for, or None.

    >>> current_backend() is None
    True
    """
    return _BACKEND.get()


#: The reader compiled checks call; bound once so the check pays one C call.
read_backend: Callable[[], object] = _BACKEND.get


def set_backend(backend: object) -> contextvars.Token[object]:
    """Make ``backend`` current until :func:`reset_backend` is given the token.

    The cheap form of :class:`backend_scope` for a per-call wrapper.

    >>> token = set_backend("eager")
    >>> current_backend()
    'eager'
    >>> reset_backend(token); current_backend() is None
    True
    """
    return _BACKEND.set(backend)


def reset_backend(token: contextvars.Token[object]) -> None:
    """Restore the backend that was current before :func:`set_backend` returned ``token``.

    >>> reset_backend(set_backend("inductor")); current_backend() is None
    True
    """
    _BACKEND.reset(token)


class backend_scope:
    """Context manager that makes ``backend`` the current backend.

    ``ember.capture`` enters it around every call of a compiled callable; a
    ``BACKEND`` guard compares against it. Scopes nest and are per thread and
    per asyncio task (a :class:`contextvars.ContextVar`).

    >>> with backend_scope("inductor"), backend_scope("eager"):
    ...     current_backend()
    'eager'
    """

    __slots__ = ("_backend", "_token")

    def __init__(self, backend: object) -> None:
        self._backend = backend
        self._token: contextvars.Token[object] | None = None

    def __enter__(self) -> object:
        self._token = _BACKEND.set(self._backend)
        return self._backend

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._token is not None, "backend_scope exited without being entered"
        _BACKEND.reset(self._token)
        self._token = None
