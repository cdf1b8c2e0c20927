"""A memo of fake-tensor propagation inside one translation with symbolic sizes.

Every torch operation of a frame runs on fake tensors to learn its result's metadata
(:func:`ember.capture.graphops.graph_call`). With ``SymInt`` sizes that is slow: each
aten op the call decomposes into (``linear``: ``t``, ``view``, ``addmm``, ...) rebuilds
its outputs from ``SymNode`` arithmetic in sympy, about 1 ms each even when torch's own
fake-tensor cache hits. Transformer layers repeat: the same call on inputs with the same
symbolic metadata comes back once per layer. :class:`FakeMemo` remembers the result's
metadata per (operation, inputs' metadata as expressions, global state, what the
``ShapeEnv`` knows) and makes a repeat's result with one ``empty_strided``.

Only calls that are pure functions of that key are remembered: torch's own functions
and tensor methods (no user function, no custom op), whose results are fresh tensors
(no view, no input returned or written, no result requiring grad, no constant-valued
fake) and whose run taught the ``ShapeEnv`` nothing (no guard, replacement, runtime
assertion or symbol added: those change what a later run could decide, so the key
holds a count of each). A repeat then adds no guard that a fresh run would add.

>>> from torch._subclasses import FakeTensorMode
>>> from torch.fx.experimental.symbolic_shapes import ShapeEnv
>>> mode, memo = FakeTensorMode(shape_env=ShapeEnv()), FakeMemo()
>>> with mode:
...     x = torch.empty(4, 3)
...     a = memo.call(mode, "call_method", "sin", (x,), {})
...     b = memo.call(mode, "call_method", "sin", (x,), {})
>>> (memo.hits, memo.misses), a.shape == b.shape, a is b
((1, 1), True, False)
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, in_kernel_invocation_manager

from ember.capture.fakepointwise import layout_of, pointwise_result
from ember.capture.fakestrides import compare_or_none
from ember.capture.fakeview import (
    RESHAPES,
    SHAPE_VIEWS,
    _values,
    contiguous_view,
    index_view,
    reshape,
    shape_view,
    strided_view,
)
from ember.capture.shapes import SYM_TYPES

__all__ = ["FakeMemo", "TracerFakeMode"]

# Modules whose functions compute a result from their arguments alone (no hooks, no
# autograd engine, no user code): torch.autograd.grad, torch.cond, checkpoint are not here.
PURE_MODULES = frozenset(
    {
        "torch",
        "torch.functional",
        "torch.nn.functional",
        "torch._C._nn",
        "torch._C._linalg",
        "torch._C._special",
        "torch._C._fft",
        "torch._C._VariableFunctions",
        "torch._ops.aten",
        "_operator",
    }
)
# Tensor methods that act on more than metadata (their results are no fresh tensors anyway,
# but say so): autograd's engine and hooks, storage sharing.
IMPURE_METHODS = frozenset(
    {"backward", "register_hook", "retain_grad", "record_stream", "share_memory_"}
)
# Python values an argument may hold, keyed by value (a slice is unhashable in 3.11).
PLAIN_TYPES = frozenset(
    {int, float, bool, str, type(None), type(...), torch.dtype, torch.device, torch.layout}
    | {torch.memory_format}
)


class TracerFakeMode(FakeTensorMode):  # type: ignore[no-untyped-call]  # torch: untyped hook
    """The tracer's fake mode: torch's, except that with symbolic sizes a view op does
    not go through torch's fake-tensor dispatch cache.

    That cache stores an op's output as expressions over the inputs' symbols and, on a
    hit, rebuilds it with ``empty_strided`` plus, for a view, ``set_`` onto the input's
    storage; a miss runs the op and then rebuilds its output once to check the entry.
    With ``SymInt`` sizes those rebuilds are ``SymNode`` arithmetic in sympy (storage
    bounds, contiguity), and for a view they cost more than the view's own meta kernel,
    which is what runs instead. First call of hf-gpt2-infer with ``dynamic=True``:
    capture makes 6,467 ``SymNode`` operations instead of 14,061 and takes 0.76 s instead
    of 1.25 s; the aot trace, which runs in this same mode, 8,322 instead of 10,078
    (docs/performance.md). Other ops keep the cache: their repeats in the aot trace hit
    the entries capture made. The cache only memoises, so fakes and guards are the same.
    ``view``/``_unsafe_view`` of an input contiguous for every value of its symbols skip
    torch's kernel too: :func:`ember.capture.fakeview.contiguous_view` makes the result;
    so do ``unsqueeze``, whole-dimension slices and ``expand``
    (:func:`ember.capture.fakeview.shape_view`), and pointwise ops of contiguous inputs
    (:func:`ember.capture.fakepointwise.pointwise_result`), which then skip the cache.

    >>> from torch.fx.experimental.symbolic_shapes import ShapeEnv
    >>> mode = TracerFakeMode(shape_env=ShapeEnv())
    >>> x = mode.from_tensor(torch.empty(4, 6))  # two symbolic sizes
    >>> with mode:
    ...     y = x.transpose(0, 1)  # a view: runs its meta kernel, nothing cached
    ...     n_view = len(mode.shape_env.fake_tensor_cache)
    ...     z = x.softmax(0)  # neither a view nor pointwise: cached as before
    >>> y.shape == (x.shape[1], x.shape[0]), n_view, len(mode.shape_env.fake_tensor_cache)
    (True, 0, 1)
    """

    def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        symbolic = self.shape_env is not None
        # a view of a fake of this mode is made from its meta kernel here (fakeview.strided)
        mine = symbolic and bool(args) and getattr(args[0], "fake_mode", None) is self
        if symbolic and func in RESHAPES and len(args) == 2 and not kwargs:
            out = contiguous_view(args[0], args[1], direct=mine)  # None: torch decides
            if out is None:  # any layout, decided for all sizes
                out = strided_view(args[0], args[1], direct=mine)
            if out is not None:
                return out
        if symbolic and func in SHAPE_VIEWS:
            out = shape_view(func, args, kwargs or {}, direct=mine)  # None: torch decides
            if out is not None:
                return out
        if symbolic:
            out = pointwise_result(self, func, args, kwargs or {})  # None: torch decides
            if out is not None:
                return out
        if not (symbolic and self.cache_enabled and getattr(func, "is_view", False)):
            return super().dispatch(func, types, args, kwargs)
        self.cache_enabled = False  # read by FakeTensorMode.dispatch, this call only
        try:
            return super().dispatch(func, types, args, kwargs)
        finally:
            self.cache_enabled = True


class _NoMemo(Exception):
    """An argument or result the memo cannot key or rebuild exactly."""


@dataclass(frozen=True, slots=True)
class _Made:
    """How to remake one result: a fresh tensor of ``sizes``/``strides``, or a view
    ``(sizes, strides, offset)`` of such a fresh tensor (``linear`` of a 3-d input returns
    a view of its ``addmm``, as in eager)."""

    sizes: tuple[Any, ...]
    strides: tuple[Any, ...]
    dtype: torch.dtype
    device: torch.device
    view: tuple[tuple[Any, ...], tuple[Any, ...], Any] | None = None
    contiguous: bool = False  # strides are the contiguous strides of sizes, as expressions

    def build(self, mode: Any) -> torch.Tensor:
        """A fresh fake of ``mode`` (the active fake mode) with this layout.

        The base tensor is made as torch's fake constructors make one (ATen's meta kernel
        wrapped as a fake), without the dispatch around it: a factory's result is a leaf
        that autograd does not wrap, so nothing above the fake mode adds to it (0.37 ->
        0.19 ms for three symbolic sizes); ``empty`` where the strides are contiguous
        (12 ``SymNode`` operations against ``empty_strided``'s 17, its storage size)."""
        if mode.propagate_real_tensors:
            made = torch.empty_strided(
                self.sizes, self.strides, dtype=self.dtype, device=self.device
            )
        else:
            with in_kernel_invocation_manager(mode):
                if self.contiguous:
                    meta = torch.empty(self.sizes, dtype=self.dtype, device="meta")
                else:
                    meta = torch.empty_strided(
                        self.sizes, self.strides, dtype=self.dtype, device="meta"
                    )
            made = FakeTensor(mode, meta, self.device)
        return made if self.view is None else made.as_strided(*self.view)


@dataclass(frozen=True, slots=True)
class _Result:
    """A remembered result: one tensor, or a tuple/list of them."""

    container: type | None  # tuple or list, None for a single tensor
    made: tuple[_Made, ...]

    def build(self, mode: Any) -> Any:
        """A fresh fake tensor per remembered one (call under the fake mode ``mode``)."""
        out = [m.build(mode) for m in self.made]
        return out[0] if self.container is None else self.container(out)


@dataclass(eq=False)
class FakeMemo:
    """The memo of one translation (see the module docstring)."""

    entries: dict[Any, _Result] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0

    def call(
        self,
        mode: Any,
        kind: str,
        target: Any,
        args: tuple[Any, ...] | list[Any],
        kwargs: dict[str, Any],
    ) -> Any:
        """The result of the graph node ``kind``/``target`` over fake ``args`` (for a
        method, ``args[0]`` is the tensor), or the result remembered for a call with the
        same key; under ``mode``, the tracer's fake mode."""
        if kind == "call_method" and target == "contiguous" and _symbolic_contiguous(args, kwargs):
            if _contiguous_already(args[0]):
                return args[0]  # as eager's contiguous() does, without asking in SymNode arithmetic
            if _never_contiguous(args[0]):  # the copy eager's contiguous() makes then
                return args[0].clone(memory_format=torch.contiguous_format)
        if (kind, target) in RESHAPE_CALLS and not kwargs and _symbolic(args[0]):
            out = reshape(args[0], _shape_arg(args[1:]))  # None: torch's composite decides
            if out is not None:
                return out
        if target is operator.getitem and len(args) == 2 and not kwargs and _symbolic(args[0]):
            out = index_view(args[0], args[1])  # None: torch's indexing decides
            if out is not None:
                return out
        fn = getattr(args[0], target) if kind == "call_method" else target
        call_args = args[1:] if kind == "call_method" else args
        key = _key(mode, kind, target, args, kwargs)
        if key is None:
            return fn(*call_args, **kwargs)
        found = self.entries.get(key)
        if found is not None:
            self.hits += 1
            return found.build(mode)
        self.misses += 1
        tensors = [t for t in _leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        versions = [_version(t) for t in tensors]
        out = fn(*call_args, **kwargs)
        if _epoch(mode) == key[-1] and versions == [_version(t) for t in tensors]:
            result = _result(out, tensors)
            if result is not None:
                self.entries[key] = result
        return out


def _symbolic_contiguous(args: Any, kwargs: dict[str, Any]) -> bool:
    """``x.contiguous()`` (or with the contiguous format) of a strided fake with a symbolic
    size: the call the two tests below answer without ``is_contiguous`` in ``SymNode``
    arithmetic (30 operations a call)."""
    x = args[0]
    if len(args) != 1 or type(x) is not FakeTensor or x.fake_mode.shape_env is None:
        return False
    if kwargs and kwargs != {"memory_format": torch.contiguous_format}:
        return False
    return x.layout is torch.strided and any(isinstance(n, torch.SymInt) for n in x.shape)


def _contiguous_already(x: FakeTensor) -> bool:
    """Whether ``x.contiguous()`` is ``x`` itself for every value of its symbols: its strides
    are its sizes' contiguous strides as expressions (``fakepointwise``'s test)."""
    return layout_of(x) is not None


def _never_contiguous(x: FakeTensor) -> bool:
    """Whether ATen's ``is_contiguous`` is false for every value of ``x``'s symbols: no size
    0, and a dimension of a size other than 1 whose stride differs from the product of the
    sizes inside it for every value (``fakestrides.compare_or_none``), as a transposed
    attention output's does."""
    sizes, strides = _values(x.shape), _values(x.stride())
    env = x.fake_mode.shape_env
    if env is None or sizes is None or strides is None or any(e == 0 for e, _ in sizes):
        return False
    ranges = env.var_to_range

    def lower(symbol: Any) -> Any:
        found = ranges.get(symbol)
        return None if found is None else found.lower

    expected: Any = 1
    for (size, _), (stride, _) in zip(reversed(sizes), reversed(strides), strict=True):
        if size == 1:
            continue
        if stride != expected:
            if stride == 0:
                return True  # a broadcast dimension of a size other than 1
            if compare_or_none(stride, expected, lower) not in (None, 0):
                return True
        expected = expected * size
    return False


# The graph calls that are ``Tensor.reshape`` (ATen's composite ``reshape``).
RESHAPE_CALLS = frozenset(
    {("call_method", "reshape"), ("call_function", torch.reshape)}
    | {("call_function", torch.Tensor.reshape)}
)


def _symbolic(x: Any) -> bool:
    """A fake tensor of a fake mode with a ShapeEnv (its sizes may be symbols)."""
    return type(x) is FakeTensor and x.fake_mode.shape_env is not None


def _shape_arg(rest: Any) -> list[Any]:
    """``reshape``'s sizes, given as one sequence or one argument each (``x.reshape(2, -1)``)."""
    if len(rest) == 1 and isinstance(rest[0], tuple | list | torch.Size):
        return list(rest[0])
    return list(rest)


def _key(mode: Any, kind: str, target: Any, args: Any, kwargs: Any) -> Any:
    """The memo key of a call, or None when it may not be remembered."""
    if mode.shape_env is None or not _pure(kind, target):
        return None
    if torch._C._is_any_autocast_enabled():
        return None  # autocast picks dtypes by its own tables and state
    try:
        inputs = _arg_key((tuple(args), kwargs))
    except _NoMemo:
        return None
    state = (
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        torch.get_default_dtype(),
        torch.are_deterministic_algorithms_enabled(),
    )
    return (kind, target, inputs, state, _epoch(mode))


def _pure(kind: str, target: Any) -> bool:
    if kind == "call_method":
        return isinstance(target, str) and target not in IMPURE_METHODS
    try:
        hash(target)
    except TypeError:
        return False
    return getattr(target, "__module__", None) in PURE_MODULES


def _epoch(mode: Any) -> tuple[int, ...]:
    """What the ShapeEnv knows, counted: a run after a change may decide otherwise."""
    env = mode.shape_env
    return (
        len(env.guards),
        env._replacements_version_counter,
        env.num_deferred_runtime_asserts,
        len(env.var_to_range),
    )


def _arg_key(x: Any) -> Any:
    kind = type(x)
    if kind is FakeTensor:
        return _tensor_key(x)
    if kind is tuple or kind is list:
        return (kind, tuple(_arg_key(i) for i in x))
    if kind is dict:
        return (dict, tuple((k, _arg_key(v)) for k, v in x.items()))
    if kind is slice:
        return (slice, _arg_key(x.start), _arg_key(x.stop), _arg_key(x.step))
    if isinstance(x, SYM_TYPES):
        return (kind, x.node.expr)
    if kind in PLAIN_TYPES:
        return (kind, x)
    raise _NoMemo  # a real tensor, a Parameter subclass, a module, a generator, ...


def _tensor_key(t: FakeTensor) -> Any:
    if t.layout is not torch.strided or t.constant is not None:
        raise _NoMemo  # a constant fake's value can decide a result's shape (x[mask])
    return (
        t.dtype,
        t.device,
        t.requires_grad,
        t.is_inference(),
        t.is_conj(),
        t.is_neg(),
        tuple(_int_key(n) for n in t.shape),
        tuple(_int_key(n) for n in t.stride()),
        _int_key(t.storage_offset()),
    )


def _int_key(n: Any) -> Any:
    return ("s", n.node.expr) if isinstance(n, torch.SymInt) else n


def _leaves(x: Any) -> list[Any]:
    if isinstance(x, tuple | list):
        return [leaf for i in x for leaf in _leaves(i)]
    if isinstance(x, dict):
        return [leaf for v in x.values() for leaf in _leaves(v)]
    return [x]


def _version(t: torch.Tensor) -> int:
    return 0 if t.is_inference() else int(t._version)


def _result(out: Any, inputs: list[torch.Tensor]) -> _Result | None:
    """How to remake ``out`` if it is fresh tensors, or views of fresh tensors."""
    container = type(out) if type(out) in (tuple, list) else None
    outs = list(out) if container is not None else [out]
    storages = {t.untyped_storage()._cdata for t in inputs}
    made = []
    for o in outs:
        if type(o) is not FakeTensor or not _plain(o) or o.requires_grad:
            return None  # a result requiring grad: its grad_fn would be lost
        storage = o.untyped_storage()._cdata
        if storage in storages:
            return None  # an input, a view of one, or two results sharing storage
        storages.add(storage)
        base = o._base if o._is_view() else o
        if type(base) is not FakeTensor or base._is_view() or not _plain(base):
            return None
        if _offset(base) != 0:
            return None
        view = (tuple(o.shape), o.stride(), o.storage_offset()) if base is not o else None
        dense = layout_of(base) is not None  # contiguous by its expressions, no size 0
        made.append(_Made(tuple(base.shape), base.stride(), o.dtype, o.device, view, dense))
    return _Result(container, tuple(made)) if made else None


def _plain(o: FakeTensor) -> bool:
    return (
        o.layout is torch.strided
        and o.constant is None
        and not o.is_conj()
        and not o.is_neg()
        and type(o.storage_offset()) in (int, torch.SymInt)
    )


def _offset(o: FakeTensor) -> Any:
    offset = o.storage_offset()
    return offset if isinstance(offset, int) else None  # symbolic: not remade
