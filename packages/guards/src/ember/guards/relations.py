"""Shape relations: a boolean expression over symbols bound to sources (``s0 == 2*s1``).

A :class:`ShapeRelation` is what a ``SHAPE_RELATION`` guard expects: the
expression a capture printed from sympy, with each symbol's source (usually a
:class:`~ember.guards.sources.TensorSize`). The expression is parsed once and
only a small grammar is accepted (:data:`ALLOWED`), so the compiled check can
inline it as Python code with the symbols bound to the check's own locals.

>>> from ember.guards import Local, TensorSize
>>> rel = ShapeRelation.parse("s0 == 2*s1", {"s0": TensorSize(Local("x"), 0),
...                                          "s1": TensorSize(Local("y"), 1)})
>>> print(rel)
s0 == 2 * s1  where s0 = x.size(0), s1 = y.size(1)
>>> rel.explain({"s0": 3, "s1": 2})
's0 == 2 * s1 is false with s0 = 3 (x.size(0)), s1 = 2 (y.size(1))'
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ember.guards.sources import Emitter, Source, TensorSize, TensorStride

__all__ = ["ALLOWED", "ShapeRelation"]

#: sympy's printed names of the functions it may leave in an expression -> Python's.
_FUNCTIONS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "Min": min, "Max": max}
#: sympy's (and torch's sympy functions') binary calls -> the Python they stand for.
_BINARY_CALLS: dict[str, Callable[[ast.expr, ast.expr], ast.expr]] = {
    "Eq": lambda a, b: ast.Compare(a, [ast.Eq()], [b]),  # Eq(a, b) -> a == b
    "Ne": lambda a, b: ast.Compare(a, [ast.NotEq()], [b]),  # Ne(a, b) -> a != b
    "Mod": lambda a, b: ast.BinOp(a, ast.Mod(), b),  # Mod(a, b) -> a % b (sympy's is Python's)
    "PythonMod": lambda a, b: ast.BinOp(a, ast.Mod(), b),  # PythonMod(a, b) -> a % b
    "FloorDiv": lambda a, b: ast.BinOp(a, ast.FloorDiv(), b),  # FloorDiv(a, b) -> a // b
}
#: sympy prints And/Or/Not as ``&``, ``|``, ``~``: accepted between truth values only.
_BOOL_BITS: dict[type[ast.AST], Callable[[list[ast.expr]], ast.expr]] = {
    ast.BitAnd: lambda values: ast.BoolOp(ast.And(), values),  # (a < b) & (c < d) -> ... and ...
    ast.BitOr: lambda values: ast.BoolOp(ast.Or(), values),  # (a < b) | (c < d) -> ... or ...
    ast.Invert: lambda values: ast.UnaryOp(ast.Not(), values[0]),  # ~(a < b) -> not a < b
}
_CMP_TEXT: dict[type[ast.cmpop], str] = {
    ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
}  # fmt: skip
#: ``2 <= s0`` read from the symbol's side: ``s0 >= 2``.
_MIRROR: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Eq: ast.Eq, ast.NotEq: ast.NotEq, ast.Lt: ast.Gt, ast.LtE: ast.GtE,
    ast.Gt: ast.Lt, ast.GtE: ast.LtE,
}  # fmt: skip
_MAX_POWER = 64  # s0**2 is sympy's; 2**s0 (or s0**10**9) could cost more than the check

#: The syntax a relation may use, by node type (operators by their own node types).
ALLOWED: frozenset[type[ast.AST]] = frozenset(
    {ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.USub, ast.UAdd, ast.Not,
     ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.Pow, ast.Compare,
     *_CMP_TEXT, ast.Name, ast.Load, ast.Constant, ast.Call, *_BOOL_BITS}
)  # fmt: skip


def _reject(expr: str, why: str) -> ValueError:
    return ValueError(f"bad shape relation {expr!r}: {why}")


def _check_node(node: ast.AST, expr: str, symbols: Mapping[str, Source], calls: set[int]) -> None:
    """Raise for a node outside the grammar; names, calls and constants have extra rules.
    ``calls`` holds the ids of the name nodes that are called (``min`` in ``min(a, b)``)."""
    if type(node) not in ALLOWED:
        raise _reject(expr, f"{type(node).__name__} is not allowed")
    if isinstance(node, ast.Constant) and type(node.value) is not int:
        raise _reject(expr, f"constant {node.value!r} is not an int")
    if isinstance(node, ast.Name) and id(node) not in calls:
        if node.id in _FUNCTIONS or node.id in _BINARY_CALLS:
            raise _reject(expr, f"{node.id!r} is a function, not a symbol")
        if node.id not in symbols:
            raise _reject(expr, f"unknown name {node.id!r}")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        power = node.right
        if not (isinstance(power, ast.Constant) and type(power.value) is int):
            raise _reject(expr, f"only constant powers 0..{_MAX_POWER}")
        if not 0 <= power.value <= _MAX_POWER:
            raise _reject(expr, f"only constant powers 0..{_MAX_POWER}")
    if isinstance(node, ast.Call):
        name = node.func.id if isinstance(node.func, ast.Name) else None
        arity_ok = len(node.args) == 2 if name in _BINARY_CALLS else len(node.args) >= 2
        if name not in {**_FUNCTIONS, **_BINARY_CALLS} or node.keywords or not arity_ok:
            raise _reject(expr, f"call {ast.unparse(node)} is not allowed")


def _called(tree: ast.AST) -> set[int]:
    return {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}


class _Sympy(ast.NodeTransformer):
    """sympy's spellings as Python: ``Eq(a, b)`` -> ``a == b`` (see :data:`_BINARY_CALLS`),
    ``Min``/``Max`` -> ``min``/``max``, ``&``/``|``/``~`` between truth values -> ``and``/
    ``or``/``not`` (between ints they stay, and are rejected)."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        assert isinstance(node.func, ast.Name)
        binary = _BINARY_CALLS.get(node.func.id)
        if binary is not None:
            return binary(node.args[0], node.args[1])
        return ast.Call(ast.Name(node.func.id.lower(), ast.Load()), node.args, [])

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        rule = _BOOL_BITS.get(type(node.op))
        if rule is None or not (_is_boolean(node.left) and _is_boolean(node.right)):
            return node
        return rule([node.left, node.right])

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        rule = _BOOL_BITS.get(type(node.op))
        return node if rule is None or not _is_boolean(node.operand) else rule([node.operand])


def _is_boolean(node: ast.AST) -> bool:
    """Whether ``node`` is a truth value (not an int used as one)."""
    if isinstance(node, ast.BoolOp):
        return all(map(_is_boolean, node.values))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _is_boolean(node.operand)
    return isinstance(node, ast.Compare)


def _first_seen(tree: ast.AST, symbols: Mapping[str, Source]) -> list[str]:
    """The symbol names of ``tree`` in reading order, each once."""
    calls = _called(tree)
    found = sorted(
        (n.lineno, n.col_offset, n.id)
        for n in ast.walk(tree)
        if isinstance(n, ast.Name) and id(n) not in calls and n.id in symbols
    )
    return list(dict.fromkeys(name for *_, name in found))


class _Rename(ast.NodeTransformer):
    def __init__(self, names: Mapping[str, str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Name(self.names.get(node.id, node.id), ast.Load()), node)


def _renamed(tree: ast.Expression, names: Mapping[str, str]) -> str:
    return ast.unparse(_Rename(names).visit(copy.deepcopy(tree)))


@dataclass(frozen=True, slots=True)
class ShapeRelation:
    """A boolean expression over named symbols, each read from a source.

    ``expr`` is the normalized text (sympy's ``Eq``/``Ne``/``Min``/``Max`` spelled
    as Python); ``symbols`` pairs each name it uses with its source, in reading
    order. Build one with :meth:`parse`, which validates the expression.

    >>> from ember.guards import Local
    >>> ShapeRelation.parse("Eq(n % 8, 0)", {"n": Local("n"), "m": Local("m")}).expr
    'n % 8 == 0'
    """

    expr: str
    symbols: tuple[tuple[str, Source], ...]
    tree: ast.Expression = field(compare=False, repr=False)
    #: ``expr`` with the symbols renamed ``_0``, ``_1``... in reading order (see :meth:`key`).
    canonical: str = field(default="", compare=False, repr=False)

    @classmethod
    def parse(cls, expr: str, symbols: Mapping[str, Source]) -> ShapeRelation:
        """Validate ``expr`` (a ValueError names what is wrong) and keep the symbols it uses.

        >>> from ember.guards import Local
        >>> ShapeRelation.parse("s0 + 1", {"s0": Local("n")})
        Traceback (most recent call last):
        ValueError: bad shape relation 's0 + 1': it is not a comparison
        >>> ShapeRelation.parse("s0.real > 1", {"s0": Local("n")})
        Traceback (most recent call last):
        ValueError: bad shape relation 's0.real > 1': Attribute is not allowed
        """
        if type(expr) is not str:
            raise TypeError(f"a shape relation is a str, not {type(expr).__name__}")
        try:
            tree = ast.parse(expr.strip(), mode="eval")
        except SyntaxError as error:
            raise _reject(expr, f"syntax error ({error.msg})") from None
        calls = _called(tree)
        for node in ast.walk(tree):
            _check_node(node, expr, symbols, calls)
        tree = ast.fix_missing_locations(_Sympy().visit(tree))
        if any(isinstance(n, tuple(_BOOL_BITS)) for n in ast.walk(tree)):
            raise _reject(expr, "& | ~ only join comparisons")
        if not _is_boolean(tree.body):
            raise _reject(expr, "it is not a comparison")
        used = _first_seen(tree, symbols)
        if not used:
            raise _reject(expr, "it uses no symbol")
        for name in used:
            if not isinstance(symbols[name], Source):
                raise TypeError(f"symbol {name!r} must map to a Source, not {symbols[name]!r}")
        canonical = _renamed(tree, {name: f"_{i}" for i, name in enumerate(used)})
        bound = tuple((name, symbols[name]) for name in used)
        return cls(ast.unparse(tree), bound, tree, canonical)

    def key(self) -> Hashable:
        """Equal for the same relation over the same sources, whatever the symbols' names.

        >>> from ember.guards import Local
        >>> a = ShapeRelation.parse("a >= 2", {"a": Local("n")})
        >>> a.key() == ShapeRelation.parse("b>=2", {"b": Local("n")}).key()
        True
        """
        return (self.canonical, tuple(src for _, src in self.symbols))

    def emit(self, em: Emitter) -> str:
        """The inline test: every symbol fetched into a local (once per check, shared with
        other guards), a plain source's value checked to be an int, then the expression.

        >>> from ember.guards import FrameSpec, Local, TensorSize
        >>> from ember.guards.codegen import CheckEmitter
        >>> em = CheckEmitter(FrameSpec("f", ("x", "n"), {}, {}))
        >>> rel = ShapeRelation.parse("Max(n, 2) <= s0", {"n": Local("n"),
        ...                                              "s0": TensorSize(Local("x"), 0)})
        >>> rel.emit(em), em.lines
        ('type(L_n) is int and (K1(L_n, 2) <= v0)', ['v0 = K0(L_x, 0)'])
        """
        names = {name: em.value(src) for name, src in self.symbols}
        tests = [
            f"type({names[name]}) is int"
            for name, src in self.symbols
            if not isinstance(src, (TensorSize, TensorStride))
        ]
        called = [n for n in ast.walk(self.tree) if isinstance(n, ast.Name) and n.id in _FUNCTIONS]
        names.update({n.id: em.bind(_FUNCTIONS[n.id]) for n in called})
        return " and ".join([*tests, f"({_renamed(self.tree, names)})"])

    def explain(self, values: Mapping[str, object]) -> str:
        """Why the relation does not hold for these symbol values, in words.

        >>> from ember.guards import Local, TensorSize
        >>> rel = ShapeRelation.parse("2 <= s0", {"s0": TensorSize(Local("x"), 0)})
        >>> rel.explain({"s0": 1})
        's0: 1 is not >= 2 (s0 = x.size(0))'
        """
        for name, src in self.symbols:
            if type(values[name]) is not int:
                return f"{name} = {values[name]!r} ({src}) is not an int"
        code = compile(self.tree, "<shape relation>", "eval")  # the slow path: no cache
        holds = bool(eval(code, {"__builtins__": {}, **_FUNCTIONS}, dict(values)))
        single = _single_bound(self.tree.body)
        if single is not None and not holds:
            name, op, bound = single
            source = dict(self.symbols)[name]
            return f"{name}: {values[name]} is not {op} {bound} ({name} = {source})"
        bound_to = ", ".join(f"{name} = {values[name]} ({src})" for name, src in self.symbols)
        return f"{self.expr} is {'true' if holds else 'false'} with {bound_to}"

    def __str__(self) -> str:
        return f"{self.expr}  where " + ", ".join(f"{n} = {src}" for n, src in self.symbols)


def _constant(node: ast.AST) -> int | None:
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return None
    return value if type(value) is int else None


def _single_bound(node: ast.AST) -> tuple[str, str, int] | None:
    """``(symbol, op, constant)`` when ``node`` compares one symbol with a constant."""
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1):
        return None
    left, op, right = node.left, type(node.ops[0]), node.comparators[0]
    if isinstance(right, ast.Name) and not isinstance(left, ast.Name):
        left, op, right = right, _MIRROR[op], left
    bound = _constant(right)
    if not isinstance(left, ast.Name) or bound is None:
        return None
    return left.id, _CMP_TEXT[op], bound
