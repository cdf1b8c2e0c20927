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

A dynamic dim (``*``) is not compared; its value is for relation guards to check:

>>> batch = TensorSpec.of(torch.zeros(8, 4), dynamic_sizes=frozenset({0}))
>>> print(batch)
Tensor(torch.float32, cpu, size=(*, 4), stride=(4, 1))
>>> tensor_mismatch(batch, torch.zeros(12, 4)) is None, tensor_mismatch(batch, torch.zeros(12))
(True, 'size expected (*, 4), got (12,)')
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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
    layouts without strides. A None entry of ``size`` or ``stride`` is a dynamic
    dim: not compared (relation guards check its value; the rank is still
    compared). ``specialized`` holds the dims that were asked to be dynamic but
    kept their size because it was 0 or 1 (as torch specialises those): their
    mismatch says so.

    >>> TensorSpec.of(torch.ones(2, 3).t())
    TensorSpec(cls=<class 'torch.Tensor'>, dtype=torch.float32, device=device(type='cpu'), \
layout=torch.strided, size=(3, 2), stride=(1, 3), requires_grad=False, inference=False, \
conj=False, neg=False, specialized=frozenset())
    """

    cls: type
    dtype: torch.dtype
    device: torch.device
    layout: torch.layout
    size: tuple[int | None, ...]
    stride: tuple[int | None, ...] | None
    requires_grad: bool = False
    inference: bool = False
    conj: bool = False
    neg: bool = False
    specialized: frozenset[int] = frozenset()

    @classmethod
    def of(
        cls,
        t: torch.Tensor,
        dynamic_sizes: Iterable[int] = (),
        dynamic_strides: Iterable[int] = (),
        specialize_zero_one: bool | Iterable[int] = True,
    ) -> TensorSpec:
        """Record the facts of ``t`` (raises ValueError for tensors without sizes, or
        for a dynamic dim out of range), leaving the ``dynamic_sizes`` and
        ``dynamic_strides`` dims unchecked. A dynamic size of 0 or 1 is kept and
        recorded in ``specialized`` unless ``specialize_zero_one`` is False (or, given as
        dims, for the dims it does not name: ``mark_unbacked`` keeps 0 and 1 symbolic).

        >>> TensorSpec.of(torch.zeros(2, requires_grad=True)).requires_grad
        True
        >>> spec = TensorSpec.of(torch.zeros(1, 5, 3), dynamic_sizes=frozenset({0, 1}))
        >>> spec.size, spec.specialized
        ((1, None, 3), frozenset({0}))
        """
        try:
            layout = _torch.layout_of(t)
            size = tuple(_torch.shape_of(t))
            stride = tuple(_torch.stride_of(t)) if layout is torch.strided else None
            flags = (_torch.is_inference(t), _torch.is_conj(t), _torch.is_neg(t))
            dtype, device = _torch.dtype_of(t), _torch.device_of(t)
            grad = _torch.requires_grad_of(t)
        except RuntimeError as error:
            raise ValueError(f"cannot guard this tensor's metadata: {error}") from error
        sizes = _check_dims("dynamic_sizes", dynamic_sizes, len(size))
        strides = _check_dims("dynamic_strides", dynamic_strides, len(size))
        zero_one = (
            sizes if isinstance(specialize_zero_one, bool) and specialize_zero_one
            else frozenset() if isinstance(specialize_zero_one, bool)
            else frozenset(specialize_zero_one)
        )  # fmt: skip
        kept = frozenset(d for d in sizes if d in zero_one and size[d] in (0, 1))
        return cls(
            type(t), dtype, device, layout,
            _loosen(size, sizes - kept),
            None if stride is None else _loosen(stride, strides),
            bool(grad), *flags, specialized=kept,
        )  # fmt: skip

    def __str__(self) -> str:
        flags = [
            name for name in ("requires_grad", "inference", "conj", "neg") if getattr(self, name)
        ]
        parts = [str(self.dtype), str(self.device), f"size={_fmt_ints(self.size)}"]
        if self.stride is not None:
            parts.append(f"stride={_fmt_ints(self.stride)}")
        else:
            parts.append(str(self.layout))
        parts += [f"{flag}=True" for flag in flags]
        parts += [f"specialized={sorted(self.specialized)}"] if self.specialized else []
        return f"{self.cls.__qualname__}({', '.join(parts)})"


def _check_dims(name: str, dims: Iterable[int], rank: int) -> frozenset[int]:
    found = frozenset(dims)
    bad = [d for d in found if type(d) is not int or not 0 <= d < rank]
    if bad:
        dims_text = ", ".join(sorted(map(repr, bad)))
        raise ValueError(f"{name}: dim {dims_text} out of range for a tensor of rank {rank}")
    return found


def _loosen(ints: tuple[int, ...], dims: frozenset[int]) -> tuple[int | None, ...]:
    return tuple(None if d in dims else n for d, n in enumerate(ints))


def _fmt_ints(ints: tuple[int | None, ...]) -> str:
    """``(*, 4)``: a tuple with its dynamic entries as ``*``."""
    text = ", ".join("*" if n is None else str(n) for n in ints)
    return f"({text},)" if len(ints) == 1 else f"({text})"


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


_SPECIALIZED_NOTE = " (sizes 0 and 1 specialise: this dim was marked dynamic)"


def _ints_mismatch(
    name: str,
    want: tuple[int | None, ...],
    got: tuple[int, ...],
    specialized: frozenset[int] = frozenset(),
) -> str | None:
    if len(want) != len(got):
        return f"{name} expected {_fmt_ints(want)}, got {got}"
    for dim, (w, g) in enumerate(zip(want, got, strict=True)):
        if w is not None and w != g:
            note = _SPECIALIZED_NOTE if dim in specialized else ""
            return f"{name}[{dim}] expected {w}, got {g}{note}"
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
    >>> one = TensorSpec.of(torch.zeros(1, 3), dynamic_sizes=frozenset({0}))
    >>> tensor_mismatch(one, torch.zeros(5, 3))
    'size[0] expected 1, got 5 (sizes 0 and 1 specialise: this dim was marked dynamic)'
    """
    if type(t) is not spec.cls or not isinstance(t, torch.Tensor):
        return f"type expected {spec.cls.__qualname__}, got {type(t).__qualname__}"
    size = _ints_mismatch("size", spec.size, tuple(_torch.shape_of(t)), spec.specialized)
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
