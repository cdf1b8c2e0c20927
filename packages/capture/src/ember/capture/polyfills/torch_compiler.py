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


@polyfill(torch._check, torch._check_index, torch._check_value, torch._check_type)
def check(cond: bool, message: object = None) -> None:
    # A condition known while tracing is checked then (and guarded); a tensor breaks.
    if not cond:
        raise RuntimeError(message() if callable(message) else "Expected cond to be True")


@polyfill(torch._check_is_size)
def check_is_size(i: int, message: object = None, *, max: int | None = None) -> None:
    check(i >= 0, message)
    if max is not None:
        check(i <= max, message)


@polyfill(torch._check_not_implemented)
def check_not_implemented(cond: bool, message: object = None) -> None:
    if not cond:
        raise NotImplementedError(message() if callable(message) else "Expected cond to be True")
