"""The hot leaf checks: C when ``ember.guards._native`` is built, else Python.

Every function here has the same signature and answer in both versions;
``tests/test_native.py`` holds them to it. Specs are packed into plain tuples
(see :func:`pack_tensor`, :func:`pack_module`) so the C side can read them
with no attribute lookups.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.guards import _torch, settings
from ember.guards.specs import ModuleSpec, TensorSpec

PackedTensor = tuple[Any, ...]
PackedModule = tuple[bool, tuple[tuple[int, ...], ...]]


def pack_tensor(spec: TensorSpec) -> PackedTensor:
    """The tuple layout ``_native.c`` reads (see its header comment)."""
    cpu = spec.device.type == "cpu"
    conj = spec.conj if spec.dtype.is_complex else None
    return (
        spec.cls,
        spec.dtype,
        None if cpu else spec.device,
        spec.layout,
        spec.size,
        spec.stride,
        spec.requires_grad,
        spec.inference,
        conj,
        spec.neg,
    )


def pack_module(spec: ModuleSpec) -> PackedModule:
    """The tuple layout ``_native.c`` reads for a module."""
    return (spec.training, spec.hooks)


def _ints_match(got: tuple[int, ...], want: tuple[int | None, ...]) -> bool:
    """``got == want`` where a None in ``want`` (a dynamic dim) matches any value."""
    if got == want:
        return True
    if None not in want or len(got) != len(want):
        return False
    return all(w is None or w == g for g, w in zip(got, want, strict=True))


def py_tensor_match(packed: PackedTensor, t: object) -> bool:
    """Pure-Python twin of ``_native.tensor_match``."""
    if type(packed) is not tuple or len(packed) != 10:
        raise TypeError("tensor spec must be a packed tuple")
    kind, dtype, device, layout, size, stride, grad, inference, conj, neg = packed
    try:
        return bool(
            type(t) is kind
            and _torch.TensorBase in kind.__mro__
            and _ints_match(_torch.shape_of(t), size)
            and _torch.dtype_of(t) is dtype
            and (_torch.is_cpu(t) is True if device is None else _torch.device_of(t) == device)
            and _torch.layout_of(t) is layout
            and (stride is None or _ints_match(_torch.stride_of(t), stride))
            and _torch.requires_grad_of(t) is grad
            and _torch.is_inference(t) is inference
            and (conj is None or _torch.is_conj(t) is conj)
            and _torch.is_neg(t) is neg
        )
    except Exception:
        return False


def py_tensors_match(specs: tuple[PackedTensor, ...], *tensors: object) -> bool:
    """Pure-Python twin of ``_native.tensors_match``."""
    if len(specs) != len(tensors):
        raise TypeError("expected (specs, *objects) of equal length")
    return all(map(py_tensor_match, specs, tensors))


def py_module_match(packed: PackedModule, module: object) -> bool:
    """Pure-Python twin of ``_native.module_match``: reads the instance dict."""
    if type(packed) is not tuple or len(packed) != 2 or len(packed[1]) != 4:
        raise TypeError("module spec must be a packed tuple")
    training, hooks = packed
    try:
        state = object.__getattribute__(module, "__dict__")
        if state.get("training", None) is not training:
            return False
        for name, ids in zip(_torch.MODULE_HOOK_DICTS, hooks, strict=True):
            found = state[name]
            if not isinstance(found, dict) or len(found) != len(ids) or tuple(found) != ids:
                return False
        return True
    except Exception:
        return False


def py_modules_match(specs: tuple[PackedModule, ...], *modules: object) -> bool:
    """Pure-Python twin of ``_native.modules_match``."""
    if len(specs) != len(modules):
        raise TypeError("expected (specs, *objects) of equal length")
    return all(map(py_module_match, specs, modules))


def py_calls_return(fns: tuple[Callable[[], object], ...], values: tuple[object, ...]) -> bool:
    """Pure-Python twin of ``_native.calls_return``: every ``fn() == value``."""
    if len(fns) != len(values):
        raise TypeError("calls_return(fns, values) takes two tuples of equal length")
    try:
        return all(fn() == value for fn, value in zip(fns, values, strict=True))
    except Exception:
        return False


def py_distinct(*objects: object) -> bool:
    """Pure-Python twin of ``_native.distinct``: no two are the same object."""
    return len({id(obj) for obj in objects}) == len(objects)


def py_size_at(t: object, dim: int) -> int:
    """Pure-Python twin of ``_tensor_match.size_at``: ``t.size(dim)`` read past any
    Python override; raises (TypeError, IndexError) where there is none.

    >>> import torch
    >>> py_size_at(torch.zeros(2, 3), 1)
    3
    """
    if not isinstance(t, _torch.TensorBase) or dim < 0:
        raise TypeError("size_at(tensor, dim >= 0)")
    return _int(_torch.shape_of(t)[dim])


def py_stride_at(t: object, dim: int) -> int:
    """Pure-Python twin of ``_tensor_match.stride_at``: ``t.stride(dim)``, as :func:`py_size_at`.

    >>> import torch
    >>> py_stride_at(torch.zeros(2, 3), 0)
    3
    """
    if not isinstance(t, _torch.TensorBase) or dim < 0:
        raise TypeError("stride_at(tensor, dim >= 0)")
    return _int(_torch.stride_of(t)[dim])


def _int(value: object) -> int:
    if type(value) is not int:  # a symbolic size (a fake tensor's): no value to compare
        raise TypeError(f"size is not an int: {value!r}")
    return value


def storage_layout(tensors: tuple[Any, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(groups, offsets)`` of ``tensors``: ``groups[i]`` is the first index whose tensor shares
    storage with tensor ``i``; ``offsets[i]`` its storage offset if it shares, else -1. When
    none shares (the usual case) both are empty: the check then only compares storages.

    >>> import torch
    >>> x = torch.zeros(4)
    >>> storage_layout((x, torch.zeros(1), x[1:])), storage_layout((x, torch.zeros(1)))
    (((0, 1, 0), (0, -1, 1)), ((), ()))
    """
    first: dict[int, int] = {}
    groups = tuple(first.setdefault(_storage_id(t), i) for i, t in enumerate(tensors))
    shared = {g for i, g in enumerate(groups) if g != i}
    if not shared:
        return (), ()
    offsets = tuple(
        int(t.storage_offset()) if groups[i] in shared else -1 for i, t in enumerate(tensors)
    )
    return groups, offsets


def full_layout(
    layout: tuple[tuple[int, ...], tuple[int, ...]], n: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``layout`` with the empty "none shares" form spelled out for ``n`` tensors.

    >>> full_layout(((), ()), 2)
    ((0, 1), (-1, -1))
    """
    return layout if layout[0] else (tuple(range(n)), (-1,) * n)


def _storage_id(t: Any) -> int:
    """The address of ``t``'s storage; a tensor without one is its own storage."""
    try:
        return int(t.untyped_storage()._cdata)
    except Exception:  # sparse, nested, not a tensor: shares with nothing
        return -id(t) - 1


def py_storage_groups(expected: tuple[tuple[int, ...], tuple[int, ...]], *tensors: object) -> bool:
    """Pure-Python twin of ``_tensor_match.storage_groups``: the tensors share storage exactly
    as ``expected`` (made by :func:`storage_layout`) says, at the same offsets."""
    if not all(isinstance(t, _torch.TensorBase) for t in tensors):
        return False
    return storage_layout(tensors) == expected


def _load_native() -> Any:
    if settings.section.get().pure_python:
        return None
    try:
        from ember.guards import _native
    except ImportError:
        return None
    _native.setup(_torch.TensorBase)
    return _native


def _load_cxx() -> Any:
    if settings.section.get().pure_python or settings.section.get().no_cxx:
        return None
    try:
        from ember.guards import _tensor_match
    except ImportError:
        return None
    return _tensor_match


_NATIVE = _load_native()
#: True when the C accelerator is in use (set EMBER_GUARDS_PURE_PYTHON=1 to turn it off).
NATIVE: bool = _NATIVE is not None
_CXX = _load_cxx()
#: True when tensor checks read torch's C++ tensors directly (``_tensor_match.cpp``,
#: built when torch is importable at build time; EMBER_GUARDS_NO_CXX=1 turns it off).
TENSOR_MATCH_CXX: bool = _CXX is not None

_tensors = _CXX if TENSOR_MATCH_CXX else _NATIVE
tensor_match: Callable[[PackedTensor, object], bool] = (
    _tensors.tensor_match if _tensors is not None else py_tensor_match
)
tensors_match: Callable[..., bool] = (
    _tensors.tensors_match if _tensors is not None else py_tensors_match
)
module_match: Callable[[PackedModule, object], bool] = (
    _NATIVE.module_match if NATIVE else py_module_match
)
modules_match: Callable[..., bool] = _NATIVE.modules_match if NATIVE else py_modules_match
distinct: Callable[..., bool] = _NATIVE.distinct if NATIVE else py_distinct
storage_groups: Callable[..., bool] = _CXX.storage_groups if TENSOR_MATCH_CXX else py_storage_groups
#: Fetchers of the size and stride sources (``TensorSize``, ``TensorStride``): one C++ call
#: (or C, through torch's getters, where the C++ matcher is not built).
_dims = _CXX if TENSOR_MATCH_CXX else _NATIVE
size_at: Callable[[object, int], int] = _dims.size_at if _dims is not None else py_size_at
stride_at: Callable[[object, int], int] = _dims.stride_at if _dims is not None else py_stride_at
calls_return: Callable[[tuple[Callable[[], object], ...], tuple[object, ...]], bool] = (
    _NATIVE.calls_return if NATIVE else py_calls_return
)
