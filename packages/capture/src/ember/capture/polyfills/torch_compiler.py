"""torch's compiler surface, as library code sees it inside an ember capture.

Libraries ask whether they are being compiled and take their compile-friendly
path when they are (transformers skips ``ContextVar`` and pytree registration,
for example). Inside a capture ``is_compiling()`` is true, ``is_exporting()``
false, and TorchScript's ``is_scripting``/``is_tracing`` false; the functions are
traced, so the answer folds into a constant. Other functions that only return
one of these (the older ``is_compiling`` spellings torch keeps) are recognised by
their body (``polyfills.forwarded``), so ember names and imports nothing else.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._jit_internal import is_scripting as _is_scripting
from torch.jit._trace import is_tracing as _is_tracing

from ember.capture import markers
from ember.capture.polyfills import polyfill


@polyfill(torch.compiler.is_compiling, torch.compiler.is_dynamo_compiling)
def is_compiling() -> bool:
    return True


@polyfill(torch.compiler.is_exporting)
def is_exporting() -> bool:
    return False


@polyfill(_is_scripting, _is_tracing, torch._C._get_tracing_state)
def is_scripting() -> bool:
    return False


@polyfill(torch.compiler.cudagraph_mark_step_begin)
def graph_break(msg: str = "") -> None:
    markers.graph_break()


# torch's text where a failed check has no message
_DEFAULT = (
    "Expected cond to be True, but got False. (Could this error message be improved? "
    "If so, please report an enhancement request to PyTorch.)"
)


def _check_with(error: type[Exception], cond: bool, message: object) -> None:
    """``torch._check_with``: raise ``error`` with ``message()`` (or torch's default text)
    where ``cond`` is false. A condition known while tracing is checked then (and guarded);
    a tensor condition breaks, and eager's own check raises its error."""
    if cond:
        return
    if message is None:
        raise error(_DEFAULT)
    if not callable(message):
        raise TypeError("message must be a callable")
    raise error(str(message()))


# torch's checks and the error each raises where its condition is false
CHECKS: dict[object, type[Exception]] = {
    torch._check: RuntimeError,
    torch._check_index: IndexError,
    torch._check_value: ValueError,
    torch._check_type: TypeError,
    torch._check_not_implemented: NotImplementedError,
}


def _checker(error: type[Exception]) -> Callable[[bool, object], None]:
    """The polyfill of the check that raises ``error``."""

    def check(cond: bool, message: object = None) -> None:
        _check_with(error, cond, message)

    check.__name__ = check.__qualname__ = f"check_{error.__name__}"
    return check


for _target, _error in CHECKS.items():
    polyfill(_target)(_checker(_error))


@polyfill(torch._check_is_size)
def check_is_size(i: int, message: object = None, *, max: int | None = None) -> None:
    _check_with(RuntimeError, i >= 0, message)
    if max is not None:
        _check_with(RuntimeError, i <= max, message)
