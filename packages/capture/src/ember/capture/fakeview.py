"""``view`` of a contiguous fake tensor with symbolic sizes, without torch's reshape algorithm.

torch's fake kernel for ``aten.view`` (and ``aten._unsafe_view``) runs the reference
``_reshape_view_helper``: it infers a ``-1``, checks the element counts, asks whether the
input is contiguous, then builds the result dimension by dimension with ``flatten`` and
``split_dim`` prims, each a fake tensor of its own. With ``SymInt`` sizes every step is
``SymNode`` arithmetic in sympy: 0.9 ms a view against 0.2 ms for the ``as_strided`` that
gives the same tensor, and views are a third of a transformer's ops (hf-t5-infer: 98 in
its aot trace, run once more by capture).

When the input is contiguous *by its expressions* (each stride is the product of the sizes
after it, as sympy expressions, not only for the current sizes) and the element counts are
the same expression, the view's strides are the contiguous strides of the new shape for
every value of the symbols, and it shares the input's offset: :func:`contiguous_view` makes
it with one ``as_strided``. Anything else (a size 0, an unbacked or unknown ``-1``, strides
that are contiguous only for some sizes, a constant-valued fake, counts that differ as
expressions) returns None and torch's kernel runs, with its checks, errors and guards.
torch's algorithm may add a guard on the way (``Ne(s0, s0*s1)`` when it compares a
dimension with a product); the result it reaches is this one whatever the guard says, so
skipping it only spares a check that could not change the graph.

>>> import torch
>>> from torch._subclasses import FakeTensorMode
>>> from torch.fx.experimental.symbolic_shapes import ShapeEnv
>>> mode = FakeTensorMode(shape_env=ShapeEnv())
>>> x = mode.from_tensor(torch.empty(4, 6, 8))  # three symbolic sizes: s0, s1, s2
>>> with mode:
...     y = contiguous_view(x, [x.shape[0], -1])  # the -1 is s1*s2
...     half = contiguous_view(x, [x.shape[0], -1, 2])  # s1*s2/2: not a product, torch decides
>>> y.stride()[0] == x.stride()[0], y.stride()[1], y.storage_offset(), half
(True, 1, 0, None)
>>> [int(n) for n in y.shape]  # today's values of the expressions
[4, 48]
>>> with mode:  # not contiguous for every size: torch's kernel decides
...     contiguous_view(x.transpose(0, 1), [-1])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

from ember.capture.fakestrides import compare_or_none

__all__ = [
    "RESHAPES",
    "SHAPE_VIEWS",
    "contiguous_view",
    "index_view",
    "reshape",
    "shape_view",
    "strided",
    "strided_view",
    "view_strides",
]

aten = torch.ops.aten

# The ops whose fake kernel is torch's ``_view_meta`` (``fake_impls.py``).
RESHAPES = frozenset({aten.view.default, aten._unsafe_view.default})


def contiguous_view(a: Any, shape: Sequence[Any], *, direct: bool = False) -> torch.Tensor | None:
    """``a.view(shape)`` as ``as_strided`` when ``a`` is contiguous for every value of its
    symbols and the counts match as expressions; None to let torch's kernel decide.
    ``direct``: called from the fake mode's own dispatch (see :func:`strided`)."""
    planned = _plan(a, shape)
    if planned is None:
        return None
    env, sizes, wanted = planned
    if [e for e, _ in _values(a.stride()) or ()] != [e for e, _ in _contiguous(sizes)]:
        return None  # not contiguous for every value of the symbols (or unbacked)
    return _as_strided(env, a, shape, wanted, _contiguous(wanted), direct)


def strided(a: Any, sizes: Sequence[Any], strides: Sequence[Any], direct: bool) -> torch.Tensor:
    """The view ``as_strided(a, sizes, strides, a.storage_offset())`` of the fake ``a``.

    ``direct`` (for callers inside the fake mode's ``dispatch``, below autograd): ATen's
    meta kernel on ``a``'s meta self, wrapped as a fake of ``a``'s mode and device, which
    is what torch's fake dispatch does for a view op after its generic steps (flattening
    the arguments, checking for subclasses, other modes' fakes, constants and real-tensor
    propagation, none of which applies to a symbolic fake without a constant). Those
    steps cost 0.18 ms a view against 0.05 ms for the kernel and the wrap (an
    ``(s0, s1, 512)`` input). Outside a dispatch the op goes through torch's dispatcher
    as any other, so that autograd records the view.

    >>> from torch._subclasses import FakeTensorMode
    >>> from torch.fx.experimental.symbolic_shapes import ShapeEnv
    >>> mode = FakeTensorMode(shape_env=ShapeEnv())
    >>> x = mode.from_tensor(torch.empty(4, 6))
    >>> y = strided(x, [x.shape[1], x.shape[0]], [1, x.stride()[0]], direct=True)
    >>> same_storage = y.untyped_storage()._cdata == x.untyped_storage()._cdata
    >>> type(y).__name__, y.fake_mode is mode, same_storage, y.shape == x.mT.shape
    ('FakeTensor', True, True, True)
    """
    offset = a.storage_offset()
    mode = a.fake_mode
    if not direct or mode.propagate_real_tensors:
        return aten.as_strided.default(a, sizes, strides, offset)  # type: ignore[no-any-return]
    with in_kernel_invocation_manager(mode):
        meta = aten.as_strided.default(a, sizes, strides, offset)
    return FakeTensor(mode, meta, a.device)


def strided_view(a: Any, shape: Sequence[Any], *, direct: bool = False) -> torch.Tensor | None:
    """``a.view(shape)`` of a fake of any layout, as ``as_strided``, where ATen's
    ``computeStride`` finds the view for every value of the symbols (each of its
    comparisons decided by :func:`ember.capture.fakestrides.compare_or_none`); None where
    it finds none (torch's kernel raises its error) or the answer depends on the values.

    >>> from torch._subclasses import FakeTensorMode
    >>> from torch.fx.experimental.symbolic_shapes import ShapeEnv
    >>> mode = FakeTensorMode(shape_env=ShapeEnv())
    >>> x = mode.from_tensor(torch.empty(4, 6, 8)).transpose(0, 1)  # (s1, s0, s2)
    >>> with mode:
    ...     y = strided_view(x, [x.shape[0], -1, 1, x.shape[2]])  # a 1 inserted: a view
    ...     z = strided_view(x, [-1, x.shape[2]])  # s1, s0 merged: no view (a copy)
    >>> y.stride() == (x.stride()[0], x.stride()[1], x.shape[2], 1), z  # as torch's kernel
    (True, None)
    """
    decided = _decide(a, shape)
    if decided is None or decided[2] is False:  # undecided; or no view: torch's kernel raises
        return None
    env, wanted, found = decided
    return _as_strided(env, a, shape, wanted, found, direct)


def _decide(a: Any, shape: Sequence[Any]) -> tuple[Any, list[Any], Any] | None:
    """``(env, wanted sizes, strides)`` of ``a`` viewed as ``shape``: strides False where no
    view exists for any value of the symbols; None where that depends on the values."""
    planned = _plan(a, shape)
    if planned is None:
        return None
    env, sizes, wanted = planned
    strides = _values(a.stride())
    found = None if strides is None else view_strides(sizes, strides, wanted, _lower(env))
    return None if found is None else (env, wanted, found)


def reshape(a: Any, shape: Sequence[Any]) -> torch.Tensor | None:
    """``a.reshape(shape)`` as eager makes it, without ATen's composite ``reshape`` (its
    ``SymInt`` arithmetic: infer the size, ``computeStride`` with a guard per comparison,
    2-11 ms a call): the view where ``computeStride`` finds one for every value of the
    symbols (:func:`strided_view`), else ``_unsafe_view`` of a contiguous ``clone``;
    None where that depends on the values or the arguments are not plain (torch decides).
    Call under the fake mode.

    >>> from torch._subclasses import FakeTensorMode
    >>> from torch.fx.experimental.symbolic_shapes import ShapeEnv
    >>> mode = FakeTensorMode(shape_env=ShapeEnv())
    >>> x = mode.from_tensor(torch.empty(4, 6, 8)).transpose(0, 1)  # (s1, s0, s2)
    >>> with mode:
    ...     z = reshape(x, [-1, x.shape[2]])  # no view: a contiguous copy, as eager's
    >>> z._is_view(), z.stride() == (x.shape[2], 1)
    (False, True)
    """
    decided = _decide(a, shape)
    if decided is None:
        return None
    env, wanted, found = decided
    if found is not False:
        return _as_strided(env, a, shape, wanted, found, False)
    out = [_int(env, value, old) for value, old in zip(wanted, shape, strict=True)]
    copy = aten.clone.default(a, memory_format=torch.contiguous_format)
    return aten._unsafe_view.default(copy, out)  # type: ignore[no-any-return]


def _plan(a: Any, shape: Sequence[Any]) -> tuple[Any, list[Value], list[Value]] | None:
    """The ShapeEnv, ``a``'s sizes and the view's sizes (a ``-1`` inferred) as values, when
    the element counts match as expressions and no size is 0; else None."""
    if type(a) is not FakeTensor or a.constant is not None or a.layout is not torch.strided:
        return None
    env = a.fake_mode.shape_env
    if env is None or torch.fx.experimental._config.backed_size_oblivious:
        return None
    sizes, wanted = _values(a.shape), _values(shape)
    if sizes is None or wanted is None or any(e == 0 for e, _ in sizes):
        return None
    numel = _product(sizes)
    holes = [k for k, (e, _) in enumerate(wanted) if e == -1]
    if len(holes) > 1 or any(_negative(e) for e, _ in wanted if e != -1):
        return None  # torch raises its own error
    if holes:
        inferred = _divide(numel, _product(w for w in wanted if w[0] != -1))
        if inferred is None:
            return None
        wanted[holes[0]] = inferred
    count = _product(wanted)
    if count != numel:  # as expressions: a product of sizes has one form in sympy
        return None
    return env, sizes, wanted


def _as_strided(
    env: Any,
    a: Any,
    shape: Sequence[Any],
    wanted: list[Value],
    strides: list[Value],
    direct: bool,
) -> torch.Tensor:
    out = [_int(env, value, old) for value, old in zip(wanted, shape, strict=True)]
    out_strides = [_int(env, value, None) for value in strides]
    return strided(a, out, out_strides, direct)


def _lower(env: Any) -> Any:
    ranges = env.var_to_range

    def lower(symbol: Any) -> Any:
        found = ranges.get(symbol)
        return None if found is None else found.lower

    return lower


def view_strides(
    sizes: Sequence[Value], strides: Sequence[Value], shape: Sequence[Value], lower: Any
) -> list[Value] | Literal[False] | None:
    """ATen's ``computeStride`` (``TensorUtils.cpp``) over ``(expression, hint)`` values, no
    size 0: the view's strides when there is one for every value of the symbols, False
    when there is none for any, None when that depends on the values (or a value is not a
    monomial over symbols at least 2). Each comparison is decided for all values
    (:func:`ember.capture.fakestrides.compare_or_none`), so the branches torch takes at
    today's values, and the strides it builds from them, hold for every value.

    >>> import sympy
    >>> s0 = sympy.Symbol("s0", integer=True, positive=True)
    >>> sizes, strides = [(s0, 4), (8, 8)], [(1, 1), (s0, 4)]  # a transposed (8, s0)
    >>> [e for e, _ in view_strides(sizes, strides, [(s0, 4), (2, 2), (4, 4)], {s0: 2}.get)]
    [1, 4*s0, s0]
    >>> view_strides(sizes, strides, [(8 * s0, 32)], {s0: 2}.get)  # no view: a copy
    False
    """
    if not sizes:
        return [(1, 1)] * len(shape)
    try:
        out: list[Value] = [(0, 0)] * len(shape)
        view_d = len(shape) - 1
        chunk = strides[-1]
        tensor_numel: Value = (1, 1)
        view_numel: Value = (1, 1)
        for d in range(len(sizes) - 1, -1, -1):
            tensor_numel = _times(tensor_numel, sizes[d])
            if d == 0 or (
                not _same(sizes[d - 1], (1, 1), lower)
                and not _same(strides[d - 1], _times(tensor_numel, chunk), lower)
            ):
                while view_d >= 0 and (
                    _less(view_numel, tensor_numel, lower) or _same(shape[view_d], (1, 1), lower)
                ):
                    out[view_d] = _times(view_numel, chunk)
                    view_numel = _times(view_numel, shape[view_d])
                    view_d -= 1
                if not _same(view_numel, tensor_numel, lower):
                    return False
                if d > 0:
                    chunk, tensor_numel, view_numel = strides[d - 1], (1, 1), (1, 1)
        return out if view_d == -1 else False
    except _Undecided:
        return None


class _Undecided(Exception):
    """A comparison whose answer depends on the symbols' values."""


def _times(x: Value, y: Value) -> Value:
    return x[0] * y[0], x[1] * y[1]


def _order(x: Value, y: Value, lower: Any) -> int:
    """-1, 0 or 1 as ``x < y``, ``x == y``, ``x > y`` for every value of the symbols
    (values here are 0 or monomials at least 1)."""
    a, b = x[0], y[0]
    if a == b:
        return 0
    if type(a) is int and type(b) is int:
        return -1 if a < b else 1
    if a == 0 or b == 0:  # the other is a monomial, at least 1: decided if it parses
        if compare_or_none(b if a == 0 else a, 1, lower) is None:
            raise _Undecided
        return -1 if a == 0 else 1
    found = compare_or_none(a, b, lower)
    if found is None:
        raise _Undecided
    return found


def _same(x: Value, y: Value, lower: Any) -> bool:
    return _order(x, y, lower) == 0


def _less(x: Value, y: Value, lower: Any) -> bool:
    return _order(x, y, lower) < 0


Value = tuple[Any, int]  # an expression (int or sympy) and its value now (the hint)


def _values(ints: Sequence[Any]) -> list[Value] | None:
    """``(expression, hint)`` per int or backed SymInt; None if one has no hint."""
    out = []
    for n in ints:
        if isinstance(n, torch.SymInt):
            hint = n.node.hint
            if hint is None:
                return None  # unbacked: torch's kernel has a path of its own for those
            out.append((n.node.expr, int(hint)))
        elif type(n) is int:
            out.append((n, n))
        else:
            return None
    return out


def _contiguous(sizes: Sequence[Value]) -> list[Value]:
    """Row-major strides of ``sizes`` (no size is 0 here)."""
    out, acc = [], (1, 1)
    for s in reversed(sizes):
        out.append(acc)
        acc = (acc[0] * s[0], acc[1] * s[1])
    return out[::-1]


def _product(values: Any) -> Value:
    acc: Value = (1, 1)
    for e, h in values:
        acc = (acc[0] * e, acc[1] * h)
    return acc


def _divide(numel: Value, known: Value) -> Value | None:
    """``numel / known`` when it is a product of the symbols with a whole coefficient
    (``s0*s1*768 / (s0*12)`` is ``64*s1``), else None."""
    import sympy  # type: ignore[import-untyped]

    if known[1] == 0 or numel[1] % known[1] != 0:
        return None
    num, den = sympy.fraction(sympy.sympify(numel[0]) / sympy.sympify(known[0]))
    if den != 1 or not num.is_integer:
        return None
    return (int(num) if num.is_Integer else num), numel[1] // known[1]


def _negative(e: Any) -> bool:
    return isinstance(e, int) and e < 0


def _int(env: Any, value: Value, given: Any) -> Any:
    """``given`` when it is this value already; else an int, or a SymInt of ``env``."""
    expr, hint = value
    if given is not None and _values([given]) == [value]:
        return given
    if isinstance(expr, int) or expr.is_Integer:
        return int(expr)
    return env.create_symintnode(expr, hint=hint)


# -- views whose geometry is a formula of the input's (any layout) --------------------------

INT64_MAX = 9223372036854775807  # a slice's "to the end" (``x[a:]``), as torch passes it


def _unsqueeze(a: Any, dim: int) -> tuple[list[Any], list[Any]] | None:
    """ATen's ``inferUnsqueezeGeometry``: a 1 at ``dim``, stride ``size * stride`` of the
    dimension it goes before (1 at the end)."""
    ndim = a.dim()
    if type(dim) is not int or not -ndim - 1 <= dim <= ndim:
        return None
    dim = dim + ndim + 1 if dim < 0 else dim
    sizes, strides = list(a.shape), list(a.stride())
    stride = 1 if dim == ndim else sizes[dim] * strides[dim]
    return [*sizes[:dim], 1, *sizes[dim:]], [*strides[:dim], stride, *strides[dim:]]


def _full_slice(
    a: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
) -> tuple[list[Any], list[Any]] | None:
    """``x[:]`` along ``dim`` (start 0, to the end, step 1): the input's own geometry."""
    ndim = a.dim()
    if type(dim) is not int or not -ndim <= dim < ndim or step != 1:
        return None
    if start not in (None, 0) or type(start) not in (int, type(None)):
        return None
    if end is not None and (type(end) is not int or end != INT64_MAX):
        return None
    return list(a.shape), list(a.stride())


def _expand(a: Any, size: Sequence[Any], implicit: bool = False) -> Any:
    """ATen's ``inferExpandGeometry`` where no size needs a comparison: a kept dimension
    (``-1`` or the same expression) keeps its stride, a static 1 or a new leading
    dimension gets stride 0, except a new leading 1 (below)."""
    sizes, strides = list(a.shape), list(a.stride())
    new = _values(size)
    old = _values(sizes)
    if new is None or old is None or len(new) < len(old):
        return None
    lead = len(new) - len(old)
    out_sizes: list[Any] = []
    out_strides: list[Any] = []
    for k, (expr, _) in enumerate(new):
        if k < lead:
            if expr == -1 or _negative(expr):
                return None
            out_sizes.append(size[k])
            if type(expr) is not int or expr != 1:
                out_strides.append(0)
                continue
            # A new leading 1: torch's symbolic kernel (``broadcast_in_dim``) gives it the
            # first dimension's size times its stride; eager (``inferExpandGeometry``) the
            # next dimension's, which is the same unless a new dimension other than 1
            # follows (eager: 0), or the input is 0-dim (torch's 1, eager's 0): those
            # are torch's kernel's to make.
            if not old or any(new[j][0] != 1 for j in range(k + 1, lead)):
                return None
            out_strides.append(sizes[0] * strides[0])
            continue
        d = k - lead
        if expr == -1 or expr == old[d][0]:
            out_sizes.append(sizes[d])
            out_strides.append(strides[d])
        elif type(old[d][0]) is int and old[d][0] == 1 and not _negative(expr):
            out_sizes.append(size[k])
            out_strides.append(0)
        else:
            return None  # a size torch compares (and may guard on or reject)
    return out_sizes, out_strides


def index_view(a: Any, index: Any) -> torch.Tensor | None:
    """``a[index]`` for an index of whole slices (``:``), ``None`` and one ``...`` only, as
    one ``as_strided``: ATen's ``applySlicing`` keeps each sliced dimension (a whole
    slice is the dimension itself) and inserts each ``None`` with ``unsqueeze``'s
    geometry. ATen asks whether each slice is whole in ``SymNode`` arithmetic, each a
    sympy evaluation (transformers' masks: ``x[:, None, None, :]``, 2-6 ms a call). None
    for any other index (torch decides, with its errors).

    >>> from torch._subclasses import FakeTensorMode
    >>> from torch.fx.experimental.symbolic_shapes import ShapeEnv
    >>> mode = FakeTensorMode(shape_env=ShapeEnv())
    >>> x = mode.from_tensor(torch.empty(4, 6))
    >>> with mode:
    ...     y = index_view(x, (slice(None), None, ..., None))
    >>> [str(n) for n in y.shape][1:], y.stride()[1] == x.stride()[0], y._is_view()
    (['1', 's...', '1'], True, True)
    """
    if type(a) is not FakeTensor or a.constant is not None or a.layout is not torch.strided:
        return None
    items = index if type(index) is tuple else (index,)
    if not items or not all(_whole_or_new(i) for i in items) or items.count(...) > 1:
        return None
    layout = (*a.shape, *a.stride(), a.storage_offset())
    if not any(isinstance(n, torch.SymInt) for n in layout):
        return None  # static: torch's indexing is quick
    taken = sum(1 for i in items if isinstance(i, slice))
    if taken > a.dim():
        return None  # too many indices: torch's error
    sizes, strides = list(a.shape), list(a.stride())
    d = 0
    for item in items:
        if item is ...:
            d += a.dim() - taken
        elif item is None:
            stride = 1 if d == len(sizes) else sizes[d] * strides[d]
            sizes.insert(d, 1)
            strides.insert(d, stride)
            d += 1
        else:
            d += 1
    return strided(a, sizes, strides, False)


def _whole_or_new(item: Any) -> bool:
    """``:``, ``None`` or ``...`` (``slice(None)`` compares by value, so by its fields)."""
    if item is None or item is ...:
        return True
    return type(item) is slice and item.start is None and item.stop is None and item.step is None


def _permute(a: Any, dims: Any) -> tuple[list[Any], list[Any]] | None:
    """ATen's ``permute``: sizes and strides taken in the order of ``dims`` (each wrapped
    once, a permutation of the dimensions; anything else is torch's to reject)."""
    ndim = a.dim()
    if not isinstance(dims, list | tuple) or len(dims) != ndim:
        return None
    if not all(type(d) is int and -ndim <= d < ndim for d in dims):
        return None
    order = [d + ndim if d < 0 else d for d in dims]
    if sorted(order) != list(range(ndim)):
        return None
    sizes, strides = a.shape, a.stride()
    return [sizes[d] for d in order], [strides[d] for d in order]


def _transpose(a: Any, dim0: Any, dim1: Any) -> tuple[list[Any], list[Any]] | None:
    """ATen's ``transpose``: two dimensions' sizes and strides swapped (the same two: an
    alias with the input's geometry)."""
    ndim = a.dim()
    if ndim == 0 or type(dim0) is not int or type(dim1) is not int:
        return None  # a 0-dim input takes dims 0 and -1: torch's kernel
    if not (-ndim <= dim0 < ndim and -ndim <= dim1 < ndim):
        return None
    order = list(range(ndim))
    order[dim0], order[dim1] = order[dim1], order[dim0]
    return _permute(a, order)


def _t(a: Any) -> tuple[list[Any], list[Any]] | None:
    """ATen's ``t`` of a matrix: ``transpose(0, 1)`` (other ranks: torch's kernel)."""
    return _transpose(a, 0, 1) if a.dim() == 2 else None


# view op -> the output's (sizes, strides) from its arguments, or None (torch decides)
SHAPE_VIEWS: dict[Any, Any] = {
    aten.unsqueeze.default: _unsqueeze,
    aten.slice.Tensor: _full_slice,
    aten.expand.default: _expand,
    aten.permute.default: _permute,
    aten.transpose.int: _transpose,
    aten.t.default: _t,
}


def shape_view(
    func: Any, args: Sequence[Any], kwargs: dict[str, Any], *, direct: bool = False
) -> torch.Tensor | None:
    """The view ``func(*args, **kwargs)`` of a fake with symbolic sizes as one
    ``as_strided``, for the ops of :data:`SHAPE_VIEWS` where their geometry is a formula
    of the input's (ATen's, with no size compared); None to let torch's kernel decide.

    >>> from torch._subclasses import FakeTensorMode
    >>> from torch.fx.experimental.symbolic_shapes import ShapeEnv
    >>> mode = FakeTensorMode(shape_env=ShapeEnv())
    >>> x = mode.from_tensor(torch.empty(4, 6))
    >>> with mode:
    ...     y = shape_view(aten.unsqueeze.default, (x, 1), {})
    ...     z = shape_view(aten.expand.default, (y, [x.shape[0], 3, -1]), {})
    >>> [str(n) for n in y.shape], y.stride()[1] == x.stride()[0], z.stride()[1]
    (['s...', '1', 's...'], True, 0)
    """
    a = args[0] if args else None
    if type(a) is not FakeTensor or a.constant is not None or a.layout is not torch.strided:
        return None
    layout = (*a.shape, *a.stride(), a.storage_offset())
    if not any(isinstance(n, torch.SymInt) for n in layout):
        return None  # static: torch's kernel is quick
    try:
        geometry = SHAPE_VIEWS[func](*args, **kwargs)
    except TypeError:  # arguments this formula does not take: torch's kernel
        return None
    if geometry is None:
        return None
    sizes, strides = geometry
    return strided(a, sizes, strides, direct)
