"""Symbolic sizes: the graph's size symbols, where the wrapper reads them, and how they print.

A graph traced with symbolic shapes (``make_fx(tracing_mode="symbolic")``, or
``ember.aotgraph`` under ``dynamic=True``) carries ``torch.SymInt`` sizes in its
placeholders' ``meta["val"]``. :func:`size_vars` names each symbol that an input
exposes directly (a size, a stride or an int input) as a kernel argument ``ks<n>``
and records where the wrapper reads it at call time. Every other size is a sympy
expression over those symbols, so one build serves every size. Nothing here calls
``int()`` on a symbolic size or adds a guard to the ShapeEnv: the example values
(hints) serve heuristics only.

>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> gm = make_fx(lambda x: x.exp(), tracing_mode="symbolic")(torch.randn(5, 3))
>>> sv = size_vars(gm, [torch.randn(5, 3)])
>>> list(sv.sources.values()), sorted(sv.hints.values())
([('x_1', 'size', 0), ('x_1', 'size', 1)], [3, 5])
>>> rows, cols = sv.sources
>>> sv.sym(gm.graph.find_nodes(op="placeholder")[0].meta["val"].numel()) == rows * cols
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch
import torch.fx
import torch.utils._sympy.functions as tfn

__all__ = ["FloatSize", "SizeVars", "Unsupported", "hint", "is_static", "pyexpr", "size_vars"]


class Unsupported(Exception):
    """A size that the kernels cannot take symbolically (an unbound or unbacked symbol, an
    operation on sizes with no C++ counterpart here)."""


Source = tuple[str, str, int]  # (input name, "size" | "stride" | "int", dim)


@dataclass
class SizeVars:
    """The graph's size symbols: where each is read at call time, its example value."""

    sources: dict[sympy.Symbol, Source] = field(default_factory=dict)
    hints: dict[sympy.Symbol, int] = field(default_factory=dict)
    by_torch: dict[sympy.Symbol, sympy.Symbol] = field(default_factory=dict)  # s0 -> ks0
    int_inputs: dict[str, Any] = field(default_factory=dict)  # int input -> its size expression

    def bind(self, torch_sym: sympy.Symbol, source: Source, hint_value: int) -> None:
        if torch_sym in self.by_torch:
            return
        mine = sympy.Symbol(f"k{torch_sym.name}", integer=True, positive=True)
        self.by_torch[torch_sym] = mine
        self.sources[mine] = source
        self.hints[mine] = hint_value  # an int: int() of a SymInt would add a guard

    def sym(self, value: Any) -> Any:
        """``value`` (int, SymInt or torch sympy expression) over this graph's symbols: an
        int when constant, else a sympy expression. Raises :class:`Unsupported`."""
        if isinstance(value, bool):
            raise Unsupported("a bool where a size was expected")
        if isinstance(value, int):
            return value
        if isinstance(value, torch.SymInt):
            value = value.node.expr
        if not isinstance(value, sympy.Basic):
            raise Unsupported(f"a {type(value).__name__} where a size was expected")
        out = self._convert(value)
        return int(out) if out.is_Integer else out

    def _convert(self, e: sympy.Expr) -> sympy.Expr:
        if e.is_Integer:
            return e
        if e.is_Symbol:
            if e in self.sources:  # converted already
                return e
            if e not in self.by_torch:
                raise Unsupported(f"size symbol {e} is not an input's size, stride or int")
            return self.by_torch[e]
        rule = CONVERT.get(type(e))
        if rule is None:
            raise Unsupported(f"size expression {e} ({type(e).__name__})")
        return rule(*[self._convert(a) for a in e.args])


@dataclass(frozen=True, slots=True)
class FloatSize:
    """``float(size)`` of a symbolic size (``torch.sym_float(x.numel())`` in a mean): a Python
    float to type promotion, the size converted to the computation dtype in kernels."""

    size: Any  # sympy expression over the size symbols

    def __str__(self) -> str:
        return f"float({self.size})"


def _pow(base: sympy.Expr, exp: sympy.Expr) -> sympy.Expr:
    if not (exp.is_Integer and int(exp) >= 0):
        raise Unsupported(f"size expression {base}**{exp}")
    return base**exp


# torch's size functions -> plain sympy over non-negative integers (sizes never go negative)
CONVERT: dict[type, Callable[..., sympy.Expr]] = {
    sympy.Add: lambda *a: sympy.Add(*a),
    sympy.Mul: lambda *a: sympy.Mul(*a),
    sympy.Pow: _pow,
    tfn.PowByNatural: _pow,
    tfn.FloorDiv: lambda a, b: sympy.floor(a / b),  # a // b
    tfn.CleanDiv: lambda a, b: sympy.floor(a / b),  # exact a / b, as a // b
    tfn.Mod: sympy.Mod,
    tfn.PythonMod: sympy.Mod,
    sympy.Mod: sympy.Mod,
    tfn.ModularIndexing: lambda x, d, m: sympy.Mod(sympy.floor(x / d), m),  # (x // d) % m
    tfn.Max: lambda *a: sympy.Max(*a),
    tfn.Min: lambda *a: sympy.Min(*a),
}


def _symbol_of(value: Any) -> sympy.Symbol | None:
    """The symbol ``value`` is, if it is one that may stand for any size >= 2. Lowerings treat
    a symbol as never 0 or 1 (a broadcast dimension is a literal 1): one whose range allows
    those stays unbound, so its graph runs as aten calls."""
    if not isinstance(value, torch.SymInt) or not value.node.expr.is_Symbol:
        return None
    expr, env = value.node.expr, value.node.shape_env
    bounds = env.var_to_range.get(expr)
    return expr if bounds is not None and bounds.lower >= 2 else None


def _hint_of(value: torch.SymInt) -> int | None:
    expr, env = value.node.expr, value.node.shape_env
    table = getattr(env, "backed_var_to_val", None)  # torch 2.13's name (var_to_val: older)
    got = (table if table is not None else env.var_to_val).get(expr)
    return None if got is None else int(got)


def size_vars(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> SizeVars | None:
    """The size symbols of ``gm``'s inputs, or None when every input size is static."""
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    sv, symbolic = SizeVars(), False
    for node, example in zip(places, example_inputs, strict=True):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool):
            symbolic = True
        if (s := _symbol_of(val)) is not None:
            real = example if type(example) is int else _hint_of(val)
            if real is not None:
                sv.bind(s, (node.name, "int", 0), real)
        if not isinstance(val, torch.Tensor):
            continue
        real_strides = example.stride() if isinstance(example, torch.Tensor) else None
        for kind, dims, real_dims in (
            ("size", val.shape, getattr(example, "shape", None)),
            ("stride", val.stride(), real_strides),
        ):
            for d, n in enumerate(dims):
                if (s := _symbol_of(n)) is None:
                    continue
                symbolic = True
                real = real_dims[d] if real_dims is not None else None
                real = real if type(real) is int else _hint_of(n)  # type: ignore[arg-type]
                # (a fake example's size is a SymInt: its hint, never int() of it)
                if real is not None:
                    sv.bind(s, (node.name, kind, d), real)
    return sv if symbolic else None


def is_static(value: Any) -> bool:
    """No symbol in ``value`` (a size, a tuple of sizes, or a sympy expression).

    >>> is_static((4, 8)), is_static((sympy.Symbol("ks0"), 8))
    (True, False)
    """
    if isinstance(value, tuple | list):
        return all(is_static(v) for v in value)
    return not isinstance(value, sympy.Basic) or not value.free_symbols


def hint(value: Any, hints: dict[sympy.Symbol, int]) -> int:
    """``value`` at the example sizes: for heuristics only (parallel or not, tiles).

    >>> k = sympy.Symbol("ks0")
    >>> hint(4 * k + 1, {k: 3}), hint(7, {})
    (13, 7)
    """
    if isinstance(value, int):
        return value
    return int(value.xreplace({s: hints.get(s, 64) for s in value.free_symbols}))


def pyexpr(e: Any) -> str:
    """A size expression as Python over the wrapper's variables (``//`` and ``%``).

    >>> k = sympy.Symbol("ks0", integer=True, positive=True)
    >>> pyexpr(sympy.Mod(sympy.floor(k / 3), 2) + 1)
    '(1 + ((ks0 // 3) % 2))'
    """
    if isinstance(e, int) or (isinstance(e, sympy.Basic) and e.is_Integer):
        return str(int(e))
    if e.is_Symbol:
        return str(e.name)
    if isinstance(e, sympy.Add):
        return "(" + " + ".join(pyexpr(a) for a in e.args) + ")"
    if isinstance(e, sympy.Mul):
        return "*".join(pyexpr(a) for a in e.args)
    if isinstance(e, sympy.Pow) and e.args[1].is_Integer and int(e.args[1]) >= 0:
        return f"{_operand(e.args[0])}**{int(e.args[1])}"
    if isinstance(e, sympy.floor):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        return f"({_operand(num)} // {_operand(den)})"
    if isinstance(e, sympy.Mod):
        return f"({_operand(e.args[0])} % {_operand(e.args[1])})"
    if isinstance(e, sympy.Min | sympy.Max):
        fn = "min" if isinstance(e, sympy.Min) else "max"
        return f"{fn}({', '.join(pyexpr(a) for a in e.args)})"
    raise Unsupported(f"cannot print size {e}")


def _operand(e: Any) -> str:
    """``pyexpr(e)``, parenthesised unless it is one name or number (``*`` binds as ``//``)."""
    text = pyexpr(e)
    if isinstance(e, sympy.Mul | sympy.Pow) or text.startswith("-"):
        return f"({text})"
    return text


def pytuple(sizes: Sequence[Any]) -> str:
    """A tuple of sizes as Python source (``(ks0, 8)``; ``(4,)`` for one)."""
    inner = ", ".join(pyexpr(s) for s in sizes)
    return f"({inner}{',' if len(sizes) == 1 else ''})"
