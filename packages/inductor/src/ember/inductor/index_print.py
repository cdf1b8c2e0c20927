"""One printer for sympy index expressions; each code generator gives its syntax.

The C++ and Triton printers print the same index algebra (sums, products, small integer
powers, ``floor`` of a quotient, ``Mod``, ``Min``/``Max``) and differ only in spelling:
``IndexSyntax`` holds the spelling, :func:`print_index` the walk.

>>> i, j = sympy.symbols("x0 y0", integer=True, nonnegative=True)
>>> plain = IndexSyntax(str, lambda e: e.args, "{}", "({} // {})", "({} % {})", "min({}, {})",
...                     "max({}, {})", ValueError)
>>> print_index(sympy.Mod(j, 4) + 8 * i, plain)
'(8 * x0 + (y0 % 4))'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sympy  # type: ignore[import-untyped]

__all__ = ["IndexSyntax", "print_index"]


@dataclass(frozen=True)
class IndexSyntax:
    """How one target language spells index arithmetic (``{}`` are the operands)."""

    integer: Callable[[int], str]
    terms: Callable[[sympy.Expr], Sequence[sympy.Expr]]  # the order of a sum's or product's
    product: str  # around ``a * b * c``
    floor_div: str  # ``floor(num / den)`` of integers
    mod: str
    minimum: str
    maximum: str
    unsupported: type[Exception]  # raised for anything else


def print_index(e: sympy.Expr, syntax: IndexSyntax) -> str:
    """``e`` (a non-negative integer expression) in ``syntax``."""
    if e.is_Integer:
        return syntax.integer(int(e))
    if e.is_Symbol:
        return str(e.name)
    if isinstance(e, sympy.Add):
        return "(" + " + ".join(print_index(a, syntax) for a in syntax.terms(e)) + ")"
    if isinstance(e, sympy.Mul):
        return syntax.product.format(" * ".join(print_index(a, syntax) for a in syntax.terms(e)))
    if isinstance(e, sympy.Pow) and e.args[1].is_Integer and 0 < int(e.args[1]) <= 8:
        return "(" + " * ".join([print_index(e.args[0], syntax)] * int(e.args[1])) + ")"
    if isinstance(e, sympy.floor):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        return syntax.floor_div.format(print_index(num, syntax), print_index(den, syntax))
    if isinstance(e, sympy.Mod):
        return syntax.mod.format(*(print_index(a, syntax) for a in e.args))
    if isinstance(e, sympy.Min | sympy.Max):
        fmt = syntax.minimum if isinstance(e, sympy.Min) else syntax.maximum
        out = print_index(e.args[0], syntax)
        for a in e.args[1:]:
            out = fmt.format(out, print_index(a, syntax))
        return out
    raise syntax.unsupported(f"cannot print index {e}")
