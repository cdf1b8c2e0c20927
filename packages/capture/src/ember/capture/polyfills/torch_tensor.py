"""Tensor methods whose scalar argument arrives as a tensor inside compiled code.

While compiling, ``torch.optim``'s single-tensor steps keep the step count a tensor
(``_get_value`` returns it as it is), so ``param.addcdiv_(exp_avg, denom,
value=-step_size)`` gets a 0-d tensor where torch takes a number: run as one node, that
would read the value with ``.item()``, a data-dependent break. With a tensor ``value``
the update is written here with tensor operations (the same arithmetic, no ``.item()``);
with a number it stays the one operation it is.

>>> import torch
>>> t = torch.zeros(2)
>>> addcdiv_(t, torch.ones(2), torch.full((2,), 2.0), value=torch.tensor(3.0)).tolist()
[1.5, 1.5]
"""

from __future__ import annotations

from typing import Any

import torch

from ember.capture.polyfills import tensor_method


@tensor_method("addcdiv_")
def addcdiv_(self: torch.Tensor, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Any:
    if isinstance(value, torch.Tensor):
        return self.add_(tensor1 / tensor2 * value)
    return torch.Tensor.addcdiv_(self, tensor1, tensor2, value=value)


@tensor_method("addcmul_")
def addcmul_(self: torch.Tensor, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Any:
    if isinstance(value, torch.Tensor):
        return self.add_(tensor1 * tensor2 * value)
    return torch.Tensor.addcmul_(self, tensor1, tensor2, value=value)
