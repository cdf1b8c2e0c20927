"""What a tensor or an ``nn.Module`` must look like for a translation to apply.

A :class:`TensorSpec` records the metadata a ``TENSOR_MATCH`` guard compares,
a :class:`ModuleSpec` the training flag and hooks a ``MODULE_STATE`` guard
compares. The ``*_mismatch`` functions say in words what differs; the
compiled check itself uses the packed forms in ``_accel.py``.

>>> spec = TensorSpec.of(torch.zeros(8, 4))
>>> print(spec)
Tensor(torch.float32, cpu, size=(8, 4), stride=(4, 1))
>>> tensor_mismatch(spec, torch.zeros(12, 4))
'size[0] expected 8, got 12'
>>> tensor_mismatch(spec, torch.zeros(8, 4)) is None
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ember.guards import _torch

__all__ = ["ModuleSpec", "TensorSpec", "module_mismatch", "tensor_mismatch"]

_HOOK_NAMES = ("forward pre-hooks", "forward hooks", "backward pre-hooks", "backward hooks")


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """The tensor facts a ``TENSOR_MATCH`` guard requires.

    ``inference``, ``conj`` and ``neg`` stand for the dispatch keys that
    change what runs: inference tensors have no autograd keys, and the
    conjugate and negative bits add lazy-view keys. ``stride`` is None for
    layouts without strides.

    >>> TensorSpec.of(torch.ones(2, 3).t())
    TensorSpec(cls=<class 'torch.Tensor'>, dtype=torch.float32, device=device(type='cpu'), \
layout=torch.strided, size=(3, 2), stride=(1, 3), requires_grad=False, inference=False, \
conj=False, neg=False)
    """

    cls: type
    dtype: torch.dtype
    device: torch.device
    layout: torch.layout
    size: tuple[int, ...]
    stride: tuple[int, ...] | None
    requires_grad: bool = False
    inference: bool = False
    conj: bool = False
    neg: bool = False

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorSpec:
        """Record the facts of ``t`` (raises ValueError for tensors without sizes).

        >>> TensorSpec.of(torch.zeros(2, requires_grad=True)).requires_grad
        True
        """
        try:
            layout = _torch.layout_of(t)
            return cls(
                type(t),
                _torch.dtype_of(t),
                _torch.device_of(t),
                layout,
                tuple(_torch.shape_of(t)),
                tuple(_torch.stride_of(t)) if layout is torch.strided else None,
                bool(_torch.requires_grad_of(t)),
                _torch.is_inference(t),
                _torch.is_conj(t),
                _torch.is_neg(t),
            )
        except RuntimeError as error:
            raise ValueError(f"cannot guard this tensor's metadata: {error}") from error

    def __str__(self) -> str:
        flags = [
            name for name in ("requires_grad", "inference", "conj", "neg") if getattr(self, name)
        ]
        parts = [str(self.dtype), str(self.device), f"size={self.size}"]
        parts += [f"stride={self.stride}"] if self.stride is not None else [str(self.layout)]
        parts += [f"{flag}=True" for flag in flags]
        return f"{self.cls.__qualname__}({', '.join(parts)})"


# (name in messages, expected, actual): compared in this order after type and sizes.
_TENSOR_FIELDS: tuple[tuple[str, Callable[[TensorSpec], object], Callable[[Any], object]], ...] = (
    ("dtype", lambda spec: spec.dtype, _torch.dtype_of),
    ("device", lambda spec: spec.device, _torch.device_of),
    ("layout", lambda spec: spec.layout, _torch.layout_of),
    ("requires_grad", lambda spec: spec.requires_grad, _torch.requires_grad_of),
    ("inference tensor", lambda spec: spec.inference, _torch.is_inference),
    ("conjugate bit", lambda spec: spec.conj if spec.dtype.is_complex else None,
     lambda t: _torch.is_conj(t) if _torch.dtype_of(t).is_complex else None),
    ("negative bit", lambda spec: spec.neg, _torch.is_neg),
)  # fmt: skip


def _ints_mismatch(name: str, want: tuple[int, ...], got: tuple[int, ...]) -> str | None:
    if len(want) != len(got):
        return f"{name} expected {want}, got {got}"
    for dim, (w, g) in enumerate(zip(want, got, strict=True)):
        if w != g:
            return f"{name}[{dim}] expected {w}, got {g}"
    return None


def tensor_mismatch(spec: TensorSpec, t: object) -> str | None:
    """The first way ``t`` differs from ``spec``, in words; None if it matches.

    >>> spec = TensorSpec.of(torch.zeros(2, 3))
    >>> tensor_mismatch(spec, torch.zeros(2, 3, dtype=torch.float64))
    'dtype expected torch.float32, got torch.float64'
    >>> tensor_mismatch(spec, torch.zeros(3, 2).t())
    'stride[0] expected 3, got 1'
    >>> tensor_mismatch(spec, 1.0)
    'type expected Tensor, got float'
    """
    if type(t) is not spec.cls or not isinstance(t, torch.Tensor):
        return f"type expected {spec.cls.__qualname__}, got {type(t).__qualname__}"
    size = _ints_mismatch("size", spec.size, tuple(_torch.shape_of(t)))
    if size is not None:
        return size
    for name, want, got in _TENSOR_FIELDS[:3]:
        if want(spec) != got(t):
            return f"{name} expected {want(spec)}, got {got(t)}"
    if spec.stride is not None:
        stride = _ints_mismatch("stride", spec.stride, tuple(_torch.stride_of(t)))
        if stride is not None:
            return stride
    for name, want, got in _TENSOR_FIELDS[3:]:
        if want(spec) != got(t):
            return f"{name} expected {want(spec)}, got {got(t)}"
    return None


@dataclass(frozen=True, slots=True)
class ModuleSpec:
    """An ``nn.Module``'s training flag and the ids of its call hooks.

    ``hooks`` holds the handle ids of the forward-pre, forward, backward-pre
    and backward hook dicts, in their order; a translation inlined exactly
    those hooks (usually none).

    >>> print(ModuleSpec.of(torch.nn.Linear(2, 2).eval()))
    eval, no hooks
    """

    training: bool
    hooks: tuple[tuple[int, ...], ...] = ((), (), (), ())

    @classmethod
    def of(cls, module: torch.nn.Module) -> ModuleSpec:
        """Record ``module``'s state, read from its instance dict as nn.Module keeps it.

        >>> ModuleSpec.of(torch.nn.ReLU())
        ModuleSpec(training=True, hooks=((), (), (), ()))
        """
        state = object.__getattribute__(module, "__dict__")
        return cls(
            state["training"], tuple(tuple(state[name]) for name in _torch.MODULE_HOOK_DICTS)
        )

    def __str__(self) -> str:
        count = sum(len(ids) for ids in self.hooks)
        return f"{'training' if self.training else 'eval'}, {count or 'no'} hooks"


def module_mismatch(spec: ModuleSpec, module: object) -> str | None:
    """The first way ``module`` differs from ``spec``, in words; None if it matches.

    >>> module_mismatch(ModuleSpec(training=True), torch.nn.ReLU().eval())
    'training expected True, got False'
    """
    try:
        got = ModuleSpec.of(module)  # type: ignore[arg-type]
    except (AttributeError, KeyError, TypeError) as error:
        return f"expected an nn.Module, got {type(module).__qualname__} ({error!r})"
    if got.training is not spec.training:
        return f"training expected {spec.training}, got {got.training}"
    for name, want, have in zip(_HOOK_NAMES, spec.hooks, got.hooks, strict=True):
        if want != have:
            return f"{name} expected ids {list(want)}, got {list(have)}"
    return None
