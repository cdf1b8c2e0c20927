"""Guard kinds: one table row per kind, holding its code emitter and its words.

A :class:`Guard` is ``(source, kind, expected)`` plus, where known, the user
``file:line`` that made it necessary. :data:`KINDS` maps every
:class:`GuardKind` to a :class:`KindRule`: the expression the compiled check
evaluates, the message :meth:`CompiledGuards.explain_failure` prints when that
expression is false, the one-line description ``str(guardset)`` shows, and the
order the kind is checked in. Check and explanation come from the same row,
so they cannot drift apart.

Build guards with the factory functions, which validate their input:

>>> g = equals(Local("k"), 3, where="model.py:7")
>>> g.kind, g.expected, g.where
(<GuardKind.EQUALS: 'EQUALS'>, 3, 'model.py:7')
>>> KINDS[GuardKind.EQUALS].describe(g)
'k == 3'
"""

from __future__ import annotations

import enum
import math
import weakref
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ember.guards import _accel
from ember.guards.relations import ShapeRelation
from ember.guards.sources import Backend, Emitter, Source, TorchState
from ember.guards.specs import ModuleSpec, TensorSpec, module_mismatch, tensor_mismatch
from ember.guards.state import STATE_FIELDS, current_backend

__all__ = [
    "KINDS",
    "Guard",
    "GuardKind",
    "KindRule",
    "backend",
    "dict_keys",
    "equals",
    "global_state",
    "id_match",
    "is_none",
    "length",
    "module_state",
    "no_aliasing",
    "not_none",
    "same_tensor",
    "shape_relation",
    "storage_aliasing",
    "tensor_match",
    "type_match",
    "weakref_alive",
]

#: Evaluates a source against the frame being explained (may raise).
Fetch = Callable[[Source], Any]


class GuardKind(enum.Enum):
    """What a guard checks about its source's value.

    >>> [kind.name for kind in GuardKind][:4]
    ['BACKEND', 'GLOBAL_STATE', 'WEAKREF_ALIVE', 'EQUALS']
    """

    BACKEND = "BACKEND"
    GLOBAL_STATE = "GLOBAL_STATE"
    WEAKREF_ALIVE = "WEAKREF_ALIVE"
    EQUALS = "EQUALS"
    TYPE_MATCH = "TYPE_MATCH"
    ID_MATCH = "ID_MATCH"
    IS_NONE = "IS_NONE"
    NOT_NONE = "NOT_NONE"
    LENGTH = "LENGTH"
    DICT_KEYS = "DICT_KEYS"
    SAME_TENSOR = "SAME_TENSOR"
    NO_ALIASING = "NO_ALIASING"
    MODULE_STATE = "MODULE_STATE"
    TENSOR_MATCH = "TENSOR_MATCH"
    STORAGE_ALIASING = "STORAGE_ALIASING"
    SHAPE_RELATION = "SHAPE_RELATION"


@dataclass(frozen=True, slots=True)
class Guard:
    """One assumption: ``source``'s value satisfies ``kind`` against ``expected``.

    ``where`` (the user ``file:line`` that needed it) is shown by
    ``str(guardset)`` and ignored by equality.

    >>> Guard(Local("x"), GuardKind.IS_NONE, None) == is_none(Local("x"), where="a.py:1")
    True
    """

    source: Source
    kind: GuardKind
    expected: Any
    where: str | None = field(default=None, compare=False)

    def key(self) -> Hashable:
        """Identity used to deduplicate guards: equal keys check the same thing.

        >>> equals(Local("k"), 1).key() == equals(Local("k"), True).key()
        False
        """
        return (self.source, self.kind, KINDS[self.kind].key(self.expected))


@dataclass(frozen=True, slots=True)
class KindRule:
    """How one guard kind is checked, explained, described and ordered.

    ``tier`` orders first (0: no fetch, 1: ordinary, 2: costly and batched, 3: relations
    between tensors the tier-2 checks have seen), then source depth, then ``rank``.
    ``batch``, when set, checks a run of guards of this kind in one call inside the
    compiled check. ``sources`` lists every source a guard reads (for ordering);
    ``headed`` says whether a failure's message is headed by the guard's source
    (a relation's message names its own sources).

    >>> KINDS[GuardKind.TENSOR_MATCH].tier
    2
    """

    tier: int
    rank: int
    emit: Callable[[Guard, Emitter], str]
    message: Callable[[Guard, Fetch], str]
    describe: Callable[[Guard], str]
    key: Callable[[Any], Hashable] = id
    batch: Callable[[Sequence[Guard], Emitter], str] | None = None
    sources: Callable[[Guard], tuple[Source, ...]] = lambda g: (g.source,)
    headed: bool = True


# --- constants -------------------------------------------------------------

_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device)


def _is_constant(value: object) -> bool:
    if type(value) in (tuple, list):
        return all(_is_constant(item) for item in value)  # type: ignore[attr-defined]
    return type(value) in _SCALARS


def _const_key(value: object) -> Hashable:
    """Equal keys for exactly the values an EQUALS guard cannot tell apart."""
    if type(value) in (tuple, list):
        return (type(value), tuple(_const_key(item) for item in value))  # type: ignore[attr-defined]
    return (type(value), repr(value))


def _emit_float(code: str, value: float, em: Emitter) -> str:
    if math.isnan(value):
        return f"type({code}) is float and {code} != {code}"
    if value == 0.0:  # 0.0 == -0.0, but 1 / x tells them apart
        sign = f"{em.bind(math.copysign)}(1.0, {code}) == {math.copysign(1.0, value)}"
        return f"type({code}) is float and {code} == 0.0 and {sign}"
    literal = repr(value) if math.isfinite(value) else em.bind(value)
    return f"type({code}) is float and {code} == {literal}"


def _emit_const(code: str, value: object, em: Emitter) -> str:
    """A strict equality test: types match exactly, element by element."""
    if value is None or type(value) is bool:
        return f"{code} is {value!r}"
    if type(value) is float:
        return _emit_float(code, value, em)
    if type(value) in (int, str):
        return f"type({code}) is {type(value).__name__} and {code} == {value!r}"
    if type(value) is torch.dtype:
        return f"{code} is {em.bind(value)}"
    if type(value) is torch.device:
        return f"type({code}) is {em.bind(torch.device)} and {code} == {em.bind(value)}"
    items: Sequence[object] = value  # type: ignore[assignment]
    parts = [f"type({code}) is {type(value).__name__}", f"len({code}) == {len(items)}"]
    parts += [f"({_emit_const(f'{code}[{i}]', item, em)})" for i, item in enumerate(items)]
    return " and ".join(parts)


def _fmt_const(value: object) -> str:
    return f"{value!r} ({type(value).__name__})"


def _msg_equals(g: Guard, fetch: Fetch) -> str:
    got = fetch(g.source)
    try:  # values that compare equal but differ in type (3 and 3.0) need their types shown
        alike = type(got) is not type(g.expected) and bool(got == g.expected)
    except Exception:
        alike = False
    if alike:
        return f"expected {_fmt_const(g.expected)}, got {_fmt_const(got)}"
    return f"expected {g.expected!r}, got {got!r}"


# --- object identity and shape ----------------------------------------------


def _short(obj: object) -> str:
    name = getattr(obj, "__qualname__", None)
    if isinstance(name, str):
        return f"{type(obj).__name__} {name}"
    return f"{type(obj).__qualname__} object at {id(obj):#x}"


def _msg_type(g: Guard, fetch: Fetch) -> str:
    got = type(fetch(g.source))
    return f"type expected {g.expected.__qualname__}, got {got.__qualname__}"


@dataclass(frozen=True, slots=True, eq=False)
class WeakIdentity:
    """The expected object of an ``ID_MATCH`` guard, held by a weak reference.

    A cache entry lives as long as its code object, so a strong reference would
    keep every module an entry was compiled for alive. A dead referent makes the
    guard fail, so its id, even if reused by a new object, never matches.

    >>> class Thing: pass
    >>> thing = Thing()
    >>> weak = WeakIdentity.of(thing)
    >>> weak.get() is thing, weak.oid == id(thing)
    (True, True)
    """

    ref: weakref.ref[Any]
    oid: int

    @classmethod
    def of(cls, obj: object) -> WeakIdentity | None:
        """A weak identity of ``obj``, or None if it cannot be weakly referenced."""
        try:
            return cls(weakref.ref(obj), id(obj))
        except TypeError:
            return None

    def get(self) -> Any:
        """The object, or None once it has been freed."""
        return self.ref()


def _expected_object(expected: object) -> Any:
    return expected.get() if isinstance(expected, WeakIdentity) else expected


def _identity_key(expected: object) -> Hashable:
    return expected.oid if isinstance(expected, WeakIdentity) else id(expected)


def _emit_id(g: Guard, em: Emitter) -> str:
    if isinstance(g.expected, WeakIdentity):
        return f"{em.value(g.source)} is {em.bind(g.expected.ref)}()"
    return f"{em.value(g.source)} is {em.bind(g.expected)}"


def _describe_id(expected: object) -> str:
    obj = _expected_object(expected)
    if obj is None and isinstance(expected, WeakIdentity):
        return f"object at {expected.oid:#x}, since deleted"
    return _short(obj)


def _msg_id(g: Guard, fetch: Fetch) -> str:
    return f"expected the {_describe_id(g.expected)}, got the {_short(fetch(g.source))}"


def _msg_length(g: Guard, fetch: Fetch) -> str:
    return f"length expected {g.expected}, got {len(fetch(g.source))}"


def _dict_key_types(keys: tuple[object, ...]) -> tuple[type, ...] | None:
    """Key types to check too, unless every key is a str (the usual case)."""
    types = tuple(type(key) for key in keys)
    return None if all(t is str for t in types) else types


def _emit_dict_keys(g: Guard, em: Emitter) -> str:
    code = em.value(g.source)
    test = f"isinstance({code}, dict) and tuple({code}) == {em.bind(g.expected)}"
    types = _dict_key_types(g.expected)
    return test if types is None else f"{test} and tuple(map(type, {code})) == {em.bind(types)}"


def _msg_dict_keys(g: Guard, fetch: Fetch) -> str:
    got = fetch(g.source)
    if not isinstance(got, dict):
        return f"expected a dict, got {type(got).__qualname__}"
    return f"keys expected {list(g.expected)}, got {list(got)}"


def _msg_none(g: Guard, fetch: Fetch) -> str:
    got = fetch(g.source)
    if g.kind is GuardKind.IS_NONE:
        return f"expected None, got {type(got).__qualname__}"
    return "expected not None, got None"


# --- global state, backend, liveness ----------------------------------------


def _field(g: Guard) -> str:
    assert isinstance(g.source, TorchState), "GLOBAL_STATE guards read a TorchState source"
    return g.source.field


def _emit_state(g: Guard, em: Emitter) -> str:
    return STATE_FIELDS[_field(g)].test(g.expected, em.bind)


def _batch_state(guards: Sequence[Guard], em: Emitter) -> str:
    """All the probes of a run of state guards in one C call, then the rest."""
    probes: list[tuple[Callable[[], object], object]] = []
    rest: list[str] = []
    for g in guards:
        field = STATE_FIELDS[_field(g)]
        found = field.probes(g.expected)
        probes += found
        rest += [] if found else [field.test(g.expected, em.bind)]
    fns, values = em.bind(tuple(fn for fn, _ in probes)), em.bind(tuple(v for _, v in probes))
    return " and ".join([f"{em.bind(_accel.calls_return)}({fns}, {values})", *rest])


def _msg_state(g: Guard, fetch: Fetch) -> str:
    fmt = STATE_FIELDS[_field(g)].fmt
    return f"expected {fmt(g.expected)}, got {fmt(fetch(g.source))}"


def _emit_backend(g: Guard, em: Emitter) -> str:
    code = em.value(g.source)
    if type(g.expected) is str:
        return f"type({code}) is str and {code} == {g.expected!r}"
    return f"{code} is {em.bind(g.expected)}"


def _backend_key(expected: object) -> Hashable:
    return expected if type(expected) is str else id(expected)


def _emit_weakref(g: Guard, em: Emitter) -> str:
    return f"{em.bind(g.expected)}() is not None"


# --- tensors and modules ----------------------------------------------------


def _emit_tensor(g: Guard, em: Emitter) -> str:
    packed = em.bind(_accel.pack_tensor(g.expected))
    return f"{em.bind(_accel.tensor_match)}({packed}, {em.value(g.source)})"


def _batch_tensors(guards: Sequence[Guard], em: Emitter) -> str:
    packed = em.bind(tuple(_accel.pack_tensor(g.expected) for g in guards))
    values = ", ".join(em.value(g.source) for g in guards)
    return f"{em.bind(_accel.tensors_match)}({packed}, {values})"


def _msg_tensor(g: Guard, fetch: Fetch) -> str:
    return tensor_mismatch(g.expected, fetch(g.source)) or "tensor check failed"


def _emit_module(g: Guard, em: Emitter) -> str:
    packed = em.bind(_accel.pack_module(g.expected))
    return f"{em.bind(_accel.module_match)}({packed}, {em.value(g.source)})"


def _batch_modules(guards: Sequence[Guard], em: Emitter) -> str:
    packed = em.bind(tuple(_accel.pack_module(g.expected) for g in guards))
    values = ", ".join(em.value(g.source) for g in guards)
    return f"{em.bind(_accel.modules_match)}({packed}, {values})"


def _msg_module(g: Guard, fetch: Fetch) -> str:
    return module_mismatch(g.expected, fetch(g.source)) or "module check failed"


def _emit_aliasing(g: Guard, em: Emitter) -> str:
    values = ", ".join(em.value(src) for src in (g.source, *g.expected))
    return f"{em.bind(_accel.distinct)}({values})"


def _msg_aliasing(g: Guard, fetch: Fetch) -> str:
    sources = (g.source, *g.expected)
    values = [fetch(src) for src in sources]
    for i, value in enumerate(values):
        for j in range(i):
            if values[j] is value:
                return f"expected distinct tensors, got {sources[j]} is {sources[i]}"
    return "expected distinct tensors"


def _emit_storage(g: Guard, em: Emitter) -> str:
    others, layout = g.expected
    values = ", ".join(em.value(src) for src in (g.source, *others))
    return f"{em.bind(_accel.storage_groups)}({em.bind(layout)}, {values})"


def _msg_storage(g: Guard, fetch: Fetch) -> str:
    others, layout = g.expected
    sources = (g.source, *others)
    groups, offsets = _accel.full_layout(layout, len(sources))
    values = [fetch(src) for src in sources]
    if not all(isinstance(v, torch.Tensor) for v in values):
        return "expected tensors"
    got = _accel.storage_layout(tuple(values))
    got_groups, got_offsets = _accel.full_layout(got, len(sources))
    for i, src in enumerate(sources):
        if got_groups[i] != groups[i]:
            want = "its own storage" if groups[i] == i else f"the storage of {sources[groups[i]]}"
            have = "its own" if got_groups[i] == i else f"that of {sources[got_groups[i]]}"
            return f"storage sharing changed: {src} expected {want}, got {have}"
    for i, src in enumerate(sources):
        if got_offsets[i] != offsets[i]:
            return f"storage offset of {src} expected {offsets[i]}, got {got_offsets[i]}"
    return "storage sharing changed"


def _describe_storage(g: Guard) -> str:
    others, layout = g.expected
    sources = (g.source, *others)
    groups, offsets = _accel.full_layout(layout, len(sources))
    shared = [
        f"{sources[i]} shares with {sources[k]} at offset {offsets[i]}"
        for i, k in enumerate(groups)
        if k != i
    ]
    return f"storages of {_names(sources)}: " + ("; ".join(shared) or "all distinct")


def _relation(g: Guard) -> ShapeRelation:
    assert isinstance(g.expected, ShapeRelation), "SHAPE_RELATION guards expect a ShapeRelation"
    return g.expected


def _batch_relations(guards: Sequence[Guard], em: Emitter) -> str:
    """A run of relations as one test: no call beyond the fetches of their symbols."""
    return " and ".join(f"({_relation(g).emit(em)})" for g in guards)


def _msg_relation(g: Guard, fetch: Fetch) -> str:
    rel = _relation(g)
    return rel.explain({name: fetch(source) for name, source in rel.symbols})


def _names(sources: Sequence[Source]) -> str:
    return ", ".join(map(str, sources))


#: Every guard kind: how to check it, explain it, describe it, order it.
KINDS: dict[GuardKind, KindRule] = {
    GuardKind.BACKEND: KindRule(
        0, 0, _emit_backend,
        lambda g, fetch: f"expected {g.expected!r}, got {fetch(g.source)!r}",
        lambda g: f"backend == {g.expected!r}", key=_backend_key,
    ),
    GuardKind.GLOBAL_STATE: KindRule(
        0, 1, _emit_state, _msg_state,
        lambda g: f"{g.source} == {STATE_FIELDS[_field(g)].fmt(g.expected)}",
        key=lambda expected: expected, batch=_batch_state,
    ),
    GuardKind.WEAKREF_ALIVE: KindRule(
        0, 2, _emit_weakref, lambda g, fetch: "weakly referenced object is dead",
        lambda g: f"{g.source} is alive",
    ),
    GuardKind.EQUALS: KindRule(
        1, 0, lambda g, em: _emit_const(em.value(g.source), g.expected, em), _msg_equals,
        lambda g: f"{g.source} == {g.expected!r}", key=_const_key,
    ),
    GuardKind.TYPE_MATCH: KindRule(
        1, 1, lambda g, em: f"type({em.value(g.source)}) is {em.bind(g.expected)}", _msg_type,
        lambda g: f"type({g.source}) is {g.expected.__qualname__}",
    ),
    GuardKind.ID_MATCH: KindRule(
        1, 2, _emit_id, _msg_id, lambda g: f"{g.source} is the {_describe_id(g.expected)}",
        key=_identity_key,
    ),
    GuardKind.IS_NONE: KindRule(
        1, 3, lambda g, em: f"{em.value(g.source)} is None", _msg_none,
        lambda g: f"{g.source} is None", key=lambda expected: None,
    ),
    GuardKind.NOT_NONE: KindRule(
        1, 3, lambda g, em: f"{em.value(g.source)} is not None", _msg_none,
        lambda g: f"{g.source} is not None", key=lambda expected: None,
    ),
    GuardKind.LENGTH: KindRule(
        1, 4, lambda g, em: f"len({em.value(g.source)}) == {g.expected!r}", _msg_length,
        lambda g: f"len({g.source}) == {g.expected}", key=lambda expected: expected,
    ),
    GuardKind.DICT_KEYS: KindRule(
        1, 5, _emit_dict_keys, _msg_dict_keys,
        lambda g: f"list({g.source}) == {list(g.expected)}", key=_const_key,
    ),
    GuardKind.SAME_TENSOR: KindRule(
        1, 6, lambda g, em: f"{em.value(g.source)} is {em.value(g.expected)}",
        lambda g, fetch: f"expected the same tensor as {g.expected}, got another",
        lambda g: f"{g.source} is {g.expected}", key=lambda expected: expected,
        sources=lambda g: (g.source, g.expected),
    ),
    GuardKind.NO_ALIASING: KindRule(
        1, 7, _emit_aliasing, _msg_aliasing,
        lambda g: f"{_names((g.source, *g.expected))} are distinct objects",
        key=lambda expected: expected, sources=lambda g: (g.source, *g.expected),
    ),
    GuardKind.MODULE_STATE: KindRule(
        2, 0, _emit_module, _msg_module, lambda g: f"{g.source}: {g.expected}",
        key=lambda expected: expected, batch=_batch_modules,
    ),
    GuardKind.TENSOR_MATCH: KindRule(
        2, 1, _emit_tensor, _msg_tensor, lambda g: f"{g.source}: {g.expected}",
        key=lambda expected: expected, batch=_batch_tensors,
    ),
    # after the tensor checks: they show the values are tensors (of the right rank) first
    GuardKind.SHAPE_RELATION: KindRule(
        3, 0, lambda g, em: _relation(g).emit(em), _msg_relation, lambda g: str(g.expected),
        key=lambda expected: expected.key(), batch=_batch_relations,
        sources=lambda g: tuple(source for _, source in _relation(g).symbols), headed=False,
    ),
    GuardKind.STORAGE_ALIASING: KindRule(
        3, 1, _emit_storage, _msg_storage, _describe_storage, key=lambda expected: expected,
        sources=lambda g: (g.source, *g.expected[0]),
    ),
}  # fmt: skip


# --- factories ----------------------------------------------------------------


def type_match(source: Source, value: object, where: str | None = None) -> Guard:
    """``type(source) is type(value)``.

    >>> print(KINDS[GuardKind.TYPE_MATCH].describe(type_match(Local("x"), 1.0)))
    type(x) is float
    """
    return Guard(source, GuardKind.TYPE_MATCH, type(value), where)


def id_match(source: Source, obj: object, where: str | None = None) -> Guard:
    """``source is obj``: the very same object (a module, a function).

    The guard holds ``obj`` weakly when it can (a :class:`WeakIdentity`), so a
    cached entry does not keep it alive, and strongly otherwise.

    >>> id_match(Global("torch"), torch).expected.get() is torch
    True
    >>> id_match(Global("n"), 5).expected
    5
    """
    weak = WeakIdentity.of(obj)
    return Guard(source, GuardKind.ID_MATCH, obj if weak is None else weak, where)


def equals(source: Source, value: object, where: str | None = None) -> Guard:
    """``source == value`` with exact types, for int, float, bool, str, None,
    ``torch.dtype``, ``torch.device`` and tuples or lists of these.

    >>> equals(Local("k"), [1, 2.0]).expected
    [1, 2.0]
    >>> equals(Local("k"), object())
    Traceback (most recent call last):
    TypeError: EQUALS needs a constant, not object
    """
    if not _is_constant(value):
        raise TypeError(f"EQUALS needs a constant, not {type(value).__qualname__}")
    return Guard(source, GuardKind.EQUALS, value, where)


def tensor_match(
    source: Source,
    t: torch.Tensor,
    where: str | None = None,
    *,
    dynamic_sizes: Iterable[int] = (),
    dynamic_strides: Iterable[int] = (),
    unbacked_sizes: Iterable[int] = (),
) -> Guard:
    """``source`` is a tensor with ``t``'s subclass, dtype, device, sizes,
    strides, requires_grad and autograd/lazy-view dispatch keys. The sizes of
    ``dynamic_sizes`` and strides of ``dynamic_strides`` are left to relation
    guards (see :meth:`TensorSpec.of`); the rank is still checked. A dynamic size of 0
    or 1 is kept (specialised), except in ``unbacked_sizes`` (``mark_unbacked``).

    >>> print(tensor_match(Local("x"), torch.zeros(2)).expected)
    Tensor(torch.float32, cpu, size=(2,), stride=(1,))
    >>> print(tensor_match(Local("x"), torch.zeros(5, 3).t(), dynamic_sizes={1},
    ...                    dynamic_strides={0}).expected)
    Tensor(torch.float32, cpu, size=(3, *), stride=(*, 3))
    """
    dynamic = frozenset(dynamic_sizes)
    spec = TensorSpec.of(t, dynamic, dynamic_strides, dynamic - frozenset(unbacked_sizes))
    return Guard(source, GuardKind.TENSOR_MATCH, spec, where)


def shape_relation(expr: str, symbols: Mapping[str, Source], where: str | None = None) -> Guard:
    """``expr``, a Python boolean expression over symbol names (comparisons, ``+ - *``,
    ``//``, ``%``, ``min``/``max``, ``and``/``or``; sympy's ``Eq``/``Ne``/``Min``/``Max``
    too), holds when each symbol is the value at its source. Checked after the tensor
    matches; a bad expression is a ValueError naming it. Symbols it does not use are
    ignored; equal relations over the same sources deduplicate whatever their names.

    >>> from ember.guards import TensorSize
    >>> g = shape_relation("s0 >= 2", {"s0": TensorSize(Local("x"), 0)})
    >>> print(KINDS[GuardKind.SHAPE_RELATION].describe(g))
    s0 >= 2  where s0 = x.size(0)
    >>> shape_relation("s0 >= 2.5", {"s0": Local("n")})
    Traceback (most recent call last):
    ValueError: bad shape relation 's0 >= 2.5': constant 2.5 is not an int
    """
    relation = ShapeRelation.parse(expr, symbols)
    return Guard(relation.symbols[0][1], GuardKind.SHAPE_RELATION, relation, where)


def length(source: Source, value: Sequence[object], where: str | None = None) -> Guard:
    """``len(source) == len(value)``.

    >>> length(Local("args"), (1, 2)).expected
    2
    """
    return Guard(source, GuardKind.LENGTH, len(value), where)


def dict_keys(source: Source, value: dict[Any, Any], where: str | None = None) -> Guard:
    """Same keys in the same order as ``value``.

    >>> dict_keys(Local("kwargs"), {"b": 1, "a": 2}).expected
    ('b', 'a')
    """
    return Guard(source, GuardKind.DICT_KEYS, tuple(value), where)


def is_none(source: Source, where: str | None = None) -> Guard:
    """``source is None``.

    >>> is_none(Local("mask")).kind.name
    'IS_NONE'
    """
    return Guard(source, GuardKind.IS_NONE, None, where)


def not_none(source: Source, where: str | None = None) -> Guard:
    """``source is not None``.

    >>> not_none(Local("mask")).kind.name
    'NOT_NONE'
    """
    return Guard(source, GuardKind.NOT_NONE, None, where)


def same_tensor(source: Source, other: Source, where: str | None = None) -> Guard:
    """``source is other``: two inputs are the very same tensor.

    >>> print(KINDS[GuardKind.SAME_TENSOR].describe(same_tensor(Local("a"), Local("b"))))
    a is b
    """
    return Guard(source, GuardKind.SAME_TENSOR, other, where)


def no_aliasing(*sources: Source, where: str | None = None) -> Guard:
    """No two of ``sources`` are the same tensor object.

    >>> no_aliasing(Local("a"), Local("b"), Local("c")).expected
    (Local(name='b'), Local(name='c'))
    """
    if len(sources) < 2:
        raise ValueError("no_aliasing needs at least two sources")
    return Guard(sources[0], GuardKind.NO_ALIASING, tuple(sources[1:]), where)


def storage_aliasing(
    sources: Sequence[Source], tensors: Sequence[torch.Tensor], where: str | None = None
) -> Guard:
    """The tensors at ``sources`` share storage as ``tensors`` do now, no more and no less,
    and those that share one sit at the same storage offsets. A graph compiled for
    distinct inputs is wrong for aliased ones where it mutates one and reads the other.

    >>> x = torch.zeros(4)
    >>> g = storage_aliasing([Local("a"), Local("b"), Local("c")], [x, torch.zeros(1), x[1:]])
    >>> print(KINDS[GuardKind.STORAGE_ALIASING].describe(g))
    storages of a, b, c: c shares with a at offset 1
    """
    if len(sources) < 2 or len(sources) != len(tensors):
        raise ValueError("storage_aliasing needs two or more sources, one tensor each")
    layout = _accel.storage_layout(tuple(tensors))
    return Guard(sources[0], GuardKind.STORAGE_ALIASING, (tuple(sources[1:]), layout), where)


def global_state(where: str | None = None) -> list[Guard]:
    """One ``GLOBAL_STATE`` guard per field of ``STATE_FIELDS``, as it is now.

    >>> [str(g.source) for g in global_state()][:2]
    ['grad mode', 'inference mode']
    """
    return [
        Guard(TorchState(name), GuardKind.GLOBAL_STATE, state.read(), where)
        for name, state in STATE_FIELDS.items()
    ]


def module_state(source: Source, module: torch.nn.Module, where: str | None = None) -> Guard:
    """``module``'s training flag and call hooks stay as they are now.

    >>> print(module_state(Local("self"), torch.nn.ReLU()).expected)
    training, no hooks
    """
    return Guard(source, GuardKind.MODULE_STATE, ModuleSpec.of(module), where)


def backend(expected: object = None, where: str | None = None) -> Guard:
    """The running compiled callable's backend is ``expected`` (a name is
    compared by value, anything else by identity); by default the current one.

    >>> backend("eager").expected
    'eager'
    """
    return Guard(
        Backend(), GuardKind.BACKEND, current_backend() if expected is None else expected, where
    )


def weakref_alive(source: Source, obj: object, where: str | None = None) -> Guard:
    """``obj`` (reached at ``source`` when the guard was made) is still alive;
    the guard holds only a weak reference to it.

    >>> class Box: pass
    >>> box = Box()
    >>> weakref_alive(Local("box"), box).expected() is box
    True
    """
    return Guard(source, GuardKind.WEAKREF_ALIVE, weakref.ref(obj), where)
