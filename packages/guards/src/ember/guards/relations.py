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
from types import CodeType
from typing import Any

from ember.guards.sources import Emitter, Source, TensorSize, TensorStride

__all__ = ["ALLOWED", "ShapeRelation"]

#: sympy's printed names of the functions it may leave in an expression -> Python's.
_FUNCTIONS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "Min": min, "Max": max}
#: sympy's ``Eq(a, b)``, ``Ne(a, b)`` -> the comparison they stand for.
_RELATIONAL_CALLS: dict[str, type[ast.cmpop]] = {"Eq": ast.Eq, "Ne": ast.NotEq}
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
     *_CMP_TEXT, ast.Name, ast.Load, ast.Constant, ast.Call}
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
        if node.id in _FUNCTIONS or node.id in _RELATIONAL_CALLS:
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
        arity_ok = len(node.args) == 2 if name in _RELATIONAL_CALLS else len(node.args) >= 2
        if name not in {**_FUNCTIONS, **_RELATIONAL_CALLS} or node.keywords or not arity_ok:
            raise _reject(expr, f"call {ast.unparse(node)} is not allowed")


def _called(tree: ast.AST) -> set[int]:
    return {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}


class _Sympy(ast.NodeTransformer):
    """``Eq(a, b)`` -> ``a == b``, ``Ne`` -> ``!=``, ``Min``/``Max`` -> ``min``/``max``."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        assert isinstance(node.func, ast.Name)
        op = _RELATIONAL_CALLS.get(node.func.id)
        if op is not None:
            return ast.Compare(node.args[0], [op()], [node.args[1]])
        return ast.Call(ast.Name(node.func.id.lower(), ast.Load()), node.args, [])


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
    code: CodeType = field(compare=False, repr=False)

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
        if not _is_boolean(tree.body):
            raise _reject(expr, "it is not a comparison")
        used = _first_seen(tree, symbols)
        if not used:
            raise _reject(expr, "it uses no symbol")
        for name in used:
            if not isinstance(symbols[name], Source):
                raise TypeError(f"symbol {name!r} must map to a Source, not {symbols[name]!r}")
        text = ast.unparse(tree)
        code = compile(text, f"<shape relation {text}>", "eval")
        return cls(text, tuple((name, symbols[name]) for name in used), tree, code)

    def key(self) -> Hashable:
        """Equal for the same relation over the same sources, whatever the symbols' names.

        >>> from ember.guards import Local
        >>> a = ShapeRelation.parse("a >= 2", {"a": Local("n")})
        >>> a.key() == ShapeRelation.parse("b>=2", {"b": Local("n")}).key()
        True
        """
        canonical = {name: f"_{i}" for i, (name, _) in enumerate(self.symbols)}
        return (_renamed(self.tree, canonical), tuple(src for _, src in self.symbols))

    def emit(self, em: Emitter) -> str:
        """The inline test: every symbol fetched into a local (once per check, shared with
        other guards), a plain source's value checked to be an int, then the expression."""
        names = {name: em.value(src) for name, src in self.symbols}
        tests = [
            f"type({names[name]}) is int"
            for name, src in self.symbols
            if not isinstance(src, (TensorSize, TensorStride))
        ]
        called = {n.func.id for n in ast.walk(self.tree) if isinstance(n, ast.Call)}  # type: ignore[attr-defined]
        names.update({fn: em.bind(_FUNCTIONS[fn]) for fn in called})
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
        holds = bool(eval(self.code, {"__builtins__": {}, **_FUNCTIONS}, dict(values)))
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
