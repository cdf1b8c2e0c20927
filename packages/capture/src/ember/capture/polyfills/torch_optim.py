"""``torch.optim``'s step wrappers, as compiled code sees them.

Each optimizer's ``step`` is wrapped by ``_use_grad_for_differentiable``: it sets grad
mode to the optimizer's ``differentiable`` default around the update and calls torch's
compiler's ``graph_break()`` on both sides (torch's compiler splits the step there so
its AOT stage sees an inference graph). ember traces the update itself (torch.optim's
trace rule) with the same grad-mode switch inside the graph, and without the breaks: the
breaks sit in a ``try`` block, where ember cannot split a frame, and the switch already
tells aotgraph that the update is not differentiated. So one compiled step is one graph.

An LR scheduler replaces its optimizer's ``step`` with a closure that marks the optimizer
as stepped and calls the step bound to it through a weak reference; that closure is
written here as what it does, so a scheduled step is one graph too.

An optimizer made with ``foreach=None`` picks its implementation on each step from the
device types torch has fused and foreach kernels for (``torch.utils._foreach_utils``): the
lists are read once, when this module loads (a backend registering a private device type
later is not seen).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._foreach_utils as _foreach_utils
from torch.optim.lr_scheduler import LRScheduler
from torch.optim.optimizer import _stack_if_compiling, _use_grad_for_differentiable

from ember.capture.polyfills import closure_polyfill, polyfill


def _sample(self: Any) -> None:
    pass


# the code of every ``_use_grad`` closure (one per optimizer class's step)
USE_GRAD_CODE = _use_grad_for_differentiable(_sample).__code__


@closure_polyfill(USE_GRAD_CODE, "func")
def use_grad(func: Any, *args: Any, **kwargs: Any) -> Any:
    """``_use_grad``: ``func`` (an optimizer's ``step``) under its ``differentiable`` grad mode."""
    self = args[0]
    previous = torch.is_grad_enabled()
    torch.set_grad_enabled(self.defaults["differentiable"])
    try:
        result = func(*args, **kwargs)
    finally:
        torch.set_grad_enabled(previous)
    return result


def _nested_code(code: Any, *names: str) -> Any:
    """The code of the function ``names[-1]`` defined inside ... ``names[0]`` inside ``code``."""
    for name in names:
        code = next((c for c in code.co_consts if getattr(c, "co_name", None) == name), None)
        if code is None:
            return None
    return code


# the code of the closure an LR scheduler puts in place of its optimizer's step
SCHEDULED_STEP_CODE = _nested_code(
    LRScheduler.__init__.__code__, "patch_track_step_called", "wrap_step", "wrapper"
)


def scheduled_step(opt_ref: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    """The scheduler's ``wrapper``: mark the optimizer stepped, then run its step."""
    opt = opt_ref()
    opt._opt_called = True
    return func(opt, *args, **kwargs)


if SCHEDULED_STEP_CODE is not None:  # (a torch that wraps it otherwise: a break at the call)
    closure_polyfill(SCHEDULED_STEP_CODE, "opt_ref", "func")(scheduled_step)


_FUSED_DEVICES = tuple(_foreach_utils._get_fused_kernels_supported_devices())
_FOREACH_DEVICES = tuple(_foreach_utils._get_foreach_kernels_supported_devices())


@polyfill(_foreach_utils._get_fused_kernels_supported_devices)
def fused_devices() -> list[str]:
    return list(_FUSED_DEVICES)


@polyfill(_foreach_utils._get_foreach_kernels_supported_devices)
def foreach_devices() -> list[str]:
    return list(_FOREACH_DEVICES)


@polyfill(_stack_if_compiling)
def stack_if_compiling(x: list[Any]) -> list[Any]:
    """``_stack_if_compiling``: the list as it is. torch stacks the per-parameter step sizes
    while compiling because its ``_foreach_addcdiv_`` takes them as a tensor, not a list of
    0-d tensors; ember's ``_foreach_*`` are loops (``torch_foreach``) that take the list
    item by item. Stacked, the step sizes were a ``cat`` of hundreds of 0-d values between
    two kernels of the inductor backend: the update could not fuse across it."""
    return x
