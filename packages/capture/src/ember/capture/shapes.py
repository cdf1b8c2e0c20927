"""Dynamic shapes in capture: which sizes are symbolic, the marks that say so, their guards.

A size is *symbolic* when the graph must serve every value of it: the tracer's fake
tensor then has a ``torch.SymInt`` there, from one ``ShapeEnv`` per translation (torch's
general fake-tensor machinery), and whatever the frame computes from it (``x.shape[0] //
2``, ``view(-1, n)``, a comparison) stays an expression over the symbols. A branch on
one records its condition in the ``ShapeEnv``; :meth:`Shapes.guard` turns what was
recorded into ``SHAPE_RELATION`` guards over the frame's sizes (``s0 >= 2``,
``s0 == 2*s1``) and leaves the symbolic entries out of the tensors' ``TENSOR_MATCH``.

Which sizes are symbolic is the :class:`Policy`:

- ``dynamic=False``: none;
- ``dynamic=True``: every size of every input tensor but parameters and buffers;
- ``dynamic=None`` (the default): the dimensions marked with :func:`mark_dynamic`, and
  *automatic dynamic*: a dimension whose size changed between two compiles of one code
  object is symbolic in the next compile (:func:`observe`).

:func:`mark_static` pins a dimension (or a whole module's tensors) whatever the policy.
Sizes 0 and 1 always specialise, as in torch: a graph for a size 1 broadcasts where
another size would not.

>>> x = torch.ones(4, 3)
>>> mark_dynamic(x, 0, min=2, max=64)
>>> marks_of(x)
{0: Mark(min=2, max=64, strict=True, unbacked=False)}
"""

from __future__ import annotations

import builtins
import threading
import types
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch._guards import GuardSource, Source

from ember.capture import inputfakes, settings

if TYPE_CHECKING:
    import sympy  # type: ignore[import-untyped]
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

# sympy and torch's symbolic_shapes are imported by the functions that make or read symbols:
# marking dims (``mark_dynamic``) and a loaded pack's first call never import them.

__all__ = [
    "Mark",
    "Policy",
    "Shapes",
    "mark_dynamic",
    "mark_static",
    "mark_unbacked",
    "marks_of",
    "maybe_mark_dynamic",
    "observe",
    "python_expression",
]

_MARKS = "_ember_dynamic_marks"  # on a tensor: {dim: Mark}
_STATIC = "_ember_static_dims"  # on a tensor: frozenset of dims


@dataclass(frozen=True, slots=True)
class Mark:
    """A user's request that one dimension be symbolic. ``strict`` (``mark_dynamic``)
    makes specialising it an error; ``maybe_mark_dynamic`` is not strict."""

    min: int | None = None
    max: int | None = None
    strict: bool = True
    unbacked: bool = False  # mark_unbacked: no value known while tracing, 0 and 1 included


def _check_dim(t: Any, dim: int) -> int:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a tensor, got {type(t).__name__}")
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"dim must be an int, not {type(dim).__name__}")
    if not -t.dim() <= dim < max(t.dim(), 1):
        raise IndexError(f"dim {dim} is out of range for a tensor of {t.dim()} dimensions")
    return dim % t.dim()


def mark_dynamic(
    t: torch.Tensor, dim: int | Iterable[int], *, min: int | None = None, max: int | None = None
) -> None:
    """Make size ``dim`` of ``t`` symbolic in the next compile that reads ``t``, between
    ``min`` and ``max`` when given; the compile fails with an error naming the line if the
    code specialises it (compares it with a constant, loops over it, ...).

    >>> x = torch.ones(8, 3)
    >>> mark_dynamic(x, [0, 1])
    >>> sorted(marks_of(x))
    [0, 1]
    """
    _mark(t, dim, Mark(min, max, strict=True))


def maybe_mark_dynamic(t: torch.Tensor, dim: int | Iterable[int]) -> None:
    """Like :func:`mark_dynamic`, but specialising the size is allowed (no error).

    >>> x = torch.ones(8)
    >>> maybe_mark_dynamic(x, 0)
    >>> marks_of(x)[0].strict
    False
    """
    _mark(t, dim, Mark(strict=False))


def mark_unbacked(t: torch.Tensor, dim: int | Iterable[int]) -> None:
    """Make size ``dim`` of ``t`` symbolic with no value known while tracing: sizes 0 and 1
    do not specialise, and code that branches on the size breaks the graph there (no
    guard can decide it), as torch's ``mark_unbacked``.

    >>> x = torch.ones(8)
    >>> mark_unbacked(x, 0)
    >>> marks_of(x)[0].unbacked
    True
    """
    _mark(t, dim, Mark(strict=True, unbacked=True))


def _mark(t: torch.Tensor, dim: int | Iterable[int], mark: Mark) -> None:
    if mark.min is not None and mark.max is not None and mark.min > mark.max:
        raise ValueError(f"min {mark.min} is above max {mark.max}")
    dims = [dim] if isinstance(dim, int) else list(dim)
    marks = dict(getattr(t, _MARKS, {}))
    for d in dims:
        marks[_check_dim(t, d)] = mark
    setattr(t, _MARKS, marks)


def mark_static(t: torch.Tensor | torch.nn.Module, dim: int | Iterable[int] | None = None) -> None:
    """Keep size ``dim`` of ``t`` (all its sizes when ``dim`` is None) static whatever the
    policy; for a module, every parameter, buffer and tensor attribute it and its
    submodules hold now.

    >>> x = torch.ones(8, 3)
    >>> mark_static(x, 0)
    >>> getattr(x, "_ember_static_dims")
    frozenset({0})
    >>> m = torch.nn.Linear(2, 2)
    >>> mark_static(m)
    >>> getattr(m.weight, "_ember_static_dims")
    frozenset({0, 1})
    """
    if isinstance(t, torch.nn.Module):
        if dim is not None:
            raise TypeError("mark_static(module) takes no dim")
        for sub in t.modules():
            held = [*sub.parameters(recurse=False), *sub.buffers(recurse=False)]
            held += [v for v in vars(sub).values() if isinstance(v, torch.Tensor)]
            for tensor in held:
                mark_static(tensor)
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a tensor or a module, got {type(t).__name__}")
    dims = range(t.dim()) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    setattr(t, _STATIC, frozenset(getattr(t, _STATIC, ())) | {_check_dim(t, d) for d in dims})


def marks_of(t: torch.Tensor) -> dict[int, Mark]:
    """The dims of ``t`` marked dynamic, with their marks."""
    return dict(getattr(t, _MARKS, {}))


# -- automatic dynamic ---------------------------------------------------------------------

# code -> source key -> (the sizes last compiled for, the dims seen changing)
_SEEN: weakref.WeakKeyDictionary[types.CodeType, dict[str, tuple[tuple[int, ...], frozenset[int]]]]
_SEEN = weakref.WeakKeyDictionary()
_SEEN_LOCK = threading.Lock()


def observe(code: types.CodeType, key: str, sizes: tuple[int, ...]) -> frozenset[int]:
    """Record that ``code`` compiles for an input of ``sizes`` reached by ``key``; the dims
    whose size has changed between compiles of ``code`` (automatic dynamic).

    >>> def f(x): ...
    >>> observe(f.__code__, "x", (4, 3)), observe(f.__code__, "x", (6, 3))
    (frozenset(), frozenset({0}))
    """
    with _SEEN_LOCK:
        seen = _SEEN.setdefault(code, {})
        last, changed = seen.get(key, (sizes, frozenset()))
        if len(last) == len(sizes):
            pairs = enumerate(zip(last, sizes, strict=True))
            changed = changed | {d for d, (a, b) in pairs if a != b}
        seen[key] = (sizes, changed)
        return changed


def forget() -> None:
    """Forget every size seen (``ember.compiler.reset()``)."""
    with _SEEN_LOCK:
        _SEEN.clear()


@dataclass(frozen=True, slots=True)
class Policy:
    """Which sizes of a frame's input tensors are symbolic (the module docstring says how).

    >>> Policy(True).dims(torch.ones(2, 3), parameter=False, changed=frozenset())
    frozenset({0, 1})
    """

    dynamic: bool | None = None
    # dynamic=None: whether a size that changed between compiles becomes symbolic; a backend
    # whose symbolic code is slower than its static code says no (marks still count)
    automatic: bool = True

    def dims(self, t: torch.Tensor, *, parameter: bool, changed: frozenset[int]) -> frozenset[int]:
        """The symbolic dims of input ``t`` (a parameter or buffer when ``parameter``)."""
        if self.dynamic is False:
            return frozenset()
        marked = frozenset(marks_of(t))
        wanted = marked
        if self.dynamic is True and not parameter:
            wanted = frozenset(range(t.dim()))
        elif self.dynamic is None and not parameter and self.automatic:
            wanted = marked | changed
        return wanted - frozenset(getattr(t, _STATIC, ()))

    def int_symbolic(self, changed: bool) -> bool:
        """Whether an int argument is a symbol (``changed``: it changed between compiles)."""
        return self.dynamic is True or (self.dynamic is None and self.automatic and changed)


# -- one translation's symbols --------------------------------------------------------------

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_symbolic(x: Any) -> bool:
    """Whether ``x`` is a value the ShapeEnv tracks (not a plain number)."""
    return isinstance(x, SYM_TYPES) and not _constant(x)


def contains_symbolic(x: Any) -> bool:
    """Whether ``x`` or an item of it (a tuple, list or ``torch.Size``) is symbolic."""
    if isinstance(x, tuple | list):
        return any(contains_symbolic(i) for i in x)
    return is_symbolic(x)


def concrete(x: Any) -> Any:
    """The Python number symbolic ``x`` has here; the ShapeEnv records the guard that keeps
    it (``s0 == 8``), so code that needs the number itself specialises soundly."""
    if isinstance(x, torch.SymBool):
        return bool(x)
    if isinstance(x, torch.SymInt):
        return int(x)
    return float(x) if isinstance(x, torch.SymFloat) else x


def _constant(x: Any) -> bool:
    expr = x.node.expr
    return bool(getattr(expr, "is_number", False))


@dataclass(frozen=True)
class _Named(Source):
    """The name ShapeEnv gives the symbols of one input (its messages and logs use it);
    ember itself reads symbols through its own sources (:meth:`Shapes.guard`)."""

    label: str

    @property
    def _name_template(self) -> str:
        return self.label

    @property
    def guard_source(self) -> GuardSource:
        return GuardSource.LOCAL


@dataclass(eq=False)
class Shapes:
    """The ShapeEnv of one translation, and where each of its symbols is read in the frame."""

    policy: Policy = field(default_factory=Policy)
    code: types.CodeType | None = None
    _env: ShapeEnv | None = None
    inputs: list[_Input] = field(default_factory=list)  # the inputs with symbolic sizes
    sealed: bool = False  # the guards were added (Shapes.guard)
    # the user line that was running when each of the ShapeEnv's guards was recorded
    wheres: list[tuple[str, int | None] | None] = field(default_factory=list)
    ints: list[tuple[Any, Any]] = field(default_factory=list)  # (source, symbol) of int inputs

    @property
    def recording(self) -> bool:
        """Whether there is a ShapeEnv whose guards need their lines noted."""
        return self._env is not None

    def note_where(self, where: tuple[str, int | None] | None) -> None:
        """The guards recorded since the last call came from the line ``where``."""
        missing = len(self.env.guards) - len(self.wheres)
        if missing > 0:
            self.wheres.extend([where] * missing)

    @property
    def env(self) -> ShapeEnv:
        """The ShapeEnv, made on first use: a translation without symbols never pays for
        it. ``.item()`` and ``nonzero`` still raise on fake tensors (they break the graph),
        as without one."""
        if self._env is None:
            from ember.capture.shape_env import QuietShapeEnv

            now = settings.section.get()
            self._env = QuietShapeEnv(
                allow_scalar_outputs=now.scalar_outputs,
                allow_dynamic_output_shape_ops=now.dynamic_output_shape_ops,
            )
        return self._env

    def data_dependent(self, fake_mode: Any) -> None:
        """Give ``fake_mode`` the ShapeEnv from the start when a setting asks for unbacked
        symbols (``.item()``, ``nonzero``): without one, fake tensors raise instead."""
        now = settings.section.get()
        if (now.scalar_outputs or now.dynamic_output_shape_ops) and fake_mode.shape_env is None:
            fake_mode.shape_env, fake_mode.static_shapes = self.env, False

    def fake_input(
        self, fake_mode: Any, real: torch.Tensor, source: Any, key: str, parameter: bool
    ) -> torch.Tensor:
        """The fake tensor of input ``real``: symbolic where the policy says."""
        import sympy
        from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

        code = self.code
        changed = observe(code, key, tuple(real.shape)) if code is not None else frozenset()
        dims = self.policy.dims(real, parameter=parameter, changed=changed)
        plain = type(real) in (torch.Tensor, torch.nn.Parameter)
        if not dims or real.layout is not torch.strided or not plain:
            return inputfakes.input_fake(fake_mode, real)  # from_tensor's, made directly
        if fake_mode.shape_env is None:  # from here on the mode makes symbolic fakes
            fake_mode.shape_env, fake_mode.static_shapes = self.env, False
        unbacked = {d for d, m in marks_of(real).items() if m.unbacked and d in dims}
        kinds = [
            DimDynamic.UNBACKED if d in unbacked else DimDynamic.DYNAMIC if d in dims
            else DimDynamic.STATIC
            for d in range(real.dim())
        ]  # fmt: skip
        context: StatelessSymbolicContext[Any, Any] = StatelessSymbolicContext(dynamic_sizes=kinds)
        fake: torch.Tensor = fake_mode.from_tensor(
            real, symbolic_context=context, source=_Named(key)
        )
        if unbacked:  # an input's own symbols: no op of the graph binds them (make_fx would)
            mine = {n.node.expr for n in (*fake.shape, *fake.stride()) if is_symbolic(n)}
            pending = self.env.pending_fresh_unbacked_symbols
            pending[:] = [u for u in pending if u not in mine]
        marks = {d: m for d, m in marks_of(real).items() if d in dims}
        for d, mark in marks.items():
            size: Any = fake.shape[d]
            low, high = mark.min or 0, sympy.oo if mark.max is None else mark.max
            if not low <= real.shape[d] <= high:
                raise MarkedDynamicError(
                    f"{source}.size({d}) is {real.shape[d]}, outside the bounds"
                    f" [{mark.min}, {mark.max}] mark_dynamic gave it"
                )
            if is_symbolic(size) and (mark.min is not None or mark.max is not None):
                low = builtins.max(mark.min or 2, 2)  # sizes 0 and 1 specialise
                self.env.constrain_symbol_range(size.node.expr, low, mark.max or sympy.oo)
        self.inputs.append(_Input.of(source, fake, marks))
        return fake

    def symbolic_int(self, fake_mode: Any, real: int, source: Any, key: str) -> Any:
        """A ``torch.SymInt`` for the frame's int ``real`` when the policy makes it one (it
        changed between compiles of this code, or ``dynamic=True``); None for a constant
        (0 and 1 specialise, as sizes do)."""
        from torch.fx.experimental.symbolic_shapes import DimDynamic

        changed = observe(self.code, key, (real,)) if self.code is not None else frozenset()
        if not self.policy.int_symbolic(bool(changed)):
            return None
        if real in (0, 1) or real < 0:
            return None
        if fake_mode.shape_env is None:
            fake_mode.shape_env, fake_mode.static_shapes = self.env, False
        named = _Named(key)
        sym = self.env.create_symbol(real, source=named, dynamic_dim=DimDynamic.DYNAMIC)
        self.ints.append((source, sym))
        return self.env.create_symintnode(sym, hint=real, source=named)

    def float_changed(self, key: str, real: float) -> bool:
        """Whether the float reached by ``key`` changed between compiles of this code (an
        LR a scheduler sets between steps): it is then a graph input, not a constant."""
        # (by hash: equal floats hash equal, and a collision only keeps one a constant)
        return self.code is not None and bool(observe(self.code, f"float {key}", (hash(real),)))

    def guard(self, guards: Any, sources: Any) -> None:
        """Add the guards this translation's symbols need to ``guards`` (a
        ``GuardCollector``): each symbol read from the first size, stride or offset holding
        it, every other symbolic entry equal to its expression, each symbol's range, and
        every condition a branch recorded. ``sources`` builds the size/stride sources.
        Only the first call adds them."""
        import sympy

        if self.sealed:
            return
        self.sealed = True
        bound: dict[sympy.Symbol, Any] = {}  # symbol -> the source it is read from
        relations: list[tuple[sympy.Basic, dict[str, Any]]] = []
        for found in self.inputs:
            for entry, expr in found.entries(sources):
                if isinstance(expr, int):
                    continue
                if isinstance(expr, sympy.Symbol) and expr not in bound:
                    bound[expr] = entry
                else:  # x.stride(0) == s1, or a second tensor sharing a symbol
                    here = sympy.Symbol("_e", integer=True)
                    relations.append((sympy.Eq(here, expr), {"_e": entry}))
        for source, sym in self.ints:
            if sym in bound:
                relations.append((sympy.Eq(sympy.Symbol("_e", integer=True), sym), {"_e": source}))
            else:
                bound[sym] = source
        self.check_marks()
        relations += self._facts(bound) + self._conditions()
        # ember's names, in the order the frame's inputs hold them: s0, s1, ...
        rename = {sym: sympy.Symbol(f"s{i}", integer=True) for i, sym in enumerate(bound)}
        seen = set()
        for expr, extra in relations:
            where = extra.pop("@where", None)
            named = {str(rename[s]): bound[s] for s in expr.free_symbols if s in bound}
            names = {**named, **extra}
            missing = [str(s) for s in expr.free_symbols if s not in bound and str(s) not in extra]
            if missing:
                raise RuntimeError(f"shape guard {expr} reads symbols no input holds: {missing}")
            text = python_expression(expr.xreplace(rename))
            key = (text, tuple(sorted(names.items(), key=str)))
            if text == "True" or key in seen:
                continue
            seen.add(key)
            guards.shape_relation(text, names, None if where is None else f"{where[0]}:{where[1]}")

    def _facts(self, bound: Mapping[sympy.Symbol, Any]) -> list[tuple[Any, dict[str, Any]]]:
        """What the ShapeEnv concluded about each symbol: its range (``s0 >= 2``, refined by
        branches: ``s0 > 3`` leaves ``s0 >= 4``) and its replacement (``s1 == 6`` when the
        code specialised it, ``s1 == s0`` when it equated two sizes)."""
        import sympy

        out: list[tuple[Any, dict[str, Any]]] = []
        self.note_where(None)
        last: dict[
            Any, Any
        ] = {}  # the line of the last branch on each symbol: what refined its range
        for g, where in zip(self.env.guards, self.wheres, strict=True):
            last |= dict.fromkeys(g.expr.free_symbols, where)
        for sym in bound:
            at = {"@where": last.get(sym)}
            now = self.env.replace(sym)
            if now != sym:
                out.append((sympy.Eq(sym, now), at))
                continue
            vr = self.env.var_to_range.get(sym)
            if vr is not None and vr.lower.is_Integer:
                out.append((sym >= int(vr.lower), at))
            if vr is not None and vr.upper.is_Integer:
                out.append((sym <= int(vr.upper), at))
        return out

    def _conditions(self) -> list[tuple[Any, dict[str, Any]]]:
        """The conditions branches recorded, under the replacements, less those the ranges
        and replacements (:meth:`_facts`, always guarded) already imply."""
        out: list[tuple[Any, dict[str, Any]]] = []
        for g, where in zip(self.env.guards, self.wheres, strict=True):
            # Only what is guarded anyway may simplify a condition: the replacements and
            # ranges (:meth:`_facts`). The ShapeEnv's axioms and divisibility facts come
            # from these very conditions, and would prove each one from itself.
            expr = self.env.replace(g.expr)
            try:
                implied = self.env._maybe_evaluate_static(expr, axioms=())
            except Exception:  # an expression the static evaluator cannot decide
                implied = None
            if implied is None or not bool(implied):
                out.append((expr, {"@where": where}))
        return out

    def check_marks(self, where: str | None = None) -> None:
        """A dim marked with ``mark_dynamic`` that the code specialised is an error; it
        names ``where`` (the user's ``file:line``) when known."""
        for found in self.inputs:
            for d, mark in found.marks.items():
                expr = found.sizes[d]
                if not mark.strict or isinstance(expr, int):
                    continue
                now = self.env.replace(expr)
                if getattr(now, "is_number", False):
                    raise MarkedDynamicError(
                        f"{found.source}.size({d}) was marked dynamic (mark_dynamic), but the"
                        f" code specialised it to {now}"
                        + (f" at {where}" if where else "")
                        + "; use maybe_mark_dynamic to allow that"
                    )


@dataclass(frozen=True, slots=True)
class _Input:
    """An input tensor with symbolic sizes: its source, and each size, stride and storage
    offset as the ShapeEnv first made it (an int, or a sympy expression over symbols: the
    raw one, before later guards replaced a symbol by a number)."""

    source: Any
    sizes: tuple[Any, ...]
    strides: tuple[Any, ...]
    offset: Any
    marks: Mapping[int, Mark]

    @classmethod
    def of(cls, source: Any, fake: torch.Tensor, marks: Mapping[int, Mark]) -> _Input:
        def raw(x: Any) -> Any:
            return x.node._expr if isinstance(x, torch.SymInt) else int(x)

        sizes = tuple(raw(n) for n in fake.shape)
        strides = tuple(raw(n) for n in fake.stride())
        return cls(source, sizes, strides, raw(fake.storage_offset()), marks)

    def entries(self, sources: Any) -> Iterable[tuple[Any, Any]]:
        """(source, raw value) of each size, then each stride, then the storage offset."""
        for d, size in enumerate(self.sizes):
            yield sources.size(self.source, d), size
        for d, stride in enumerate(self.strides):
            yield sources.stride(self.source, d), stride
        yield sources.offset(self.source), self.offset


class MarkedDynamicError(RuntimeError):
    """The code specialised a size marked with :func:`mark_dynamic`."""


# -- printing sympy as Python ---------------------------------------------------------------


def _join(op: str) -> Any:
    return lambda e, p: "(" + f" {op} ".join(p(a) for a in e.args) + ")"


def _binary(fmt: str) -> Any:
    return lambda e, p: fmt.format(*(p(a) for a in e.args))


def _mul(e: Any, p: Any) -> str:
    import sympy

    coeff, rest = e.as_coeff_Mul()
    body = " * ".join(p(a) for a in sympy.Mul.make_args(rest))
    return f"({body})" if coeff == 1 else f"({p(coeff)} * {body})"


def _pow(e: Any, p: Any) -> str:
    base, exp = e.args
    if not (exp.is_Integer and 0 < exp <= 8):
        raise ValueError(f"cannot print {e} as a shape guard")
    return "(" + " * ".join([p(base)] * int(exp)) + ")"


_PRINTERS: dict[str, Any] = {
    "Symbol": lambda e, p: str(e),
    "Integer": lambda e, p: str(int(e)),
    "One": lambda e, p: "1",
    "Zero": lambda e, p: "0",
    "NegativeOne": lambda e, p: "-1",
    "BooleanTrue": lambda e, p: "True",
    "BooleanFalse": lambda e, p: "False",
    "Add": _join("+"),
    "Mul": _mul,
    "Pow": _pow,
    "PowByNatural": _pow,
    "FloorDiv": _binary("({} // {})"),
    "CleanDiv": _binary("({} // {})"),
    "CeilDiv": _binary("(-(-{} // {}))"),
    "Mod": _binary("({} % {})"),
    "PythonMod": _binary("({} % {})"),
    "ModularIndexing": _binary("(({} // {}) % {})"),
    "Max": lambda e, p: "max(" + ", ".join(p(a) for a in e.args) + ")",
    "Min": lambda e, p: "min(" + ", ".join(p(a) for a in e.args) + ")",
    "Equality": _binary("({} == {})"),
    "Unequality": _binary("({} != {})"),
    "StrictLessThan": _binary("({} < {})"),
    "LessThan": _binary("({} <= {})"),
    "StrictGreaterThan": _binary("({} > {})"),
    "GreaterThan": _binary("({} >= {})"),
    "And": _join("and"),
    "Or": _join("or"),
    "Not": lambda e, p: f"(not {p(e.args[0])})",
}


def python_expression(expr: Any) -> str:
    """``expr`` (a sympy expression over size symbols) as Python source, with Python's
    integer semantics (``//`` and ``%`` floor, as torch's ``FloorDiv``/``PythonMod`` do).

    >>> import sympy
    >>> s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    >>> python_expression(sympy.Eq(s0, 2 * s1)), python_expression(s0 >= 2)
    ('s0 == (2 * s1)', 's0 >= 2')
    """

    def p(e: Any) -> str:
        rule = _PRINTERS.get(type(e).__name__)
        if rule is None:
            raise ValueError(f"cannot print {e} ({type(e).__name__}) as a shape guard")
        return str(rule(e, p))

    text = p(expr)
    return text[1:-1] if text.startswith("(") and _balanced(text[1:-1]) else text


def _balanced(text: str) -> bool:
    depth = 0
    for c in text:
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth < 0:
            return False
    return depth == 0


def symbolic_entries(fake: torch.Tensor) -> tuple[frozenset[int], ...]:
    """The dims of ``fake`` whose size, and those whose stride, are symbolic: the tensor's
    match guard leaves them to the shape relations; then the dims whose size is unbacked
    (``mark_unbacked``: 0 and 1 do not specialise them).

    >>> symbolic_entries(torch.ones(2, 3))
    (frozenset(), frozenset(), frozenset())
    """
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    sizes = frozenset(d for d, n in enumerate(fake.shape) if is_symbolic(n))
    strides = frozenset(d for d, n in enumerate(fake.stride()) if is_symbolic(n))
    unbacked = frozenset(d for d in sizes if free_unbacked_symbols(fake.shape[d]))
    return sizes, strides, unbacked
