"""torch's top-level predicates on tensors, as library code sees them inside a capture.

``torch.is_tensor``, ``torch.is_floating_point`` and ``torch.numel`` are C functions
that ask a question about an argument; libraries branch on them (diffusers' UNet
wraps a Python-number timestep in a tensor only ``if not torch.is_tensor(t)``). Their
answers follow from what ember already knows about the value (its type, its dtype,
its sizes), so each is written here as the Python that asks it: the interpreter
folds a constant where the answer is fixed by the guards, and records a size where
it is symbolic.
"""

from __future__ import annotations

from typing import Any

import torch

from ember.capture.polyfills import polyfill


@polyfill(torch.is_tensor)
def is_tensor(obj: Any) -> bool:
    return isinstance(obj, torch.Tensor)


@polyfill(torch.is_floating_point)
def is_floating_point(input: torch.Tensor) -> bool:
    if not isinstance(input, torch.Tensor):
        raise TypeError(
            f"is_floating_point(): argument 'input' (position 1) must be Tensor, "
            f"not {type(input).__name__}"
        )
    return input.is_floating_point()


@polyfill(torch.numel)
def numel(input: torch.Tensor) -> int:
    if not isinstance(input, torch.Tensor):
        raise TypeError(
            f"numel(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}"
        )
    return input.numel()
