"""The runtime half of the wrapper: :func:`bind` compiles a wrapper's source (made by
:func:`ember.inductor.wrapper.wrapper_source`) against the loaded kernels and constants.

This module holds what a wrapper calls at run time (``_restride``, ``_take``, the index
checks, :data:`FAST_CALLS`) and needs torch alone: a graph read back from the graph cache or
from a portable pack (``ember.inductor.compiled.from_record``) runs without importing sympy,
the scheduler or the printers.

>>> call = bind("def call(x):\\n    return (_restride(x, (2,), (1,)),)", {}, {}, None)
>>> call(torch.ones(2, 2)[:, 0])
(tensor([1., 1.]),)
"""

from __future__ import annotations

import ctypes
import functools
import os
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ember.inductor import wrapper_launch

__all__ = ["FAST_CALLS", "bind", "pooled_bytes"]


_ERRORS = {"IndexError": IndexError, "RuntimeError": RuntimeError}


def _check_index(t: torch.Tensor, size: int, error: str, message: str, wraps: bool = False) -> None:
    """Raise eager's error if an index in ``t`` is outside ``[0, size)`` (``[-size, size)``
    where negative indices ``wraps``): one C++ pass over a contiguous CPU index, else one
    ``aminmax`` (:func:`wrapper_launch.out_of_range`).

    >>> _check_index(torch.tensor([[0, 3], [2, 1]]).t(), 4, "IndexError", "{index} of {size}")
    >>> _check_index(torch.tensor([0, 4]), 4, "IndexError", "index {index} of {size}")
    Traceback (most recent call last):
    IndexError: index 4 of 4
    >>> _check_index(torch.tensor([-4, 3]), 4, "IndexError", "{index} of {size}", wraps=True)
    """
    bad = wrapper_launch.out_of_range(t, size, -size if wraps else 0)
    if bad is not None:
        raise _ERRORS[error](message.format(index=bad, size=size))


def _check_span(
    low: int, high: int, size: int, error: str, message: str, wraps: bool = False
) -> None:
    """Raise eager's error if indices ``low`` to ``high`` (an ``arange``) leave ``[0, size)``
    (``[-size, size)`` where negative indices ``wraps``)."""
    for bad in (low, high):
        if not (-size if wraps else 0) <= bad < size:
            raise _ERRORS[error](message.format(index=bad, size=size))


class _Pool(list):  # type: ignore[type-arg]
    """A wrapper's sets of intermediate buffers free for its next call (a list that
    :func:`pooled_bytes` can find through a weak reference; one pool is one object)."""

    __hash__ = object.__hash__  # type: ignore[assignment]
    __eq__ = object.__eq__


_POOLS: weakref.WeakSet[_Pool] = weakref.WeakSet()


def pooled_bytes() -> int:
    """Bytes of the intermediate buffers that the live compiled graphs keep between calls
    (each wrapper's pool, at most ``wrapper.POOL_MAX_BYTES`` a graph). They stay allocated
    while the graph lives, so a measure of steady-state memory that counts allocations
    made during a call has to add them (``benchmarks/bench_diffusion.py`` does).

    >>> pooled_bytes() >= 0
    True
    """
    seen: set[int] = set()
    total = 0
    for pool in list(_POOLS):
        for buffers in list(pool):
            for t in buffers:
                if isinstance(t, torch.Tensor):
                    storage = t.untyped_storage()
                    if storage.data_ptr() not in seen:
                        seen.add(storage.data_ptr())
                        total += storage.nbytes()
    return total


def _take(pool: list[Any]) -> Any:
    """A set of buffers from ``pool``, or None (one ``list.pop``: atomic, so threads calling
    the same wrapper never take the same set, nor fail on a pool another emptied)."""
    try:
        return pool.pop()
    except IndexError:
        return None


def _restride_all(
    tensors: tuple[torch.Tensor, ...],
    sizes: tuple[tuple[int, ...], ...],
    strides: tuple[tuple[int, ...], ...],
) -> tuple[torch.Tensor, ...]:
    """``tensors``, each in the layout the kernels were generated for (a copy where its
    strides are other)."""
    return tuple(
        t if t.stride() == want else _restride(t, size, want)
        for t, size, want in zip(tensors, sizes, strides, strict=True)
    )


def _restride(t: torch.Tensor, sizes: tuple[int, ...], strides: tuple[int, ...]) -> torch.Tensor:
    """``t`` copied into the layout the kernels were generated for."""
    if tuple(t.shape) != sizes:
        raise ValueError(f"compiled for size {list(sizes)}, called with {list(t.shape)}")
    out = torch.empty_strided(sizes, strides, dtype=t.dtype, device=t.device)
    return out.copy_(t)


def _leaves(result: Any) -> list[Any]:
    """An extern's tensors, in order (an SDPA's tuple of outputs, a split's list: a flat
    tuple or list of tensors and Nones is read as it is; pytree costs 10-20 us a call)."""
    kind = type(result)
    if (kind is tuple or kind is list) and all(
        t is None or type(t) is torch.Tensor for t in result
    ):
        return [t for t in result if t is not None]
    return [t for t in pytree.tree_leaves(result) if t is not None]


aten = torch.ops.aten

# aten overloads whose torch.* function is the same call, with generated argument parsing
# rather than the schema-driven path of OpOverload (addmm 8.4 -> 5.7 us, mm 5.3 -> 3.7 us;
# a reduction left to aten (lower_alone), 1M floats: x.sum() 92 us, aten.sum 103). Their
# positional arguments are the schema's; a keyword-only one (sum's dtype) is not passed here.
FAST_CALLS: dict[Any, Callable[..., Any]] = {
    aten.mm.default: torch.mm,
    aten.addmm.default: torch.addmm,
    aten.bmm.default: torch.bmm,
    aten.baddbmm.default: torch.baddbmm,
    aten.sum.default: torch.sum,
    aten.sum.dim_IntList: torch.sum,
    aten.mean.dim: torch.mean,
    aten.amax.default: torch.amax,
    aten.amin.default: torch.amin,
    aten.prod.default: torch.prod,
    aten.prod.dim_int: torch.prod,
}


def _callable(value: Any) -> Any:
    """A wrapper constant as called: an OpOverload's own C++ entry point (its ``__call__`` is
    a Python frame around it)."""
    return value._op if isinstance(value, torch._ops.OpOverload) else value


# a number argument's dtype (``truediv:float64``) -> how ctypes passes it
CTYPES: dict[str, Any] = {
    "float64": ctypes.c_double,
    "int64": ctypes.c_int64,
    "bool": ctypes.c_bool,
}


# The wrappers' file name: inside this package's folder, so that a frame hook skipping
# ember's own code (capture's) never compiles a wrapper run inside a compiled function (a
# backward pass that torch.autograd.grad starts there).
WRAPPER_FILENAME = os.path.join(os.path.dirname(os.path.abspath(__file__)), "<wrapper>")


def bind(
    source: str,
    consts: dict[str, Any],
    kernel_args: dict[str, list[str]],
    lib: ctypes.CDLL | None,
    kernels: dict[str, Callable[..., Any]] | None = None,
    device: str | None = None,
) -> Callable[..., Any]:
    """Compile wrapper ``source`` against loaded kernels and its constants; return ``call``.
    ``kernels``: the kernels as Python callables (Triton launchers) instead of ``lib``'s;
    ``device``: where buffers are allocated (default: CPU)."""
    empty = torch.empty_strided
    if device is not None and device != "cpu":
        empty = functools.partial(torch.empty_strided, device=device)
    env: dict[str, Any] = {
        "_empty": empty,
        "_as_strided": torch.as_strided,
        "_restride": _restride,
        "_restride_all": _restride_all,
        "_strides_differ": wrapper_launch.strides_check(),
        "_take": _take,
        "_check_index": _check_index,
        "_check_span": _check_span,
        "_leaves": _leaves,
        "_pool": _Pool(),  # sets of intermediate buffers free for the next call
        **{name: _callable(value) for name, value in consts.items()},
    }
    _POOLS.add(env["_pool"])
    env.update(kernels or {})
    if kernels is None and kernel_args:
        assert lib is not None
        fns = {}
        for name, args in kernel_args.items():
            fn = getattr(lib, name)
            fn.argtypes = [CTYPES[a.split(":")[1]] if ":" in a else ctypes.c_void_p for a in args]
            fn.restype = None
            fns[name] = fn
        env["_launch"], entries = wrapper_launch.kernel_entries(lib, fns, kernel_args)
        env.update(entries)
        if env["_launch"] is wrapper_launch.py_launch:  # no C++ launcher: the ctypes calls
            source = wrapper_launch.inline_launches(source)
    exec(compile(source, WRAPPER_FILENAME, "exec"), env)
    call: Callable[..., Any] = env["call"]
    if "call_boxed" in env:  # (a boxed wrapper: CompiledGraph.call_boxed finds it here)
        call.boxed = env["call_boxed"]  # type: ignore[attr-defined]
    if kernels is not None and device is not None and device.startswith("cuda"):
        return _on_device(call, torch.device(device))
    return call


def _on_device(call: Callable[..., Any], device: torch.device) -> Callable[..., Any]:
    """``call`` with ``device`` current while it runs: Triton launches on the current CUDA
    device, which need not be the one the inputs live on (``cuda:1`` inputs while
    ``cuda:0`` is current)."""
    index = 0 if device.index is None else device.index

    def on_device(*args: Any) -> Any:
        if torch.cuda.current_device() == index:
            return call(*args)
        with torch.cuda.device(index):
            return call(*args)

    return on_device
