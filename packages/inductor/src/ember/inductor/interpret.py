"""A reference interpreter for the loop IR, driven by :data:`~ember.inductor.ops.SEMANTICS`.

It evaluates each node over its whole iteration space at once with torch
ops, so tests can check lowering and rewriting apart from code generation.

>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from ember.inductor.lowering import lower_graph
>>> x = torch.arange(6.0).view(2, 3)
>>> prog = lower_graph(make_fx(lambda x: (x * 2).sum(1))(x), [x])
>>> interpret(prog, [x])
[tensor([ 6., 24.])]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch

from ember.inductor.ir import Expr, Extern, I, Pointwise, Program, R, Ref, Scalar
from ember.inductor.ops import REDUCE_INIT, SEMANTICS, Op, Reduce

__all__ = ["interpret"]


def _index(e: sympy.Expr, env: dict[sympy.Symbol, torch.Tensor]) -> torch.Tensor:
    """A sympy index evaluated over int64 tensors."""
    if e.is_Integer:
        return torch.tensor(int(e))
    if e.is_Symbol:
        return env[e]
    if isinstance(e, sympy.floor):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        return torch.div(_index(num, env), _index(den, env), rounding_mode="floor")
    args = [_index(a, env) for a in e.args]
    if isinstance(e, sympy.Add):
        return sum(args[1:], args[0])
    if isinstance(e, sympy.Mul):
        return math.prod(args[1:], start=args[0])
    if isinstance(e, sympy.Mod):
        return torch.remainder(args[0], args[1])
    if isinstance(e, sympy.Min | sympy.Max):
        fn = torch.minimum if isinstance(e, sympy.Min) else torch.maximum
        out = args[0]
        for a in args[1:]:
            out = fn(out, a)
        return out
    raise ValueError(f"cannot evaluate index {e}")


def _eval(
    e: Expr,
    env: dict[sympy.Symbol, torch.Tensor],
    store: dict[str, torch.Tensor],
    memo: dict[int, torch.Tensor],
) -> torch.Tensor:
    if id(e) in memo:
        return memo[id(e)]
    args = [_eval(a, env, store, memo) for a in e.args]
    if e.op is Op.LOAD:
        name, index, indirect = e.arg
        flat = _index(index, env | dict(zip(indirect, args, strict=True)))
        out = store[name][flat]
    elif e.op is Op.CONST:
        out = torch.tensor(e.arg, dtype=e.dtype)
    elif e.op is Op.INDEX:
        out = _index(e.arg, env).to(torch.int64)
    elif e.op is Op.SCALAR:
        out = store[e.arg].to(e.dtype)
    elif e.op is Op.CAST:
        out = args[0].to(e.dtype)
    else:
        out = SEMANTICS[e.op](*args).to(e.dtype)
    memo[id(e)] = out
    return out


def _grid(ranges: Sequence[int], syms: Sequence[sympy.Symbol]) -> dict[sympy.Symbol, torch.Tensor]:
    n = len(ranges)
    return {
        s: torch.arange(r).view([r if j == k else 1 for j in range(n)])
        for k, (s, r) in enumerate(zip(syms[:n], ranges, strict=True))
    }


def _flat_storage(t: torch.Tensor) -> torch.Tensor:
    """A 1-d view of ``t``'s memory from its first element (like a kernel's pointer)."""
    n = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True)) if t.numel() else 0
    return torch.as_strided(t, (n,), (1,))


def interpret(prog: Program, inputs: Sequence[Any]) -> list[Any]:
    """Run ``prog`` on ``inputs`` (tensors, and numbers for its scalars); return its flat
    outputs."""
    store: dict[str, torch.Tensor] = {}
    tensors: dict[str, Any] = {}
    for name, t in [*zip(prog.inputs, inputs, strict=True), *prog.constants.items()]:
        tensors[name] = t
        number = prog.scalars.get(name)
        store[name] = _flat_storage(t) if number is None else torch.tensor(t, dtype=number.dtype)
    for op in prog.scalar_ops:
        value = op.target(*[tensors[a.name] if isinstance(a, Scalar) else a for a in op.args])
        tensors[op.out.name] = value
        store[op.out.name] = torch.tensor(value, dtype=op.out.dtype)
    for node in prog.nodes:
        if isinstance(node, Extern):
            _run_extern(node, tensors, store)
            continue
        buf = prog.buffers[node.name]
        out = torch.empty_strided(buf.layout.sizes, buf.layout.strides, dtype=buf.dtype)
        if isinstance(node, Pointwise):
            value = _eval(node.body, _grid(node.ranges, I), store, {}).expand(node.ranges)
        else:
            value = _reduce(node.kind, node.body, node.ranges, node.reduce_ranges, store)
        out.copy_(value.reshape(buf.layout.sizes))
        tensors[node.name], store[node.name] = out, _flat_storage(out)
    return [_view(o, tensors) for o in prog.outputs]


def _reduce(
    kind: Reduce,
    body: Expr,
    ranges: tuple[int, ...],
    reduce_ranges: tuple[int, ...],
    store: dict[str, torch.Tensor],
) -> torch.Tensor:
    syms = list(I[: len(ranges)]) + list(R[: len(reduce_ranges)])
    full = (*ranges, *reduce_ranges)
    value = _eval(body, _grid(full, syms), store, {}).expand(full)
    value = value.reshape(*ranges, math.prod(reduce_ranges))
    return REDUCE_INIT[kind][0](value)


def _run_extern(node: Extern, tensors: dict[str, Any], store: dict[str, torch.Tensor]) -> None:
    def arg(a: Any) -> Any:
        if isinstance(a, Ref | Scalar):
            return _view(a, tensors)
        if isinstance(a, list | tuple):
            return type(a)(arg(x) for x in a)
        return a

    result = node.target(*arg(node.args), **{k: arg(v) for k, v in node.kwargs.items()})
    leaves = [t for t in torch.utils._pytree.tree_leaves(result) if t is not None]
    for name, t in zip(node.names, leaves, strict=True):
        tensors[name], store[name] = t, _flat_storage(t)


def _view(o: Any, tensors: dict[str, Any]) -> Any:
    if isinstance(o, Scalar):
        return tensors[o.name]
    if not isinstance(o, Ref):
        return o
    t = tensors[o.name]
    if o.layout is None:
        return t
    lay = o.layout
    return torch.as_strided(t, lay.sizes, lay.strides, t.storage_offset() + lay.offset)
