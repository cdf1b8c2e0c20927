"""``torch.optim``'s step decorator, as compiled code sees it.

Each optimizer's ``step`` is wrapped by ``_use_grad_for_differentiable``: it sets grad
mode to the optimizer's ``differentiable`` default around the update and calls
``torch._dynamo.graph_break()`` on both sides (torch's compiler splits the step there so
its AOT stage sees an inference graph). ember traces the update itself (torch.optim's
trace rule) with the same grad-mode switch inside the graph, and without the breaks: the
breaks sit in a ``try`` block, where ember cannot split a frame, and the switch already
tells aotgraph that the update is not differentiated. So one compiled step is one graph.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.optimizer import _use_grad_for_differentiable

from ember.capture.polyfills import closure_polyfill


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
