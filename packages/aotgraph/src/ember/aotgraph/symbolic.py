"""Symbolic shapes: graphs whose placeholders carry sizes from one ``ShapeEnv``.

A captured graph may say, in each placeholder's ``meta["val"]`` (or
``meta["example_value"]``), that its sizes are symbols: fake tensors of one
``FakeTensorMode(shape_env=...)`` with ``SymInt`` sizes, or a ``SymInt`` for an int
argument. :func:`graph_symbols` finds them; aotgraph then traces with that mode, so
the forward and backward graphs read sizes from their inputs (``sym_size`` nodes, int
placeholders) instead of baking in one example's numbers, and one compile serves
every size.

What the trace assumed about the symbols is checked on each call by
:class:`ShapeCheck`: each symbol's value range (``ShapeEnv`` gives dynamic sizes
``[2, inf)``), one value where a symbol names several sizes, the inputs' strides,
and the guards the trace added to the ``ShapeEnv`` (``Eq(Mod(s0, 2), 0)`` for a
reshape by ``s0 // 2``). A call that breaks one runs the graph eagerly.

>>> import torch
>>> from torch._subclasses import FakeTensorMode
>>> from torch.fx.experimental.symbolic_shapes import ShapeEnv
>>> mode = FakeTensorMode(shape_env=ShapeEnv())
>>> gm = torch.fx.symbolic_trace(lambda x: x * 2)
>>> (p,) = gm.graph.find_nodes(op="placeholder")
>>> p.meta["val"] = mode.from_tensor(torch.zeros(3, 4))  # both sizes dynamic
>>> found = graph_symbols(gm)
>>> found.mode is mode, [type(s).__name__ for s in found.values[0].shape]
(True, ['SymInt', 'SymInt'])
>>> check = ShapeCheck.of(found.values, [])
>>> check.ok([torch.zeros(5, 6)]), check.ok([torch.zeros(1, 6)])  # sizes are >= 2
(True, False)
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import sympy  # type: ignore[import-untyped]
import torch
import torch.fx
from torch._subclasses import FakeTensor, FakeTensorMode
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.fx.experimental import proxy_tensor
from torch.fx.experimental.symbolic_shapes import (
    GuardOnDataDependentSymNode,
    PendingUnbackedSymbolNotFound,
    ShapeEnv,
)
from torch.utils._sympy.symbol import SymT, symbol_is_type

from ember.aotgraph import nodemeta
from ember.aotgraph.decompositions import for_symbolic_sizes
from ember.aotgraph.eager_checks import Unsupported
from ember.aotgraph.log import LOG
from ember.aotgraph.symbolic_views import SymbolicViews

__all__ = ["GraphSymbols", "ShapeCheck", "evaluate", "fresh_fakes", "graph_symbols", "is_symbolic"]

# What tracing raises where symbolic sizes need a value only the run has (nonzero, item):
# aotgraph cannot compile those yet; the caller runs the graph eagerly.
SYMBOLIC_LIMITS: tuple[type[Exception], ...] = (
    GuardOnDataDependentSymNode,
    PendingUnbackedSymbolNotFound,
    DataDependentOutputException,
    DynamicOutputShapeException,
)

# The symbols a ShapeEnv makes for sizes read from data, not from inputs.
UNBACKED = (SymT.UNBACKED_INT, SymT.UNBACKED_FLOAT)

# The placeholder meta keys capture fills, in the order they are read.
META_KEYS = ("val", "example_value")

# How many shape verdicts (and resolved output layouts) a ShapeCheck remembers.
MAX_REMEMBERED = 256


def is_symbolic(value: Any) -> bool:
    """Whether ``value`` is a ``SymInt`` or a fake tensor with a symbolic size or stride.

    >>> is_symbolic(3), is_symbolic(torch.zeros(2))
    (False, False)
    """
    if isinstance(value, torch.SymInt):
        return True
    if not isinstance(value, FakeTensor):
        return False
    layout = (*value.shape, *value.stride(), value.storage_offset())
    return any(isinstance(s, torch.SymInt) for s in layout)


@dataclass(frozen=True, slots=True)
class GraphSymbols:
    """The fake mode of a graph with symbolic placeholders and each placeholder's value."""

    mode: FakeTensorMode
    values: tuple[Any, ...]  # per placeholder: a fake tensor, a SymInt, or None (unknown)
    # the ShapeEnv when the graph reached aotgraph: its guards (capture's, which capture
    # checks), replacements and symbols. What is added after is aotgraph's to check.
    guards_before: int = 0
    replaced_before: tuple[tuple[Any, Any], ...] = ()
    symbols_before: frozenset[Any] = frozenset()

    @property
    def env(self) -> ShapeEnv:
        assert self.mode.shape_env is not None
        return self.mode.shape_env


def graph_symbols(gm: Any) -> GraphSymbols | None:
    """The symbolic placeholders of ``gm`` (a graph module), or None: none is symbolic."""
    if not isinstance(gm, torch.fx.GraphModule):
        return None
    values = []
    for node in gm.graph.find_nodes(op="placeholder"):
        found = [node.meta[k] for k in META_KEYS if node.meta.get(k) is not None]
        values.append(found[0] if found else None)
    if not any(is_symbolic(v) for v in values):
        return None
    envs = {id(_env_of(v)): v for v in values if _env_of(v) is not None}
    modes = {id(v.fake_mode): v.fake_mode for v in values if isinstance(v, FakeTensor)}
    if len(envs) != 1 or len(modes) > 1:
        raise Unsupported(
            "aot_compile: the graph's symbolic placeholders come from "
            f"{len(envs)} shape environments and {len(modes)} fake modes; expected one"
        )
    env = _env_of(next(iter(envs.values())))
    assert env is not None  # envs holds only values with one
    mode = next(iter(modes.values())) if modes else FakeTensorMode(shape_env=env)
    if mode.shape_env is not env:
        raise Unsupported("aot_compile: the fake mode's ShapeEnv is not its symbols' ShapeEnv")
    replaced = tuple(env.replacements.items())
    return GraphSymbols(mode, tuple(values), len(env.guards), replaced, frozenset(env.var_to_range))


def _env_of(value: Any) -> ShapeEnv | None:
    if isinstance(value, torch.SymInt):
        env = value.node.shape_env
        return env if isinstance(env, ShapeEnv) else None
    if isinstance(value, FakeTensor) and is_symbolic(value):
        return value.fake_mode.shape_env
    return None


def fresh_fakes(found: GraphSymbols, inputs: Sequence[Any]) -> list[Any]:
    """Fake inputs to trace with: per graph input, a new fake tensor with the placeholder's
    sizes and strides (new, so the trace's in-place ops leave the placeholders as they are)
    and the real input's ``requires_grad``; the placeholder's ``SymInt``; or, past the
    placeholders (lifted parameters) and where a placeholder says nothing, a fake of the
    real tensor with static sizes. Inputs that share storage are refused."""
    storages = [t.untyped_storage()._cdata for t in inputs if isinstance(t, torch.Tensor)]
    if len(set(storages)) != len(storages):
        raise Unsupported("aot_compile: inputs that share storage, with symbolic shapes")
    out: list[Any] = []
    with found.mode:
        for i, real in enumerate(inputs):
            value = found.values[i] if i < len(found.values) else None
            out.append(_fresh(found.mode, value, real))
    return out


def _fresh(mode: FakeTensorMode, value: Any, real: Any) -> Any:
    if isinstance(value, torch.SymInt):
        return value
    if not isinstance(real, torch.Tensor):
        raise Unsupported(f"aot_compile: a {type(real).__name__} input with symbolic shapes")
    if isinstance(value, FakeTensor):
        fake = torch.empty_strided(
            value.shape, value.stride(), dtype=real.dtype, device=real.device
        )
    else:
        fake = mode.from_tensor(real, static_shapes=True)
    return fake.requires_grad_(real.requires_grad) if real.requires_grad else fake


@dataclass(frozen=True, slots=True)
class Place:
    """Where a symbol's value is read at run time: input ``index``, its ``size`` or
    ``stride`` ``dim`` (``kind``), its number of ``dims``, or the input itself (``"int"``)."""

    kind: str
    index: int
    dim: int = 0

    def read(self, inputs: Sequence[Any]) -> int:
        """The value in a call (TypeError, IndexError, AttributeError: not this layout)."""
        return int(READERS[self.kind](inputs[self.index], self.dim))


def _int(value: Any) -> int:
    if type(value) is not int:  # a one-element tensor would convert: not an int input
        raise TypeError(f"expected an int, got {type(value).__name__}")
    return value


# kind -> how to read it from a run-time input
READERS: dict[str, Callable[[Any, int], Any]] = {
    "int": lambda v, d: _int(v),
    "dims": lambda v, d: v.dim(),
    "size": lambda v, d: v.shape[d],
    "stride": lambda v, d: v.stride(d),
}


@dataclass(frozen=True, slots=True)
class ShapeCheck:
    """What one trace assumed about its symbols, checked against each call's inputs.

    ``places`` binds each symbol to the first input size, stride or int input holding
    it; ``equal`` lists every other size, stride and int input with the expression it
    must equal (a symbol may name several sizes: ``ShapeEnv`` duck-sizes equal dims;
    static sizes and strides are numbers); ``conditions`` are the ranges and guards.
    Verdicts are remembered per input layout.
    """

    places: dict[sympy.Symbol, Place]
    equal: tuple[tuple[Place, sympy.Expr], ...]  # (a place, the expression it must equal)
    conditions: tuple[sympy.Basic, ...]  # must be true
    verdicts: dict[tuple[Any, ...], bool] = field(default_factory=dict)

    @staticmethod
    def of(
        values: Sequence[Any],
        guards: Sequence[sympy.Basic],
        earlier: Sequence[sympy.Basic] = (),
    ) -> ShapeCheck:
        """The check for placeholders ``values``, the traces' ``guards`` (one on a symbol no
        input holds raises ``Unsupported``) and ``earlier`` guards (capture's: checked too
        where the inputs hold their symbols, which costs only a new layout's first call)."""
        places: dict[sympy.Symbol, Place] = {}
        equal: list[tuple[Place, sympy.Expr]] = []
        for place, expr in _layout(values):
            if isinstance(expr, sympy.Symbol) and expr not in places:
                places[expr] = place
            else:
                equal.append((place, expr))
        env = _any_env(values)
        conditions = [*guards, *(g for g in earlier if g.free_symbols <= places.keys())]
        for sym in places:
            r = env.var_to_range.get(sym) if env is not None else None
            if r is not None and isinstance(r.lower, sympy.Integer):
                conditions.append(sym >= r.lower)
            if r is not None and isinstance(r.upper, sympy.Integer):
                conditions.append(sym <= r.upper)
        unbound = {s for c in conditions + [e for _, e in equal] for s in c.free_symbols}
        unbound -= set(places)
        if unbound:
            names = ", ".join(sorted(map(str, unbound)))
            raise Unsupported(f"aot_compile: sizes depend on {names}, which no input holds")
        return ShapeCheck(places, tuple(equal), tuple(conditions))

    def bind(self, inputs: Sequence[Any]) -> dict[sympy.Symbol, int]:
        """Each symbol's value in a call with ``inputs``."""
        return {sym: place.read(inputs) for sym, place in self.places.items()}

    def ok(self, inputs: Sequence[Any]) -> bool:
        """Whether the traced graphs are valid for ``inputs`` (remembered per layout); the
        first miss of a layout is logged with :meth:`explain`'s reason."""
        key = _layout_key(inputs)
        verdict = self.verdicts.get(key)
        if verdict is None:
            reason = self.explain(inputs)
            verdict = reason is None
            if reason is not None:
                LOG.debug("symbolic sizes: %s; running the graph eagerly", reason)
            if len(self.verdicts) >= MAX_REMEMBERED:
                self.verdicts.clear()
            self.verdicts[key] = verdict
        return verdict

    def explain(self, inputs: Sequence[Any]) -> str | None:
        """Why the traced graphs are not valid for ``inputs``; None if they are.

        >>> from torch.fx.experimental.symbolic_shapes import ShapeEnv
        >>> x = FakeTensorMode(shape_env=ShapeEnv()).from_tensor(torch.zeros(4, 3))
        >>> check = ShapeCheck.of([x], [sympy.Eq(x.shape[0].node.expr % 2, 0)])
        >>> check.explain([torch.zeros(6, 3)]) is None, check.explain([torch.zeros(5, 3)])
        (True, 'Eq(Mod(s..., 2), 0) is false for input sizes (5, 3)')
        """
        try:
            env = self.bind(inputs)
            for place, expr in self.equal:
                if place.read(inputs) != evaluate(expr, env):
                    return f"input {place.index}: {place.kind} {place.dim} is not {expr}"
            for c in self.conditions:
                if not bool(evaluate(c, env)):
                    return f"{c} is false for {_sizes(inputs)}"
        except (IndexError, TypeError, AttributeError, ValueError, ZeroDivisionError) as e:
            # not the traced layout (fewer dims, a tensor for an int), or n % 0
            return f"{_sizes(inputs)} do not have the traced layout ({type(e).__name__}: {e})"
        return None


def _sizes(inputs: Sequence[Any]) -> str:
    shown = [tuple(t.shape) if isinstance(t, torch.Tensor) else t for t in inputs]
    return "input sizes " + ", ".join(map(str, shown))


def evaluate(expr: Any, env: dict[sympy.Symbol, int]) -> Any:
    """``expr`` (a sympy expression, or a ``SymInt`` or int) with the symbols' values.

    >>> s = sympy.Symbol("s0", integer=True, positive=True)
    >>> evaluate(2 * s + 1, {s: 3}), evaluate(sympy.Eq(s % 2, 0), {s: 3})
    (7, False)
    """
    if isinstance(expr, torch.SymInt):
        expr = expr.node.expr
    if isinstance(expr, int):
        return expr
    value = expr.xreplace(env)
    if isinstance(value, int):  # a bare symbol comes back as the int itself
        return value
    if value.is_Boolean:
        return bool(value)
    return int(value)


def resolve(meta: Any, env: dict[sympy.Symbol, int]) -> Any:
    """A ``TensorMeta`` whose sizes, strides and offset may be ``SymInt``s, with ints."""
    size = tuple(evaluate(s, env) for s in meta.size)
    stride = tuple(evaluate(s, env) for s in meta.stride)
    return replace(meta, size=size, stride=stride, offset=evaluate(meta.offset, env))


def _expr(value: Any) -> Any:
    """A placeholder size's own expression: not ``node.expr``, which applies the ShapeEnv's
    replacements (a trace that found ``n == 3`` turns ``n``'s symbol into 3 there; the input
    must still bind the symbol, so that the check ``Eq(n, 3)`` can read it)."""
    if not isinstance(value, torch.SymInt):
        return sympy.Integer(value)
    node = value.node
    return getattr(node, "_expr", node.expr)


def _layout(values: Sequence[Any]) -> list[tuple[Place, Any]]:
    """Every size, stride, offset and int placeholder, with its expression."""
    out: list[tuple[Place, Any]] = []
    for i, v in enumerate(values):
        if isinstance(v, torch.SymInt):
            out.append((Place("int", i), _expr(v)))
        elif isinstance(v, FakeTensor):
            out.append((Place("dims", i), sympy.Integer(v.dim())))  # first: then dims exist
            out += [(Place("size", i, d), _expr(s)) for d, s in enumerate(v.shape)]
            out += [(Place("stride", i, d), _expr(s)) for d, s in enumerate(v.stride())]
    return out


def _any_env(values: Sequence[Any]) -> ShapeEnv | None:
    envs = [e for e in map(_env_of, values) if e is not None]
    return envs[0] if envs else None


def _layout_key(inputs: Sequence[Any]) -> tuple[Any, ...]:
    return tuple((tuple(t.shape), t.stride()) if isinstance(t, torch.Tensor) else t for t in inputs)


def shape_guards(found: GraphSymbols) -> tuple[list[sympy.Basic], list[sympy.Basic]]:
    """The ShapeEnv's guards and replacements (a symbol fixed to a value or to another symbol,
    as an equality): those added since the graph reached aotgraph (by its traces: every one
    of them, as one trace may rely on a guard an earlier trace added), and those before.
    A size made from data (an unbacked symbol: ``nonzero``, ``item``) raises ``Unsupported``.
    """
    env = found.env
    data = [
        s for s in env.var_to_range if s not in found.symbols_before and symbol_is_type(s, UNBACKED)
    ]
    if data:
        raise Unsupported(
            f"aot_compile: symbolic sizes: sizes that depend on data ({data[0]}) are not "
            "compiled yet"
        )
    k = found.guards_before
    ours, theirs = [g.expr for g in env.guards[k:]], [g.expr for g in env.guards[:k]]
    replaced = dict(found.replaced_before)
    for sym, expr in env.replacements.items():
        (theirs if replaced.get(sym) == expr else ours).append(sympy.Eq(sym, expr))
    return ours, theirs


def make_fx(
    f: Callable[..., Any], table: Any, mode: Literal["symbolic", "fake"], **kw: Any
) -> Callable[..., torch.fx.GraphModule]:
    """:func:`ember.aotgraph.nodemeta.make_fx`; with symbolic sizes, each node's
    ``tensor_meta`` leaves out its memory format, and ``reshape``/``contiguous()`` are
    answered from the sizes as expressions where they can be
    (:class:`ember.aotgraph.symbolic_views.SymbolicViews`).

    ``make_fx`` records a ``tensor_meta`` on every node beside its ``val``, and finds its
    memory format by asking, for up to three formats, whether the output is contiguous in
    it: with ``SymInt`` sizes that is ``SymNode`` arithmetic per output (0.07 of 0.6 s
    profiled in a symbolic trace of 40 ops). Nothing in ember reads ``tensor_meta`` (the
    ``val`` fake holds the same sizes and strides); torch's own documentation calls it
    best effort next to ``val``. Static traces keep it whole.

    >>> from torch.fx.experimental.symbolic_shapes import ShapeEnv
    >>> mode = FakeTensorMode(shape_env=ShapeEnv())
    >>> x = mode.from_tensor(torch.zeros(3, 4))
    >>> gm = make_fx(lambda t: t * 2, {}, "symbolic")(x)
    >>> [n.meta["tensor_meta"].memory_format for n in gm.graph.nodes if n.op == "call_function"]
    [None]
    """
    if mode != "symbolic":
        return nodemeta.make_fx(f, table, mode, **kw)

    @functools.wraps(f)  # make_fx names the placeholders after f's parameters
    def with_views(*args: Any) -> Any:
        with SymbolicViews():  # reshape and contiguous() answered from expressions
            return f(*args)

    traced = nodemeta.make_fx(with_views, for_symbolic_sizes(table), mode, **kw)

    def run(*args: Any) -> torch.fx.GraphModule:
        with _without_memory_format():
            return traced(*args)

    return run


_LEAN = threading.Lock()
_lean_users = [0]  # traces running with the lean tensor_meta (threads may overlap)


@contextlib.contextmanager
def _without_memory_format() -> Iterator[None]:
    """``make_fx``'s ``tensor_meta`` without its memory format while the block runs; the
    first of overlapping blocks swaps torch's function, the last puts it back."""
    with _LEAN:
        if _lean_users[0] == 0:
            proxy_tensor._extract_tensor_metadata = _LEAN_EXTRACT  # type: ignore[attr-defined]
        _lean_users[0] += 1
    try:
        yield
    finally:
        with _LEAN:
            _lean_users[0] -= 1
            if _lean_users[0] == 0:
                proxy_tensor._extract_tensor_metadata = _EXTRACT  # type: ignore[attr-defined]


_EXTRACT = proxy_tensor._extract_tensor_metadata  # type: ignore[attr-defined]  # set_meta reads it
_LEAN_EXTRACT = functools.partial(_EXTRACT, include_contiguity=False)
