"""The loop IR's invariants, stated once and checked after each pass (``EMBER_CHECK=1``).

>>> from ember.inductor.ir import I, Buffer, Layout, Pointwise, Program, Ref, load
>>> x = Buffer("x", torch.float32, Layout.contiguous((4,)))
>>> bad = Pointwise("buf0", (8,), load(x, (I[0],)))
>>> prog = Program({"x": x, "buf0": Buffer("buf0", torch.float32, Layout.contiguous((8,)))},
...                ["x"], [bad], [Ref("buf0")])
>>> check(prog)
Traceback (most recent call last):
  ...
ember.inductor.check.IRError: buf0: load of x reaches index 7, past its 4 elements
"""

from __future__ import annotations

import sympy  # type: ignore[import-untyped]
import torch

from ember.aotgraph import settings as aot_settings
from ember.inductor.ir import (
    Expr,
    Extern,
    I,
    Node,
    Pointwise,
    Program,
    R,
    Ref,
    Scalar,
    scalars,
    walk,
)
from ember.inductor.ops import BINARY, COMPARE, RANDOM, WELFORD, Op

__all__ = ["IRError", "check", "enabled"]


class IRError(AssertionError):
    """The loop IR broke an invariant; the message names the node."""


def enabled() -> bool:
    """Whether checks run after each pass (``EMBER_CHECK=1``; always on in tests)."""
    return aot_settings.section.get().check


def check(prog: Program) -> None:
    """Raise :class:`IRError` if ``prog`` breaks an invariant of the loop IR."""
    defined = set(prog.inputs) | set(prog.constants)
    sizes = prog.size_vars.int_inputs if prog.size_vars is not None else set()
    for name in prog.inputs:
        if name not in prog.buffers and name not in prog.scalars and name not in sizes:
            raise IRError(f"input {name} has no buffer")
    for op in prog.scalar_ops:
        for leaf in scalars(op.args):
            if leaf.name not in defined:
                raise IRError(f"{op.out.name}: reads the number {leaf.name} before it is defined")
        defined.add(op.out.name)
    for node in prog.nodes:
        _check_node(prog, node, defined)
        for out in _outputs(node):
            if out in defined:
                raise IRError(f"{out}: written twice")
            if out not in prog.buffers:
                raise IRError(f"{out}: written but never declared")
            defined.add(out)
    for out in prog.outputs:
        if isinstance(out, Ref) and out.name not in defined:
            raise IRError(f"output {out.name} is never defined")


def _outputs(node: Node) -> tuple[str, ...]:
    return node.names if isinstance(node, Extern) else (node.name,)


def _check_node(prog: Program, node: Node, defined: set[str]) -> None:
    if isinstance(node, Extern):
        for leaf in node.refs():
            if leaf.name not in defined:
                raise IRError(f"{node.names[0]}: extern reads {leaf.name} before it is defined")
        for number in scalars((node.args, node.kwargs)):
            if number.name not in prog.scalars:
                raise IRError(f"{node.names[0]}: extern reads an unknown number {number.name}")
        return
    name = node.name
    buf = prog.buffers.get(name)
    if buf is None:
        raise IRError(f"{name}: written but never declared")
    if isinstance(node, Pointwise) and tuple(node.ranges) != buf.layout.sizes:
        raise IRError(
            f"{name}: ranges {list(node.ranges)} differ from sizes {list(buf.layout.sizes)}"
        )
    if not isinstance(node, Pointwise) and node.kind in WELFORD:
        if node.body.dtype not in (torch.float32, torch.float64):
            raise IRError(f"{name}: {node.kind.name} of {node.body.dtype}, not float32/float64")
        if buf.dtype != node.body.dtype:
            raise IRError(f"{name}: {node.kind.name} of {node.body.dtype} into {buf.dtype}")
    reduce_ranges = () if isinstance(node, Pointwise) else node.reduce_ranges
    allowed = set(I[: len(node.ranges)]) | set(R[: len(reduce_ranges)])
    allowed |= set(prog.size_vars.sources) if prog.size_vars is not None else set()
    bounds = dict(zip(I, node.ranges, strict=False)) | dict(zip(R, reduce_ranges, strict=False))
    bounds = {v: n for v, n in bounds.items() if isinstance(n, int)}  # symbolic: unchecked
    for e in walk(node.body):
        _check_expr(prog, name, e, defined, allowed, bounds)


def _check_expr(
    prog: Program,
    name: str,
    e: Expr,
    defined: set[str],
    allowed: set[sympy.Symbol],
    bounds: dict[sympy.Symbol, int],
) -> None:
    if e.op is Op.LOAD:
        src, index, indirect = e.arg
        if src not in defined:
            raise IRError(f"{name}: load of {src} before it is defined")
        if prog.buffers[src].dtype != e.dtype:
            raise IRError(
                f"{name}: load of {src} as {e.dtype}, but it holds {prog.buffers[src].dtype}"
            )
        free = index.free_symbols - allowed - set(indirect)
        if free:
            raise IRError(f"{name}: load of {src} uses unbound {sorted(map(str, free))}")
        _check_bounds(prog, name, src, index, bounds)
    elif e.op is Op.SCALAR and prog.scalars.get(e.arg, None) != Scalar(e.arg, e.dtype):
        raise IRError(f"{name}: reads {e.arg} as a {e.dtype} number, which it is not")
    elif e.op is Op.INDEX and e.arg.free_symbols - allowed:
        raise IRError(
            f"{name}: index uses unbound {sorted(map(str, e.arg.free_symbols - allowed))}"
        )
    elif e.op in BINARY and e.args[0].dtype != e.args[1].dtype:
        raise IRError(f"{name}: {e.op.name} mixes {e.args[0].dtype} and {e.args[1].dtype}")
    if e.op in COMPARE | {Op.ISNAN} and e.dtype != torch.bool:
        raise IRError(f"{name}: {e.op.name} must give bool, not {e.dtype}")
    if e.op in RANDOM and (e.dtype != torch.float32 or {a.dtype for a in e.args} != {torch.int64}):
        raise IRError(f"{name}: {e.op.name} takes an int64 seed and offset and gives float32")
    if e.op is Op.WHERE and e.args[0].dtype != torch.bool:
        raise IRError(f"{name}: WHERE condition is {e.args[0].dtype}, not bool")


def _check_bounds(
    prog: Program, name: str, src: str, index: sympy.Expr, bounds: dict[sympy.Symbol, int]
) -> None:
    """Check linear indices against the buffer's extent (others are taken on trust)."""
    syms = sorted(index.free_symbols & set(bounds), key=str)
    if syms and (not index.is_polynomial(*syms) or sympy.Poly(index, *syms).total_degree() > 1):
        return
    if index.free_symbols - set(bounds) or any(n == 0 for n in bounds.values()):
        return
    lo = hi = index.subs({s: 0 for s in bounds})
    for s, n in bounds.items():
        c = index.coeff(s)
        lo += min(0, c * (n - 1))
        hi += max(0, c * (n - 1))
    extent = prog.buffers[src].layout.extent
    if lo < 0:
        raise IRError(f"{name}: load of {src} reaches index {lo}, before its start")
    if hi >= extent:
        raise IRError(f"{name}: load of {src} reaches index {hi}, past its {extent} elements")
