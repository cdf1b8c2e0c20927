"""Index checks of gather-like lowerings: eager raises for an index out of range, kernels
clamp, so the wrapper checks an index input before the kernels, an index computed from
positions (``arange``) by its first and last value, and a constant index now.

>>> from ember.inductor.ir import const
>>> idx = Expr(Op.ADD, torch.int64, (Expr(Op.INDEX, torch.int64, (), I[0]), const(1, torch.int64)))
>>> _size_arithmetic(idx)
i0 + 1
"""

from __future__ import annotations

import math
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch
import torch.fx
from torch.utils import _pytree as pytree

from ember.inductor.ir import Expr, I, IndexCheck, Layout
from ember.inductor.lowering import Fallback, Lowerer, Value
from ember.inductor.ops import Op

__all__ = ["checked", "positional"]


def checked(
    ctx: Lowerer, idx: Value, size: int, error: str, message: str, *, wraps: bool = False
) -> None:
    """Check index tensor ``idx`` against ``[0, size)`` as eager does (kernels clamp), or
    against ``[-size, size)`` where negative indices ``wraps`` (``x[i]``): a whole input in
    the wrapper before the kernels, an index computed from positions (``arange``) by its
    ends, an index made of constants (``roll``'s ``arange`` arithmetic) now; any other index
    runs as the aten call, which checks it."""
    low = -size if wraps else 0
    if idx.ref is not None and idx.ref.name in ctx.given and _covers(ctx, idx.ref):
        ctx.index_checks.append(IndexCheck(idx.ref.name, size, error, message, wraps=wraps))
        return
    span = _span(idx)
    if span is not None and ctx.sv is not None:
        if not (_proved(sympy.Ge(span[0], low)) and _proved(sympy.Lt(span[1], size))):
            ctx.index_checks.append(IndexCheck("", size, error, message, span, wraps))
        return
    assert ctx.node is not None
    node = next((a for a in ctx.node.all_input_nodes if ctx.values.get(a) is idx), None)
    value = _constant(node, {}) if node is not None else None
    if value is None or not bool(((value >= low) & (value < size)).all()):
        raise Fallback("an index computed in the graph: the aten call checks its range")


def positional(idx: Value, size: Any) -> Any:
    """``idx``'s value at position ``I[:idx.ndim]`` as a sympy expression, when it is integer
    arithmetic on positions (``arange``, viewed or expanded) proved to lie in ``[0, size)``
    everywhere, else None. A gather by such an index is a view: it reads the table there.

    >>> from ember.inductor.lowering import Value
    >>> ramp = Value((4, 3), torch.int64, lambda ix: Expr(Op.INDEX, torch.int64, (), ix[0] + 1))
    >>> positional(ramp, 5), positional(ramp, 4)
    (i0 + 1, None)
    """
    span = _span(idx)
    if span is None or not (_proved(sympy.Ge(span[0], 0)) and _proved(sympy.Lt(span[1], size))):
        return None
    return sympy.expand(_size_arithmetic(idx.loader(I[: idx.ndim])))


def _span(idx: Value) -> tuple[Any, Any] | None:
    """The lowest and highest value of an index computed from its position alone, affine
    with coefficients >= 0 (``arange(n)``, maybe viewed or expanded), or None."""
    e = _size_arithmetic(idx.loader(I[: idx.ndim]))
    if e is None or 0 in idx.sizes:
        return None
    e = sympy.expand(e)
    low, high = e, e
    for i, n in zip(I, idx.sizes, strict=False):
        c = e.coeff(i)
        if i in c.free_symbols or not (c.is_Integer and c >= 0):
            return None
        low = sympy.sympify(low.xreplace({i: sympy.Integer(0)}))
        high = sympy.sympify(high.xreplace({i: sympy.sympify(n - 1)}))
    if any(i in low.free_symbols | high.free_symbols for i in I):
        return None  # not affine in the index (or another loop's variable)
    return low, high


# integer arithmetic an index computed from positions may do (``arange(n) + 0``)
SIZE_ARITHMETIC = {Op.ADD: sympy.Add, Op.SUB: lambda a, b: a - b, Op.MUL: sympy.Mul}


def _size_arithmetic(e: Expr) -> Any:
    """``e`` as a sympy expression if it is integer arithmetic on positions and constants
    (``INDEX``, int constants, ``SIZE_ARITHMETIC``), else None."""
    if e.dtype not in (torch.int64, torch.int32):
        return None
    if e.op is Op.INDEX:
        return sympy.sympify(e.arg)
    if e.op is Op.CONST:
        return sympy.Integer(e.arg)
    if e.op is Op.CAST:
        return _size_arithmetic(e.args[0])
    fn = SIZE_ARITHMETIC.get(e.op)
    args = [_size_arithmetic(a) for a in e.args]
    return None if fn is None or any(a is None for a in args) else fn(*args)


def _proved(relation: Any) -> bool:
    return relation is sympy.true


def _covers(ctx: Lowerer, ref: Any) -> bool:
    """Whether window ``ref`` reads every element of its buffer (a view or an ``expand``
    of all of it): then checking the buffer checks exactly the indices the op reads."""
    base = ctx.buffers[ref.name].layout
    view = ref.layout
    if view is None:
        return True
    dims = sorted((st, n) for n, st in zip(view.sizes, view.strides, strict=True) if st and n > 1)
    step = 1
    for stride, n in dims:  # dense: each dimension steps over all the ones inside it
        if stride != step:
            return False
        step *= n
    contiguous = base.strides == Layout.contiguous(base.sizes).strides and base.offset == 0
    return contiguous and view.offset == 0 and step == math.prod(base.sizes)


def _constant(node: torch.fx.Node, memo: dict[torch.fx.Node, Any]) -> Any:
    """The value of ``node`` if it depends on no input (a small tensor of constants)."""
    if node in memo:
        return memo[node]
    meta = node.meta.get("val")
    if _symbolic(meta):
        return None  # sized by an input (a symbol): no constant, and asking its size would guard
    small = not isinstance(meta, torch.Tensor) or meta.numel() <= 1 << 16
    target = node.target
    if node.op == "get_attr" and isinstance(target, str) and small:  # a tensor literal
        value = getattr(node.graph.owning_module, target, None)
        if not isinstance(value, torch.Tensor) or value.is_floating_point():
            return None
        return value if value.numel() <= 1 << 16 else None
    if node.op != "call_function" or not small or not isinstance(target, torch._ops.OpOverload):
        return None
    if torch.Tag.nondeterministic_seeded in target.tags:
        return None
    inputs = [_constant(a, memo) for a in node.all_input_nodes]
    if any(v is None for v in inputs):
        return None
    values = dict(zip(node.all_input_nodes, inputs, strict=True))
    args, kwargs = pytree.tree_map_only(torch.fx.Node, values.get, (node.args, node.kwargs))
    try:
        memo[node] = target(*args, **kwargs)
    except Exception:  # eager would raise here too: the aten calls will
        return None
    return memo[node]


def _symbolic(meta: Any) -> bool:
    """A symbolic number, or a tensor with a symbolic size (``dynamic=True`` graphs)."""
    if isinstance(meta, torch.SymInt | torch.SymFloat | torch.SymBool):
        return True
    return isinstance(meta, torch.Tensor) and any(isinstance(n, torch.SymInt) for n in meta.shape)
