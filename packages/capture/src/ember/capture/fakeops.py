"""Fake results of a few non-pointwise ops with symbolic sizes, by the formula of their kernel.

After the pointwise ops and views (``fakepointwise``, ``fakeview``), the ops with the most
``SymNode`` arithmetic left in a transformer's first dynamic compile were ones whose output
layout is a fixed formula of the inputs' sizes, computed by torch's fake kernels through
checks, broadcasts and restrides each made of symbolic comparisons (hf-t5-infer, first call,
capture + aot trace): CPU attention (``_scaled_dot_product_flash_attention_for_cpu``, 11
calls, 620 operations), the mask's advanced indexing (``index.Tensor``, 4 calls, 413),
``embedding`` (8 calls, 327), ``arange`` (27 calls, 319), dtype casts (``_to_copy``, 14
calls, 264). :data:`SHORTCUTS` makes each of them directly, under exactly the conditions
where its kernel's answer is that formula for every value of the symbols:

- ``_scaled_dot_product_flash_attention_for_cpu``: ``empty_like(query)`` (query's own
  strides, which ``empty_like`` keeps for a layout that is non-overlapping and dense: here
  when query is a permutation of a contiguous layout by its expressions) and a
  ``(batch, seq, heads)`` float ``logsumexp`` transposed to ``(batch, heads, seq)``; its meta
  kernel checks nothing more.
- ``index.Tensor`` with one integer index tensor per dimension (``mask[b_idx, s_idx]``): the
  indices broadcast (by static 1s only) to the output's sizes, contiguous; the source's
  strides all become 0 in torch's restride, so the order of dimensions is the identity.
- ``embedding`` of an index tensor with at least 2 dims: ``weight[indices]``, contiguous
  ``(*indices.shape, dim)``.
- ``arange(end)`` and ``arange(0, end)`` with a ``SymInt`` end: ``(end,)``, int64 unless a
  dtype is given.
- ``_to_copy`` of a contiguous fake to another dtype (same device, preserve format):
  contiguous, that dtype.

Anything else returns None and torch's kernel runs, with its checks, errors and guards.

>>> import torch
>>> from torch._subclasses import FakeTensorMode
>>> from torch.fx.experimental.symbolic_shapes import ShapeEnv
>>> mode = FakeTensorMode(shape_env=ShapeEnv())
>>> x = mode.from_tensor(torch.empty(4, 6))
>>> shortcut = SHORTCUTS[torch.ops.aten._to_copy.default]
>>> y = shortcut(mode, (x,), {"dtype": torch.float16})
>>> y.dtype, y.shape == x.shape, y.stride() == x.stride()
(torch.float16, True, True)
>>> shortcut(mode, (x.t(),), {"dtype": torch.float16}) is None  # not contiguous: torch decides
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._prims_common import get_computation_dtype
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

from ember.capture.fakestrides import contiguous_in_order, elementwise_order
from ember.capture.fakeview import _values

__all__ = ["SHORTCUTS", "broadcast_sizes"]

aten = torch.ops.aten

Shortcut = Callable[[Any, Sequence[Any], dict[str, Any]], Any]


def _plain(mode: Any, t: Any) -> bool:
    """A strided fake of ``mode`` with backed sizes, no constant value, no conj/neg bit."""
    return (
        type(t) is FakeTensor
        and t.fake_mode is mode
        and t.constant is None
        and t.layout is torch.strided
        and not t.is_conj()
        and not t.is_neg()
        and _values(t.shape) is not None
        and _values(t.stride()) is not None
    )


def _symbolic(*tensors: Any) -> bool:
    return any(isinstance(n, torch.SymInt) for t in tensors for n in t.shape)


def _nonzero(t: Any) -> bool:
    return all(e != 0 for e, _ in _values(t.shape) or [(0, 0)])


def _empty(mode: Any, sizes: Sequence[Any], dtype: torch.dtype, device: Any) -> FakeTensor:
    with in_kernel_invocation_manager(mode):
        meta = torch.empty(sizes, dtype=dtype, device="meta")
    return FakeTensor(mode, meta, device)


def _lower(mode: Any) -> Callable[[Any], Any]:
    ranges = mode.shape_env.var_to_range

    def lower(symbol: Any) -> Any:
        found = ranges.get(symbol)
        return None if found is None else found.lower

    return lower


def _dense_strides(mode: Any, t: Any) -> list[Any] | None:
    """``t``'s strides when it is a permutation of a contiguous layout by its expressions
    (so ``empty_like`` keeps them for every value), no size 1 or 0; else None."""
    sizes, strides = _values(t.shape), _values(t.stride())
    if sizes is None or strides is None or any(e == 0 or e == 1 for e, _ in sizes):
        return None
    exprs = [e for e, _ in sizes]
    order = elementwise_order(exprs, [[e for e, _ in strides]], _lower(mode))
    if order is None or contiguous_in_order(exprs, order) != [e for e, _ in strides]:
        return None
    return list(t.stride())


def _sdpa_cpu(mode: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``_scaled_dot_product_flash_attention_for_cpu``'s meta kernel (see the module)."""
    if len(args) < 3 or not all(_plain(mode, t) for t in args[:3]):
        return None
    query = args[0]
    mask = kwargs.get("attn_mask", args[5] if len(args) > 5 else None)
    if mask is not None and not _plain(mode, mask):
        return None
    if query.dim() != 4 or not _symbolic(query) or query.device.type != "cpu":
        return None
    strides = _dense_strides(mode, query)
    if strides is None:
        return None
    batch, heads, seq = query.shape[:3]
    with in_kernel_invocation_manager(mode):
        out = torch.empty_strided(query.shape, strides, dtype=query.dtype, device="meta")
        lse = torch.empty(
            (batch, seq, heads), dtype=get_computation_dtype(query.dtype), device="meta"
        ).transpose(1, 2)
    return FakeTensor(mode, out, query.device), FakeTensor(mode, lse, query.device)


def _index(mode: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``index.Tensor`` with an integer index tensor for every dimension."""
    if len(args) != 2 or kwargs or not _plain(mode, args[0]):
        return None
    source, indices = args
    if not isinstance(indices, list | tuple) or len(indices) != source.dim() or not indices:
        return None
    if not all(_plain(mode, i) and i.dtype in (torch.int64, torch.int32) for i in indices):
        return None
    if any(i.device != source.device for i in indices) or not _nonzero(source):
        return None
    sizes = _broadcast(indices)
    if sizes is None or not _symbolic(source, *indices):
        return None
    return _empty(mode, sizes, source.dtype, source.device)


def _embedding(mode: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``embedding(weight, indices)``: ``weight[indices]`` for indices of 2+ dims."""
    if len(args) < 2 or not _plain(mode, args[0]) or not _plain(mode, args[1]):
        return None
    weight, indices = args[:2]
    if weight.dim() != 2 or indices.dim() < 2 or indices.dtype not in (torch.int64, torch.int32):
        return None
    if weight.device != indices.device or not _symbolic(weight, indices):
        return None
    if not _nonzero(weight) or not _nonzero(indices):
        return None
    return _empty(mode, [*indices.shape, weight.shape[1]], weight.dtype, weight.device)


def _arange(mode: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``arange(end)`` / ``arange(0, end)`` with a backed ``SymInt`` end."""
    if len(args) == 3 and type(args[2]) is int and args[2] == 1:
        args = args[:2]  # step 1
    if len(args) == 2 and type(args[0]) is int and args[0] == 0:
        args = args[1:]
    if len(args) != 1 or not isinstance(args[0], torch.SymInt):
        return None
    end = args[0]
    if _values([end]) is None:
        return None
    if set(kwargs) - {"dtype", "layout", "device", "pin_memory"}:
        return None
    if kwargs.get("layout") not in (None, torch.strided) or kwargs.get("pin_memory"):
        return None
    dtype = kwargs.get("dtype") or torch.int64
    device = kwargs.get("device") or torch.device("cpu")
    if not isinstance(device, torch.device) or dtype not in (torch.int64, torch.int32):
        return None
    lower = _lower(mode)(end.node.expr)
    if end.node.expr.is_Symbol is not True or lower is None or not lower >= 2:
        return None  # a plain size symbol: torch's length formula gives it back as is
    return _empty(mode, [end], dtype, device)


def _to_copy(mode: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``_to_copy(x, dtype=...)`` of a contiguous ``x``: contiguous, that dtype."""
    from ember.capture.fakepointwise import layout_of

    if len(args) != 1 or not _plain(mode, args[0]) or not _symbolic(args[0]):
        return None
    x = args[0]
    if set(kwargs) - {"dtype", "device", "layout", "pin_memory", "non_blocking", "memory_format"}:
        return None
    if kwargs.get("device") not in (None, x.device) or kwargs.get("pin_memory"):
        return None
    if kwargs.get("layout") not in (None, torch.strided) or kwargs.get("non_blocking"):
        return None
    if kwargs.get("memory_format") not in (None, torch.preserve_format, torch.contiguous_format):
        return None
    dtype = kwargs.get("dtype") or x.dtype
    if not isinstance(dtype, torch.dtype) or layout_of(x) is None:
        return None
    return _empty(mode, list(x.shape), dtype, x.device)


def _constructor(mode: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``empty_strided`` / ``empty`` with symbolic sizes: torch's fake ``constructors``
    implementation (the op on the meta device, wrapped) without its cache's rebuild."""
    ints = [n for a in args if isinstance(a, list | tuple) for n in a]
    if not any(isinstance(n, torch.SymInt) for n in ints) or _values(ints) is None:
        return None
    if set(kwargs) - {"dtype", "layout", "device", "pin_memory", "memory_format"}:
        return None
    if kwargs.get("layout") not in (None, torch.strided) or kwargs.get("pin_memory"):
        return None
    if kwargs.get("memory_format") not in (None, torch.contiguous_format):
        return None
    device = kwargs.get("device") or torch.device("cpu")
    if not isinstance(device, torch.device) or device.type == "meta":
        return None
    if not all(isinstance(a, list | tuple) for a in args):
        return None
    func = aten.empty_strided.default if len(args) == 2 else aten.empty.memory_format
    with in_kernel_invocation_manager(mode):
        meta = func(*args, **{**kwargs, "device": torch.device("meta")})
    return FakeTensor(mode, meta, device)


def _mean(mode: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``mean.dim`` of a contiguous floating fake over listed dims: contiguous, the
    reduced dims dropped or (``keepdim``) 1."""
    from ember.capture.fakepointwise import layout_of

    if not args or not _plain(mode, args[0]) or not _symbolic(args[0]) or kwargs:
        return None
    x, dims, keepdim = args[0], (args[1] if len(args) > 1 else None), False
    if len(args) > 2:
        keepdim = args[2]
    if len(args) > 3 or type(keepdim) is not bool or not isinstance(dims, list | tuple):
        return None
    ndim = x.dim()
    if not dims or not all(type(d) is int and -ndim <= d < ndim for d in dims):
        return None
    dims = sorted({d % ndim for d in dims})
    if len(dims) != len(args[1]) or not x.dtype.is_floating_point or layout_of(x) is None:
        return None
    sizes = [1 if d in dims else n for d, n in enumerate(x.shape) if keepdim or d not in dims]
    return _empty(mode, sizes, x.dtype, x.device)


def _like(mode: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``full_like``/``zeros_like``/``ones_like``/``empty_like`` of a contiguous fake:
    ``empty_like`` keeps a non-overlapping dense layout, here the contiguous one."""
    from ember.capture.fakepointwise import layout_of

    if not args or not _plain(mode, args[0]) or not _symbolic(args[0]) or len(args) > 2:
        return None
    x = args[0]
    if len(args) == 2 and type(args[1]) not in (int, float, bool):
        return None  # full_like's fill value: a number (a SymInt would be traced)
    if set(kwargs) - {"dtype", "layout", "device", "pin_memory", "memory_format"}:
        return None
    if kwargs.get("layout") not in (None, torch.strided) or kwargs.get("pin_memory"):
        return None
    if kwargs.get("memory_format") not in (None, torch.preserve_format, torch.contiguous_format):
        return None
    if kwargs.get("device") not in (None, x.device) or layout_of(x) is None:
        return None
    dtype = kwargs.get("dtype") or x.dtype
    return _empty(mode, list(x.shape), dtype, x.device) if isinstance(dtype, torch.dtype) else None


def _cat(mode: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``cat`` of fakes of one dtype and rank whose other sizes are the same expressions:
    torch's reference concatenates, then clones to the first input's suggested memory
    format, contiguous when its strides are provably not channels-last-like."""
    if kwargs or not args or len(args) > 2 or not isinstance(args[0], list | tuple):
        return None
    tensors, dim = args[0], (args[1] if len(args) == 2 else 0)
    if not tensors or not all(_plain(mode, t) for t in tensors) or type(dim) is not int:
        return None
    first = tensors[0]
    ndim = first.dim()
    if ndim == 0 or not -ndim <= dim < ndim or not _symbolic(*tensors):
        return None
    dim %= ndim
    if any(t.dim() != ndim or t.dtype != first.dtype or t.device != first.device for t in tensors):
        return None
    others = []  # each input's sizes but the concatenated one, as expressions
    for t in tensors:
        sizes = _values(t.shape)
        if sizes is None or any(x == 0 for x, _ in sizes):
            return None
        others.append([x for d, (x, _) in enumerate(sizes) if d != dim])
    if any(o != others[0] for o in others):
        return None  # torch compares them (and may guard or raise)
    if ndim in (4, 5) and not _not_channels_last(mode, first):
        return None
    total = first.shape[dim]
    for t in tensors[1:]:
        total = total + t.shape[dim]
    sizes = [total if d == dim else n for d, n in enumerate(first.shape)]
    return _empty(mode, sizes, first.dtype, first.device)


def _not_channels_last(mode: Any, t: Any) -> bool:
    """Whether torch's ``are_strides_like_channels_last_or_false`` is False for ``t`` for
    every value of the symbols, reached without a guard: a static 0 channel stride, or a
    stride provably below the running minimum of its walk (``[1, 3, 2, 0]`` for 4 dims)."""
    from ember.capture.fakestrides import compare_or_none

    sizes, strides = _values(t.shape), _values(t.stride())
    if sizes is None or strides is None:
        return False
    if strides[1][0] == 0:
        return True
    lower = _lower(mode)
    least: Any = 0
    for d in [1, 3, 2, 0] if t.dim() == 4 else [1, 4, 3, 2, 0]:
        stride = strides[d][0]
        if least != 0:  # nothing is below 0 (strides and sizes here are never negative)
            if stride == 0:
                return True
            order = compare_or_none(stride, least, lower)
            if order == -1:
                return True
            if order is None:
                return False  # torch would decide by the values (and guard)
        if d == 0:
            return False  # channels-last-like but for torch's last check: torch decides
        least = stride * sizes[d][0]
    return False


def _mm(mode: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``mm(a, b)`` whose reduction sizes are one expression: ``meta_mm``'s contiguous
    ``(n, p)`` of ``a``'s dtype (its one check, ``m1 == m2``, holds as expressions)."""
    if len(args) != 2 or kwargs or not all(_plain(mode, t) for t in args):
        return None
    a, b = args
    if a.dim() != 2 or b.dim() != 2 or a.dtype != b.dtype or a.device != b.device:
        return None
    sizes_a, sizes_b = _values(a.shape), _values(b.shape)
    if sizes_a is None or sizes_b is None or sizes_a[1][0] != sizes_b[0][0]:
        return None
    if not _symbolic(a, b) or not _nonzero(a) or not _nonzero(b):
        return None
    return _empty(mode, [a.shape[0], b.shape[1]], a.dtype, a.device)


def _broadcast(tensors: Sequence[Any]) -> list[Any] | None:
    """The sizes ``tensors`` broadcast to where each dimension is one expression or the
    static 1 in every tensor that has it; None where sizes would be compared."""
    found = broadcast_sizes(tensors)
    return None if found is None or 0 in found[1] else found[0]


def broadcast_sizes(tensors: Sequence[Any]) -> tuple[list[Any], list[Any], list[Any]] | None:
    """``(sizes, expressions, each tensor's (expression, value) sizes)`` of ``tensors``
    broadcast, where each dimension is one expression or the static 1 in every tensor that
    has it; None where sizes would be compared (two expressions in one dimension).

    >>> from ember.capture.fakememo import TracerFakeMode
    >>> mode = TracerFakeMode()
    >>> a, b = mode.from_tensor(torch.zeros(3, 1)), mode.from_tensor(torch.zeros(4))
    >>> broadcast_sizes([a, b])[:2]
    ([3, 4], [3, 4])
    """
    ndim = max(t.dim() for t in tensors)
    out: list[Any] = [1] * ndim
    exprs: list[Any] = [1] * ndim
    each = []
    for t in tensors:
        sizes = _values(t.shape)
        if sizes is None:
            return None
        each.append(sizes)
        skip = ndim - t.dim()
        for d, (expr, _) in enumerate(sizes):
            k = skip + d
            if expr == 1:
                continue
            if exprs[k] == 1:
                exprs[k], out[k] = expr, t.shape[d]
            elif exprs[k] != expr:
                return None
    return out, exprs, each


# op -> its shortcut: the fake result, or None to let torch's kernel decide
SHORTCUTS: dict[Any, Shortcut] = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: _sdpa_cpu,
    aten.index.Tensor: _index,
    aten.embedding.default: _embedding,
    aten.arange.default: _arange,
    aten.arange.start: _arange,
    aten.arange.start_step: _arange,
    aten._to_copy.default: _to_copy,
    aten.empty_strided.default: _constructor,
    aten.empty.memory_format: _constructor,
    aten.mean.dim: _mean,
    aten.full_like.default: _like,
    aten.zeros_like.default: _like,
    aten.ones_like.default: _like,
    aten.empty_like.default: _like,
    aten.cat.default: _cat,
    aten.mm.default: _mm,
}
