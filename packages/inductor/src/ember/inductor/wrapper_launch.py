"""A wrapper's per-tensor work in one call: its inputs' stride check and each kernel launch.

A generated wrapper (:mod:`ember.inductor.wrapper`) checks that each input a kernel reads
has the strides the kernel was generated for, and passes each kernel its tensors' data
pointers. One line per tensor cost more than the kernels of a graph over hundreds of
small tensors (an AdamW step over a model's parameters: 265 stride checks, 477
``data_ptr()`` calls and a ctypes call converting 477 pointers, about 0.15 ms), so the
wrapper makes one call for all of them:

- ``_strides_differ(tensors, strides)``: whether some input's strides are not those the
  kernels assume (then the wrapper copies those into that layout, as before);
- ``_launch(kernel, tensors, *numbers)``: the kernel run on the tensors' data pointers
  and the numbers (sizes, scalars) that follow them in its argument list.

Both are C++ (``ember.inductor._launch``, built against torch's headers when torch is
importable at build time: ``pip install --no-build-isolation``) and read torch's C++
tensors; a kernel's ``<name>_packed`` entry point (:data:`PACKED_CPP`, in every
translation unit) takes its arguments as one array. Without the build, the Python
twins here serve with the same results (the setting ``inductor.pure_launch``,
``EMBER_INDUCTOR_PURE_LAUNCH=1``, chooses them for wrappers bound while it is on):
``map`` over the tensors for the stride check, and each launch line written back as the
kernel's ctypes call with a ``data_ptr()`` per tensor (:func:`inline_launches`).

>>> t = torch.zeros(2, 3)
>>> py_strides_differ((t, t.t()), ((3, 1), (1, 3))), py_strides_differ((t,), ((1, 2),))
(False, True)
>>> kernel_codes(["x_1", "buf0", "lr:float64", "s0:int64"])
'dq'
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ember.inductor import settings

__all__ = [
    "NATIVE",
    "PACKED_CPP",
    "inline_launches",
    "kernel_codes",
    "kernel_entries",
    "native",
    "out_of_range",
    "py_launch",
    "py_out_of_range",
    "py_strides_differ",
    "strides_check",
]

# The packed entry point of each C++ kernel: ``kernel0_packed(const int64_t* a)`` calls
# ``kernel0`` with ``a[i]`` as its i-th argument (a pointer, a double's bits, an int64 or
# a bool), whatever its signature: the template reads the parameter types off the kernel.
PACKED_CPP = r"""#include <type_traits>
#include <utility>
template <typename T> static inline T ember_slot(int64_t v) {
  if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<T>(static_cast<intptr_t>(v));
  } else if constexpr (std::is_floating_point_v<T>) {
    double d;
    std::memcpy(&d, &v, sizeof d);
    return static_cast<T>(d);
  } else {
    return static_cast<T>(v);
  }
}
template <typename... A, std::size_t... I>
static inline void ember_unpack(void (*f)(A...), const int64_t* a, std::index_sequence<I...>) {
  f(ember_slot<A>(a[I])...);
}
template <typename... A>
static inline void ember_call_packed(void (*f)(A...), const int64_t* a) {
  ember_unpack(f, a, std::index_sequence_for<A...>{});
}
#define EMBER_PACKED(k) \
  extern "C" void k##_packed(const int64_t* a) { ember_call_packed(k, a); }
"""

# a number argument's dtype (``lr:float64``) -> its code in ``_launch``'s type codes
CODES: dict[str, str] = {"float64": "d", "int64": "q", "bool": "?"}


def packed_entries(names: Sequence[str]) -> str:
    """The C++ lines defining each kernel's packed entry point (after the kernels)."""
    return "".join(f"EMBER_PACKED({n})\n" for n in names)


def kernel_codes(args: Sequence[str]) -> str:
    """The type codes of a kernel's number arguments, in order (its buffers come first)."""
    return "".join(CODES[a.split(":")[1]] for a in args if ":" in a)


_stride = torch._C.TensorBase.stride
_data_ptr = torch._C.TensorBase.data_ptr


def py_strides_differ(tensors: tuple[Any, ...], strides: tuple[tuple[int, ...], ...]) -> bool:
    """Pure-Python twin of ``_launch.strides_differ``: whether some tensor's strides are not
    the tuple at its index in ``strides``."""
    return tuple(map(_stride, tensors)) != strides


def py_out_of_range(index: Any, size: int, low: int = 0) -> int | None:
    """Pure-Python twin of ``_launch.out_of_range``: the first value of ``index`` outside
    ``[low, size)``, or None.

    >>> py_out_of_range(torch.tensor([0, 3, 7, -1]), 4), py_out_of_range(torch.arange(4), 4)
    (7, None)
    >>> py_out_of_range(torch.tensor([-4, 3, -5]), 4, -4)
    -5
    """
    if not index.numel():
        return None
    # one aminmax in memory order, not ``((t >= 0) & (t < size)).all()``: four passes and two
    # bool tensors took 1.6 ms for 1M int64 indices (aminmax 0.26 ms; along a transposed
    # tensor's strides 2.5 ms)
    strides = index.stride()
    order = sorted(range(index.dim()), key=lambda d: strides[d], reverse=True)
    lowest, highest = torch.aminmax(index.permute(order))
    if int(lowest) >= low and int(highest) < size:
        return None
    return int(index[(index < low) | (index >= size)].flatten()[0])


def out_of_range(index: Any, size: int, low: int = 0) -> int | None:
    """The first value of ``index`` outside ``[low, size)``, or None: one C++ pass over a
    contiguous CPU index from 0, :func:`py_out_of_range` for any other."""
    if NATIVE and low == 0:
        found = _NATIVE.out_of_range(index, size)
        if found is not NotImplemented:
            return found  # type: ignore[no-any-return]
    return py_out_of_range(index, size, low)


def py_launch(kernel: Callable[..., None], tensors: tuple[Any, ...], *numbers: Any) -> None:
    """Pure-Python twin of ``_launch.launch``: ``kernel`` is the ctypes function itself."""
    kernel(*map(_data_ptr, tensors), *numbers)


def _load() -> Any:
    try:
        from ember.inductor import _launch
    except ImportError:
        return None
    return _launch


_NATIVE = _load()
#: True when ``ember.inductor._launch`` (C++) is built here.
NATIVE: bool = _NATIVE is not None


def native() -> bool:
    """Whether wrappers bound now use the C++ launcher: built, and not turned off by the
    setting ``inductor.pure_launch`` (``EMBER_INDUCTOR_PURE_LAUNCH=1``)."""
    return NATIVE and not settings.section.get().pure_launch


def strides_check() -> Callable[[tuple[Any, ...], tuple[Any, ...]], bool]:
    """``_strides_differ`` for a wrapper bound now: C++, or its twin."""
    return _NATIVE.strides_differ if native() else py_strides_differ


# a wrapper's launch line, as ``wrapper._kernel_call`` writes it
_LAUNCH_LINE = re.compile(r"^(\s+)_launch\((\w+), \(([\w, ]*)\)((?:, \w+)*)\)$", re.MULTILINE)


def inline_launches(source: str) -> str:
    """``source`` with each ``_launch(kernel, tensors, *numbers)`` line written as the
    kernel's own ctypes call, as the Python twin makes it: where the C++ launcher does not
    serve, a ``data_ptr()`` per tensor inline costs less than :func:`py_launch`'s frame.

    >>> inline_launches("    _launch(kernel0, (x_1, buf0), ks0)")
    '    kernel0(x_1.data_ptr(), buf0.data_ptr(), ks0)'
    >>> inline_launches("    _launch(kernel1, (buf0,))")  # one tensor, no numbers
    '    kernel1(buf0.data_ptr())'
    """

    def inline(m: re.Match[str]) -> str:
        pointers = [f"{t.strip()}.data_ptr()" for t in m[3].split(",") if t.strip()]
        numbers = [n.strip() for n in m[4].split(",") if n.strip()]
        return f"{m[1]}{m[2]}({', '.join(pointers + numbers)})"

    return _LAUNCH_LINE.sub(inline, source)


def kernel_entries(
    lib: ctypes.CDLL, fns: dict[str, Any], kernel_args: dict[str, list[str]]
) -> tuple[Callable[..., None], dict[str, Any]]:
    """``_launch`` and what the wrapper passes it as each kernel: the address of the
    kernel's packed entry point and its number types (C++ ``launch``), or ``fns[name]``,
    its ctypes function (the twin; also for a library without packed entry points)."""
    if not native():
        return py_launch, fns
    entries = {}
    for name, args in kernel_args.items():
        try:
            packed = getattr(lib, f"{name}_packed")
        except AttributeError:
            return py_launch, fns
        entries[name] = (ctypes.cast(packed, ctypes.c_void_p).value, kernel_codes(args))
    return _NATIVE.launch, entries
