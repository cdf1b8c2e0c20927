"""``reshape``, ``contiguous``, indexing and ``linear`` in a symbolic trace, by expressions.

All are ATen composites: ``reshape`` infers a ``-1``, then runs ``computeStride`` to find
whether a view reaches the new shape (else it copies), ``contiguous`` asks
``is_contiguous``, indexing whether each ``:`` is whole, ``linear`` whether to fold; with
``SymInt`` sizes each step is ``SymNode`` arithmetic in sympy, and under ``make_fx`` each
operation also becomes a graph node that dead-code elimination removes again
(hf-t5-infer's aot trace: 12 ``reshape`` calls, 660 ``SymNode`` operations).
Where the answer follows from the sizes and strides *as expressions*, the same for every
value of the symbols, :class:`SymbolicViews` gives it directly:

- ``reshape`` of a tensor contiguous by its expressions (each stride the product of the
  sizes after it), or to its own shape: ``view``, which ATen's ``reshape`` returns then;
- ``contiguous()`` of a tensor contiguous by its expressions: the tensor itself; of one
  contiguous for no value of the symbols (a transposed attention output): its ``clone``;
- indexing with whole slices, ``None`` and ``...`` (``mask[:, None, None, :]``): one
  ``unsqueeze`` per ``None``, as ATen's indexing records, less its ``slice`` of each
  whole dimension (an identity), whose bounds it compares in ``SymNode`` arithmetic;
- ``F.linear`` without a bias of a contiguous input of 3 or more dims: the ``view``,
  ``mm`` and ``_unsafe_view`` that ``matmul``'s decomposition records for it.

Anything else (a ``-1`` that is no whole product, counts that differ, unbacked sizes,
other layouts) runs torch's composite as before, with its errors and guards. The graph
gets the ``view`` the composite would record; the sizes it reads come from the input's
own sizes where the shape is the input's.

>>> import torch
>>> from torch._subclasses import FakeTensorMode
>>> from torch.fx.experimental.symbolic_shapes import ShapeEnv
>>> mode = FakeTensorMode(shape_env=ShapeEnv())
>>> x = mode.from_tensor(torch.empty(4, 6, 8))  # (s0, s1, s2), contiguous
>>> with mode, SymbolicViews() as views:
...     y = x.reshape(x.shape[0], -1)
...     z = y.contiguous()
>>> y._is_view(), z is y, views.taken
(True, True, 2)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch
from torch._subclasses import FakeTensor
from torch.overrides import TorchFunctionMode

__all__ = ["SymbolicViews", "contiguous_for_every_size"]


class SymbolicViews(TorchFunctionMode):
    """The torch-function mode that answers ``reshape`` and ``contiguous()`` of symbolic
    fakes from their expressions (see the module docstring); ``taken`` counts answers."""

    def __init__(self) -> None:
        super().__init__()
        self.taken = 0

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        rule = RULES.get(func)
        if rule is not None and not kwargs and args and _symbolic(args[0]):
            out = rule(args[0], args[1:])
            if out is not None:
                self.taken += 1
                return out
        return func(*args, **(kwargs or {}))


def _reshape(a: Any, rest: Sequence[Any]) -> Any:
    """``a.reshape(shape)`` where a view reaches it for every value (else None)."""
    shape = list(rest[0]) if len(rest) == 1 and isinstance(rest[0], Sequence) else list(rest)
    sizes, strides, wanted = _exprs(a.shape), _exprs(a.stride()), _exprs(shape)
    if sizes is None or strides is None or wanted is None or any(e == 0 for e in sizes):
        return None
    holes = [k for k, e in enumerate(wanted) if e == -1]
    if len(holes) > 1 or any(isinstance(e, int) and e < 0 for e in wanted if e != -1):
        return None  # torch raises its own error
    if holes:
        known = _product(e for e in wanted if e != -1)
        num, den = sympy.fraction(sympy.sympify(_product(sizes)) / sympy.sympify(known))
        if den != 1:
            return None
        wanted[holes[0]] = num
    if _product(wanted) != _product(sizes):
        return None  # counts that differ: torch's error
    if wanted == sizes:
        return a.view(a.shape)  # its own shape: the same strides, the input's own sizes
    if not contiguous_for_every_size(sizes, strides):
        return None
    return a.view(shape)


def _contiguous(a: Any, rest: Sequence[Any]) -> Any:
    """``a.contiguous()`` where ``a`` is contiguous for every value (the tensor), or is
    contiguous for none (the ``clone`` that ATen's ``contiguous`` records then: a
    transposed ``(b, s, h, d)`` whose ``h`` stride ``s*d`` is never ``d``); else None."""
    sizes, strides = _exprs(a.shape), _exprs(a.stride())
    if rest or sizes is None or strides is None:
        return None
    if contiguous_for_every_size(sizes, strides):
        return a
    if not _never_contiguous(sizes, strides, _lower(a)):
        return None
    return torch.ops.aten.clone.default(a, memory_format=torch.contiguous_format)


def _never_contiguous(sizes: Sequence[Any], strides: Sequence[Any], lower: Any) -> bool:
    """Whether ATen's ``is_contiguous`` is false for every value of the symbols: no size 0,
    and some dimension of a size other than 1 has a stride that differs from the product
    of the sizes inside it for every value (:func:`_always_differ`)."""
    if any(e == 0 for e in sizes):
        return False  # no elements: contiguous
    expected: Any = 1
    for size, stride in zip(reversed(sizes), reversed(strides), strict=True):
        if size == 1:
            continue
        if stride != expected and _always_differ(stride, expected, lower):
            return True
        expected = expected * size
    return False


def _always_differ(x: Any, y: Any, lower: Any) -> bool:
    """``x != y`` for every value of the symbols: both monomials ``c * s0**a * ...`` (``c``
    a whole number >= 1, each symbol at least 2 by ``lower``) whose ratio has no negative
    exponent and exceeds 1 at every symbol's least value (2), or the other way round;
    ember.capture's ``fakestrides`` decides the same way (aotgraph may not import it)."""
    px, py = _monomial(x, lower), _monomial(y, lower)
    if px is None or py is None:
        return (x == 0 and py is not None) or (y == 0 and px is not None)  # 0 and a monomial
    (cx, ex), (cy, ey) = px, py
    exps = {sym: ex.get(sym, 0) - ey.get(sym, 0) for sym in ex.keys() | ey.keys()}
    if all(e >= 0 for e in exps.values()) and cx * 2 ** sum(exps.values()) > cy:
        return True
    return all(e <= 0 for e in exps.values()) and cy * 2 ** -sum(exps.values()) > cx


def _monomial(x: Any, lower: Any) -> tuple[int, dict[Any, int]] | None:
    """``x`` as ``(c, {symbol: exponent})`` with ``c >= 1`` and each symbol at least 2."""
    if type(x) is int:
        return (x, {}) if x >= 1 else None
    coeff, factors = sympy.sympify(x).as_coeff_mul()
    if not coeff.is_Integer or coeff < 1:
        return None
    powers: dict[Any, int] = {}
    for factor in factors:
        base, exp = factor.as_base_exp()
        if not base.is_Symbol or not exp.is_Integer or exp < 1:
            return None
        bound = lower(base)
        if bound is None or not bound >= 2:
            return None
        powers[base] = powers.get(base, 0) + int(exp)
    return int(coeff), powers


def _lower(a: Any) -> Any:
    """A symbol's least value in ``a``'s ShapeEnv (None when it has no range)."""
    ranges = a.fake_mode.shape_env.var_to_range

    def lower(symbol: Any) -> Any:
        found = ranges.get(symbol)
        return None if found is None else found.lower

    return lower


def _index(a: Any, rest: Sequence[Any]) -> Any:
    """``a[index]`` for an index of whole slices, at least one ``None`` and at most one
    ``...``: the ``unsqueeze`` per ``None`` that ATen's indexing records, without asking
    whether each slice is whole (a ``SymNode`` comparison, evaluated in sympy)."""
    (index,) = rest
    items = index if type(index) is tuple else (index,)
    if None not in items or items.count(...) > 1 or not all(map(_whole_or_new, items)):
        return None
    taken = sum(1 for i in items if isinstance(i, slice))
    if taken > a.dim():
        return None  # too many indices: torch's error
    out, d = a, 0
    for item in items:
        if item is ...:
            d += a.dim() - taken
        elif item is None:
            out = out.unsqueeze(d)
            d += 1
        else:
            d += 1
    return out


def _whole_or_new(item: Any) -> bool:
    if item is None or item is ...:
        return True
    return type(item) is slice and item.start is None and item.stop is None and item.step is None


def _linear(x: Any, rest: Sequence[Any]) -> Any:
    """``F.linear(x, w)`` without a bias, for ``x`` of 3 or more dims contiguous by its
    expressions and a matrix ``w``: what ATen's ``linear`` reaches through ``matmul``'s
    decomposition there (``should_fold``: a contiguous input folds its batch into rows),
    ``_unsafe_view(mm(view(x, (rows, k)), w.t()), (*batch, n))``, without asking
    ``should_fold``'s and ``reshape``'s questions in ``SymNode`` arithmetic."""
    if len(rest) == 2 and rest[1] is None:
        rest = rest[:1]  # F.linear(x, w, None), as modules call it
    if len(rest) != 1 or type(rest[0]) is not FakeTensor or rest[0].dim() != 2 or x.dim() < 3:
        return None
    sizes, strides = _exprs(x.shape), _exprs(x.stride())
    if sizes is None or strides is None or any(e == 0 for e in sizes):
        return None
    if not contiguous_for_every_size(sizes, strides):
        return None
    w = rest[0]
    batch = list(x.shape[:-1])
    rows = batch[0]
    for n in batch[1:]:
        rows = rows * n
    folded = x.view(rows, x.shape[-1])
    return torch.ops.aten._unsafe_view(folded.mm(w.t()), [*batch, w.shape[0]])


# torch function -> its answer from expressions (None: torch's composite runs)
RULES: dict[Any, Callable[[Any, Sequence[Any]], Any]] = {
    torch.Tensor.reshape: _reshape,
    torch.reshape: _reshape,
    torch.Tensor.contiguous: _contiguous,
    torch.Tensor.__getitem__: _index,
    torch.nn.functional.linear: _linear,
}


def contiguous_for_every_size(sizes: Sequence[Any], strides: Sequence[Any]) -> bool:
    """Whether ``strides`` (ints and sympy expressions) are the contiguous strides of
    ``sizes`` as expressions, so for every value of the symbols: each stride is the
    product of the sizes after it.

    >>> s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    >>> contiguous_for_every_size((s0, s1, 4), (4 * s1, 4, 1))
    True
    >>> contiguous_for_every_size((s0, s1, 4), (4, 4 * s0, 1))  # transposed
    False
    """
    acc: Any = 1
    for size, stride in zip(reversed(sizes), reversed(strides), strict=True):
        if stride != acc:
            return False
        acc = acc * size
    return True


def _symbolic(x: Any) -> bool:
    return (
        type(x) is FakeTensor
        and x.fake_mode.shape_env is not None
        and x.layout is torch.strided
        and x.constant is None
    )


def _exprs(values: Sequence[Any]) -> list[Any] | None:
    """Each int, or backed ``SymInt``'s expression; None if one is neither."""
    out: list[Any] = []
    for n in values:
        if isinstance(n, torch.SymInt):
            if n.node.hint is None:
                return None  # unbacked: torch's composite has its own path
            out.append(n.node.expr)
        elif type(n) is int:
            out.append(n)
        else:
            return None
    return out


def _product(values: Any) -> Any:
    acc: Any = 1
    for v in values:
        acc = acc * v
    return acc
