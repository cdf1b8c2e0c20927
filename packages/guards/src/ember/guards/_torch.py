"""Torch facts the guards read: tensor getters and nn.Module's hook dicts.

Calling them through ``TensorBase`` (as ``_native.c`` does in C) means a
tensor subclass that overrides ``shape`` or ``stride`` in Python cannot change
what a guard sees.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

TensorBase: Any = torch._C.TensorBase

_getters: list[Callable[[Any], Any]] = [
    TensorBase.__dict__[name].__get__
    for name in ("dtype", "shape", "device", "layout", "requires_grad", "is_cpu")
]
dtype_of, shape_of, device_of, layout_of, requires_grad_of, is_cpu = _getters
stride_of: Callable[[Any], tuple[int, ...]] = TensorBase.stride
is_inference: Callable[[Any], bool] = TensorBase.is_inference
is_conj: Callable[[Any], bool] = TensorBase.is_conj
is_neg: Callable[[Any], bool] = TensorBase.is_neg

#: The instance dicts that hold an nn.Module's call hooks, in call order
#: (``_native.c`` lists the same names).
MODULE_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_backward_pre_hooks",
    "_backward_hooks",
)
