"""The loop IR: buffers with layouts, and the nodes that fill them.

A :class:`Program` is a list of nodes over named :class:`Buffer` s. A
:class:`Pointwise` node writes one value per point of its ``ranges``; a
:class:`Reduction` writes one value per point of ``ranges``, combining its
body over ``reduce_ranges``; an :class:`Extern` calls an aten op. Bodies are
:class:`Expr` DAGs (op, dtype, args, arg) whose loads name a buffer and a flat
sympy index over the node's loop variables ``i0, i1, ...`` (and ``r0, ...``
inside reductions). Nothing here knows about C++ or Triton.

>>> x = Buffer("x", torch.float32, Layout.contiguous((4, 8)))
>>> body = Expr(Op.EXP, torch.float32, (load(x, (I[0], I[1])),))
>>> print(Pointwise("buf0", (4, 8), body))
buf0[4, 8] = EXP(x[8*i0 + i1])
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch

from ember.inductor.ops import Op, Reduce

__all__ = [
    "Buffer",
    "Expr",
    "Extern",
    "I",
    "IndexCheck",
    "Layout",
    "Node",
    "Pointwise",
    "Program",
    "R",
    "Reduction",
    "Ref",
    "Scalar",
    "ScalarOp",
    "const",
    "load",
    "scalar",
    "scalars",
    "walk",
]


def _var(prefix: str, n: int) -> list[sympy.Symbol]:
    return [sympy.Symbol(f"{prefix}{k}", integer=True, nonnegative=True) for k in range(n)]


I = _var("i", 16)  # noqa: E741  loop variables of a node's ranges
R = _var("r", 16)  # loop variables of a reduction's reduce_ranges


@dataclass(frozen=True, slots=True)
class Layout:
    """Sizes and strides (in elements) of a tensor, from ``offset`` into its storage."""

    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @staticmethod
    def contiguous(sizes: Sequence[int]) -> Layout:
        strides: list[Any] = []
        step: Any = 1
        for s in reversed(sizes):
            strides.append(step)
            step *= max(s, 1) if isinstance(s, int) else s  # a symbolic size is >= 2
        return Layout(tuple(sizes), tuple(reversed(strides)))

    def index(self, idx: Sequence[sympy.Expr]) -> sympy.Expr:
        """The flat storage index of the point ``idx``."""
        terms = [i * s for i, s, n in zip(idx, self.strides, self.sizes, strict=True) if n != 1]
        return sympy.sympify(self.offset) + sympy.Add(*terms)

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    @property
    def extent(self) -> int:
        """Elements of storage the layout reaches, from index 0."""
        if self.numel == 0:
            return 0
        return (
            self.offset
            + 1
            + sum((n - 1) * s for n, s in zip(self.sizes, self.strides, strict=True))
        )


@dataclass(frozen=True, slots=True)
class Buffer:
    """A named tensor of the program: a graph input, a node's output or an extern result."""

    name: str
    dtype: torch.dtype
    layout: Layout


@dataclass(frozen=True, slots=True)
class Expr:
    """One node of a body DAG. ``arg``: LOAD (buffer, index, indirect symbols), CONST value,
    INDEX sympy expression; ``args`` are the operands (for LOAD, the indirect indices)."""

    op: Op
    dtype: torch.dtype
    args: tuple[Expr, ...] = ()
    arg: Any = None
    _hash: int = field(default=0, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.op, self.dtype, self.args, self.arg)))

    def __hash__(self) -> int:
        return self._hash

    def __str__(self) -> str:
        if self.op is Op.LOAD:
            return f"{self.arg[0]}[{self.arg[1]}]"
        if self.op is Op.CONST:
            return repr(self.arg)
        if self.op is Op.INDEX:
            return f"({self.arg})"
        if self.op is Op.SCALAR:
            return f"${self.arg}"
        inner = ", ".join(str(a) for a in self.args)
        return f"{self.op.name}{'.' + _short(self.dtype) if self.op is Op.CAST else ''}({inner})"


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def load(buf: Buffer, idx: Sequence[sympy.Expr], layout: Layout | None = None) -> Expr:
    """Load ``buf`` at the point ``idx`` of ``layout`` (default: the buffer's own)."""
    flat = sympy.expand((layout or buf.layout).index(idx))
    return Expr(Op.LOAD, buf.dtype, (), (buf.name, flat, ()))


class NegativeZero(float):
    """-0.0, unequal to 0.0 (a float's ``==`` says they are equal). Constants are keys of
    the printers' memo of shared subexpressions: as floats, ``x + 0.0`` and ``x + -0.0``
    were one expression, and the second gave +0.0 for x = -0.0.

    >>> const(-0.0, torch.float32) == const(0.0, torch.float32), str(const(-0.0, torch.float32))
    (False, '-0.0')
    """

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NegativeZero)

    def __ne__(self, other: object) -> bool:
        return not isinstance(other, NegativeZero)

    def __hash__(self) -> int:
        return hash("-0.0")

    def __repr__(self) -> str:
        return "-0.0"


def const(value: float | int | bool, dtype: torch.dtype) -> Expr:
    """The number ``value`` as a body leaf of ``dtype`` (-0.0 kept apart from 0.0)."""
    if isinstance(value, float) and value == 0 and math.copysign(1.0, value) < 0:
        value = NegativeZero(value)
    return Expr(Op.CONST, dtype, (), value)


def scalar(s: Scalar) -> Expr:
    """The run-time number ``s`` as a body leaf."""
    return Expr(Op.SCALAR, s.dtype, (), s.name)


def map_indices(e: Expr, fix: Callable[[sympy.Expr], sympy.Expr]) -> Expr:
    """``e`` with the index of every LOAD and INDEX passed through ``fix`` (shared
    subexpressions stay shared).

    >>> x = Buffer("x", torch.float32, Layout.contiguous((8,)))
    >>> str(map_indices(load(x, (I[0],)), lambda i: i + 1))
    'x[i0 + 1]'
    """
    memo: dict[int, Expr] = {}

    def visit(n: Expr) -> Expr:
        if id(n) in memo:
            return memo[id(n)]
        args = tuple(visit(a) for a in n.args)
        arg = n.arg
        if n.op is Op.LOAD:
            arg = (arg[0], fix(arg[1]), arg[2])
        elif n.op is Op.INDEX:
            arg = fix(arg)
        out = dataclasses.replace(n, args=args, arg=arg)
        memo[id(n)] = out
        return out

    return visit(e)


def walk(e: Expr) -> Iterator[Expr]:
    """Every distinct node of the DAG under ``e``, operands before users."""
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(e, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in seen:
            continue
        if done:
            seen.add(id(node))
            yield node
            continue
        stack.append((node, True))
        stack.extend((a, False) for a in reversed(node.args) if id(a) not in seen)


@dataclass(frozen=True, slots=True)
class Pointwise:
    """``name[i] = body(i)`` for every point ``i`` of ``ranges``."""

    name: str
    ranges: tuple[int, ...]
    body: Expr

    def __str__(self) -> str:
        return f"{self.name}{list(self.ranges)} = {self.body}"


@dataclass(frozen=True, slots=True)
class Reduction:
    """``name[i] = kind over r of body(i, r)``; ARGMAX/ARGMIN give the flat index of r."""

    name: str
    ranges: tuple[int, ...]
    reduce_ranges: tuple[int, ...]
    kind: Reduce
    body: Expr

    def __str__(self) -> str:
        reduce = f"{self.kind.name}{list(self.reduce_ranges)}"
        return f"{self.name}{list(self.ranges)} = {reduce}({self.body})"


@dataclass(frozen=True, slots=True)
class Ref:
    """A tensor argument of an extern call or an output: ``name`` seen through ``layout``."""

    name: str
    layout: Layout | None = None  # None: the buffer's own layout

    def __str__(self) -> str:
        if self.layout is None:
            return self.name
        lay = self.layout
        return f"{self.name}<{list(lay.sizes)}:{list(lay.strides)}+{lay.offset}>"


@dataclass(frozen=True, slots=True)
class Scalar:
    """A number known only at run time: a float (or int) graph input, or arithmetic on such.
    Kernels receive it as an argument, so one compiled graph serves every value."""

    name: str
    dtype: torch.dtype  # float64, int64 or bool: the C type kernels take it as

    def __str__(self) -> str:
        return f"${self.name}"


@dataclass(frozen=True, slots=True)
class ScalarOp:
    """``name = target(*args)`` on numbers (``Scalar`` leaves or constants), run by the wrapper
    before the first kernel: Python arithmetic such as ``1.0 / (1.0 + max(a, b))``."""

    out: Scalar
    target: Any
    args: tuple[Any, ...]

    def __str__(self) -> str:
        shown = ", ".join(str(a) for a in self.args)
        return f"{self.out} = {getattr(self.target, '__name__', self.target)}({shown})"


@dataclass(frozen=True, slots=True)
class IndexCheck:
    """Before the first kernel, the wrapper checks that every element of input ``name`` lies
    in ``[0, size)`` (``[-size, size)`` where ``wraps``: ``x[i]`` counts negative indices
    from the end) and raises ``error`` (eager's exception type and message) if not: kernels
    clamp indices to stay in memory, and eager raises."""

    name: str
    size: int
    error: str  # "IndexError" or "RuntimeError"
    message: str
    # (lowest, highest) index when the index is computed from sizes (``arange(n)``), not
    # read from input ``name``: the wrapper checks those two numbers
    span: tuple[Any, Any] | None = None
    wraps: bool = False

    def __str__(self) -> str:
        what = self.name if self.span is None else f"{self.span[0]}..{self.span[1]}"
        low = f"-{self.size}" if self.wraps else "0"
        return f"check {low} <= {what} < {self.size} else {self.error}"


@dataclass(frozen=True, slots=True)
class Extern:
    """``names = target(*args, **kwargs)`` with :class:`Ref` leaves, run by aten."""

    names: tuple[str, ...]  # output buffers, in the order the result flattens
    target: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def refs(self) -> list[Ref]:
        """The buffers the call reads, in argument order."""
        return _refs((self.args, self.kwargs))

    def __str__(self) -> str:
        shown = ", ".join(str(a) for a in self.args)
        return f"{', '.join(self.names)} = extern {self.target}({shown})"


def scalars(tree: object) -> list[Scalar]:
    """The :class:`Scalar` leaves of an argument tree."""
    if isinstance(tree, Scalar):
        return [tree]
    if isinstance(tree, list | tuple):
        return [r for t in tree for r in scalars(t)]
    if isinstance(tree, dict):
        return [r for t in tree.values() for r in scalars(t)]
    return []


def _refs(tree: object) -> list[Ref]:
    if isinstance(tree, Ref):
        return [tree]
    if isinstance(tree, list | tuple):
        return [r for t in tree for r in _refs(t)]
    if isinstance(tree, dict):
        return [r for t in tree.values() for r in _refs(t)]
    return []


Node = Pointwise | Reduction | Extern


@dataclass
class Program:
    """A graph lowered to loop IR: buffers, the nodes that fill them, the outputs."""

    buffers: dict[str, Buffer]
    inputs: list[str]  # one name per graph input: a buffer, or a scalar of ``scalars``
    nodes: list[Node]
    outputs: list[Any]  # Ref, Scalar or a Python constant, in the graph's flat output order
    out_spec: Any = None  # pytree spec that rebuilds the graph's output structure
    constants: dict[str, torch.Tensor] = field(default_factory=dict)  # get_attr tensors
    scalars: dict[str, Scalar] = field(default_factory=dict)  # run-time numbers, by name
    scalar_ops: list[ScalarOp] = field(default_factory=list)  # computed first, in this order
    index_checks: list[IndexCheck] = field(default_factory=list)  # run before the kernels
    # the size symbols (``ember.inductor.symbolic.SizeVars``) of a graph traced with symbolic
    # sizes: sizes, strides and indices may then be sympy expressions over them
    size_vars: Any = None

    def __str__(self) -> str:
        lines = [f"inputs: {', '.join(self.inputs)}"]
        numbers = [self.scalars[n] for n in self.inputs if n in self.scalars]
        lines += [f"  {s.name}: {_short(s.dtype)} number" for s in numbers]
        for b in self.buffers.values():
            lines.append(
                f"  {b.name}: {_short(b.dtype)}{list(b.layout.sizes)}"
                f" strides {list(b.layout.strides)}"
            )
        lines += [str(op) for op in self.scalar_ops]
        lines += [str(c) for c in self.index_checks]
        lines += [str(n) for n in self.nodes]
        lines.append(f"outputs: {', '.join(str(o) for o in self.outputs)}")
        return "\n".join(lines)
