"""The fake of a plain tensor input, made directly: what ``FakeTensorMode.from_tensor``
makes of it with static shapes, without torch's meta converter.

``from_tensor`` describes the tensor (its view base, storage, autograd and functorch
state, ...) and rebuilds it as a meta tensor through a memo of storages, so that inputs
that share memory get fakes that share a fake storage: 0.09 ms a tensor idle, 0.15-0.25
ms inside a compile, and a traced graph converts every parameter (12 a hf-gpt2 layer).
For a tensor that needs none of that (a dense leaf of a plain class, not a view, the
only tensor of its storage, which it fills exactly, no gradient, no conjugate or negative
bit) the fake is an empty meta tensor of its layout in the mode (0.016 ms idle), with its
``requires_grad`` and parameter flag; it is recorded in the mode's converter as the
tensor's fake, so a later ``from_tensor`` of it answers the same one. Any other tensor
goes through ``from_tensor``. Capture makes each tensor input of a frame a fake so;
``ember.aotgraph.inputfakes`` is the same for the aot trace's inputs (the two packages
share nothing but torch).

>>> from torch._subclasses import FakeTensorMode
>>> mode = FakeTensorMode(static_shapes=True)
>>> w = torch.nn.Parameter(torch.empty_strided((3, 4), (1, 3)))
>>> is_plain_input(w), is_plain_input(w.detach())  # the detached alias shares its memory
(True, False)
>>> fake = input_fake(mode, w)
>>> fake.shape, fake.stride(), fake.requires_grad, fake.device.type
(torch.Size([3, 4]), (1, 3), True, 'cpu')
>>> isinstance(fake, torch.nn.Parameter), mode.from_tensor(w) is fake
(True, True)
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

__all__ = ["input_fake", "is_plain_input"]

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def is_plain_input(real: torch.Tensor) -> bool:
    """Whether ``from_tensor`` would make ``real`` nothing but an empty tensor of its layout
    (see the module docstring): no state of its own to describe, no memory shared.

    >>> x = torch.ones(2, 3)
    >>> is_plain_input(x), is_plain_input(x[0]), is_plain_input(x.detach())
    (True, False, False)
    """
    if type(real) not in _PLAIN or real.layout is not torch.strided or real.numel() == 0:
        return False
    if real._is_view() or real.is_quantized or real.is_nested or real.is_inference():
        return False
    if real.is_conj() or real.is_neg() or real.storage_offset() != 0:
        return False
    if real.requires_grad and (not real.is_leaf or real.grad_dtype != real.dtype):
        return False
    if real.grad is not None or torch._C._functorch.is_functorch_wrapped_tensor(real):
        return False
    if torch._is_functional_tensor(real):
        return False
    storage = real.untyped_storage()
    # Held by this tensor and the storage object just made: no other tensor aliases it.
    if torch._C._storage_Use_Count(storage._cdata) != 2:
        return False
    extent = 1 + sum((n - 1) * s for n, s in zip(real.shape, real.stride(), strict=True))
    return storage.nbytes() == extent * real.element_size()


def input_fake(mode: FakeTensorMode, real: torch.Tensor) -> torch.Tensor:
    """The fake of ``real`` in ``mode`` with static shapes: made directly when
    :func:`is_plain_input`, else ``mode.from_tensor``; either way the mode's converter
    answers it for ``real`` from now on."""
    known = mode.fake_tensor_converter._get_memo(real)
    if known is not None:
        return known
    if not is_plain_input(real):
        return mode.from_tensor(real, static_shapes=True)
    with torch._C._DisableTorchDispatch():
        meta = torch.empty_strided(real.shape, real.stride(), dtype=real.dtype, device="meta")
        fake = FakeTensor(mode, meta, real.device)
    if real.requires_grad:
        fake.requires_grad_(True)
    if isinstance(real, torch.nn.Parameter):
        fake._is_param = True  # as from_tensor marks it: isinstance(fake, Parameter) holds
    mode.fake_tensor_converter.set_tensor_memo(real, fake)
    return fake
