"""Stamps: check what changed, instead of re-reading every value a guard set reads.

A real model's guard set reads hundreds of values the frame does not pass in: the model's
submodules, their flags and hooks dicts, the functions and module globals the traced code
called, the classes their methods came from. A compiled check re-reads each of them on
every call (a transformers T5 forward: 1840 lines, 0.5 ms of a 4.8 ms step). They almost
never change.

CPython already counts their changes. Every dict carries a version (PEP 509's
``ma_version_tag``) that any store or delete replaces with a new one, and every class an
attribute-cache tag that assigning to it, or to a base class, takes away. So after the
full check passes, :class:`StampState` walks the value each guard reads and writes down
what that value depends on: a *stamp program* of facts such as "dict D still has
version 41 372", "type(m) is still Linear, tag 8 987", "weakref r still points at the
model". The next call tests the facts (``_native.stamps_match``, a few ns each) and, if
they all hold, runs only the guards the walk could not cover (tensors, arguments, module
state, guards read through custom ``__getattribute__``): the covered guards must give the
answer they gave, since every value they read is the very object it was and, being
immutable or compared by identity, answers the same. When a fact fails, the full check
runs, and if it passes the program is recorded again.

The walk is conservative: a step it cannot prove unchanged through dicts and tags (a
property, a ``__slots__`` member, a list, a class with its own ``__getattribute__``, a
closure cell, a global of the frame's own module, which a script's loop rewrites) leaves
that guard to the full check. A covered value is never held by the program: it is
compared by address only after the facts before it show it alive (a value of a dict
whose version did not change is the same live object), so a stamp keeps no model alive.

>>> import torch
>>> from ember.guards import FrameSpec, Local, equals, id_match
>>> from ember.guards.codegen import build_check
>>> from ember.guards.sources import Attr
>>> class Block(torch.nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.eps = 1e-5
>>> m = Block()
>>> guards = [id_match(Local("m"), m), equals(Attr(Local("m"), "eps"), 1e-5)]
>>> frame = FrameSpec("f", ("m",), {}, {})
>>> state = StampState(guards, frame, {}, minimum=1)
>>> check = build_check(guards, frame, {}, state)[1]
>>> check(m), check(m), check(m)  # the second full pass records, the third runs on it
(True, True, True)
>>> [str(g.source) for g in state.stamped]
['m.eps']
>>> m.eps = 1e-6
>>> stamps_match(state.slot[0]), check(m)
(False, False)
"""

from __future__ import annotations

import builtins
import operator
import sys
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ember.guards import _accel, _torch
from ember.guards.frame import FrameSpec
from ember.guards.kinds import Guard, GuardKind, WeakIdentity
from ember.guards.sources import (
    BUFFERS,
    MODULES,
    PARAMETERS,
    Attr,
    Cell,
    Computed,
    Default,
    DictItem,
    GenericAttr,
    Item,
    Local,
    ModuleChild,
    ModuleGlobal,
    Source,
    TypeOf,
    class_attribute,
    has_generic_attribute,
)

__all__ = ["StampState", "Unstampable", "candidates", "stamps_match"]

# the facts (the op codes of _stamps.c)
ROOT, DICT, OWNDICT, TYPE, TYPEVER, FUNC, DICTKEY, CELL = range(8)
#: function fields a FUNC fact reads, by their index in _stamps.c
FUNC_FIELDS = {"__code__": 0, "__defaults__": 1, "__kwdefaults__": 2, "__closure__": 3}

_native: Any = _accel._NATIVE
#: ``stamps_match(program)``: every fact holds (None, the program of no state: False).
stamps_match: Callable[[object], bool] = (
    _native.stamps_match if _native is not None else (lambda program: False)
)
_MISSING = object()
_GENERIC = (object.__getattribute__, types.ModuleType.__getattribute__)
_IMMUTABLE = (int, float, complex, bool, str, bytes, type(None), torch.dtype, torch.device)


class Unstampable(Exception):
    """The walk cannot prove a step unchanged by dict versions and class tags."""


def _lookup(cls: type, name: str) -> Any:
    """What the class's MRO holds for ``name`` (``_PyType_Lookup``), or ``_MISSING``."""
    for klass in cls.__mro__:
        found = klass.__dict__.get(name, _MISSING)
        if found is not _MISSING:
            return found
    return _MISSING


def _is_data_descriptor(obj: object) -> bool:
    kind = type(obj)
    return hasattr(kind, "__set__") or hasattr(kind, "__delete__")


def _immutable(value: object) -> bool:
    if isinstance(value, tuple | frozenset):
        return type(value) in (tuple, frozenset) and all(map(_immutable, value))
    return type(value) in _IMMUTABLE


class _Walk:
    """One recording: the values the guards read, and the facts that keep them so."""

    def __init__(
        self,
        frame: FrameSpec,
        args: dict[str, object],
        pins: dict[str, weakref.ref[Any]],
        volatile: set[int],
    ) -> None:
        self.frame, self.args, self.pins, self.volatile = frame, args, pins, volatile
        self.facts: dict[tuple[int, int, int | None, int], None] = {}
        self.keep: list[object] = []
        self.values: dict[Source, object] = {}

    def fact(self, op: int, a: object, b: object = None, tag: int = 0) -> None:
        self.facts.setdefault((op, id(a), None if b is None else id(b), tag), None)

    def dict_(self, d: object) -> None:
        """All of ``d`` stays as it is (its version)."""
        if not isinstance(d, dict) or id(d) in self.volatile:
            raise Unstampable("not a dict, or one that changes every call")
        self.fact(DICT, d, None, _native.dict_version(d))

    def read(self, d: dict[Any, Any], key: object, default: object = KeyError) -> object:
        """``d[key]`` (``default`` when missing, if given), and the fact that keeps it: the
        dict's version, or for a dict that changes every call, the key's own value."""
        if id(d) not in self.volatile:
            self.dict_(d)
            return d[key] if default is KeyError else dict.get(d, key, default)
        found = dict.get(d, key, _MISSING)
        if found is _MISSING and default is KeyError:
            raise Unstampable(f"no {key!r}")
        if found is not _MISSING and not _immutable(found):
            raise Unstampable(f"{key!r} of a dict that changes every call is not a constant")
        self.keep.extend((key, found))
        self.facts.setdefault((DICTKEY, id(d), id(key), 0 if found is _MISSING else id(found)))
        return default if found is _MISSING else found

    def typed(self, obj: object, versioned: bool = True) -> type:
        """``type(obj)``, and (``versioned``) that class's attributes as they are: the class's
        tag is one fact however many objects share the class (a hundred ``Linear``s)."""
        cls = type(obj)
        self.fact(TYPE, obj, cls)
        if versioned:
            self.class_version(cls)
        return cls

    def class_version(self, cls: object) -> None:
        if not isinstance(cls, type) or not (tag := _native.type_version(cls)):
            raise Unstampable("not a class with a version tag")
        self.fact(TYPEVER, cls, None, tag)

    def value(self, source: Source) -> object:
        found = self.values.get(source, _MISSING)
        if found is _MISSING:
            step = STEPS.get(type(source))
            if step is None:
                raise Unstampable(f"{type(source).__name__} sources are read every call")
            found = self.values[source] = step(self, source)
        return found

    def guard(self, guard: Guard) -> None:
        """Record the facts ``guard`` needs, or raise :class:`Unstampable`, leaving none."""
        facts, keep, values = len(self.facts), len(self.keep), len(self.values)
        try:
            LEAVES[guard.kind](self, self.value(guard.source))
        except Exception:  # Unstampable, or a value that is not there any more
            for fact in list(self.facts)[facts:]:
                del self.facts[fact]
            for source in list(self.values)[values:]:
                del self.values[source]
            del self.keep[keep:]
            raise

    def program(self) -> object:
        return _native.stamps_pack(tuple(self.facts), tuple(self.keep))


# --- the steps: how a source's value is reached, and what keeps it -------------------


def _local(w: _Walk, src: Local) -> object:
    ref = w.pins.get(src.name)
    obj = w.args.get(src.name, _MISSING)
    if ref is None or ref() is not obj:
        raise Unstampable(f"argument {src.name} is not pinned to one object")
    w.keep.append(ref)
    w.fact(ROOT, ref, obj)
    return obj


def _cell(w: _Walk, src: Cell) -> object:
    # The check holds the cell already; holding its contents too keeps no more alive than
    # the cell does, as long as they are what the cell holds (a restamp lets go of old ones).
    cell = w.frame.cells[src.name]
    value = cell.cell_contents
    w.keep.extend((cell, value))
    w.fact(CELL, cell, value)
    return value


def _module_global(w: _Walk, src: ModuleGlobal) -> object:
    namespace = sys.modules[src.module].__dict__
    w.keep.extend((sys.modules, namespace, builtins.__dict__))
    w.read(sys.modules, src.module)
    found = w.read(namespace, src.name, _MISSING)
    return w.read(builtins.__dict__, src.name) if found is _MISSING else found


def _class_attr(w: _Walk, cls: type, name: str) -> object:
    """``cls.name`` through ``type.__getattribute__``: a plain value or function only."""
    meta = w.typed(cls)
    if _lookup(meta, "__getattribute__") is not type.__getattribute__:
        raise Unstampable(f"{meta.__name__} has its own __getattribute__")
    if _is_data_descriptor(_lookup(meta, name)):
        raise Unstampable(f"{meta.__name__}.{name} is computed")
    w.class_version(cls)
    found = _lookup(cls, name)
    if isinstance(found, staticmethod):
        return found.__func__
    if found is _MISSING or (
        hasattr(type(found), "__get__") and not isinstance(found, types.FunctionType | property)
    ):
        raise Unstampable(f"{cls.__name__}.{name} is missing or bound on reading")
    return found


def _own_dict(w: _Walk, obj: object) -> dict[str, Any] | None:
    found = _native.instance_dict(obj)
    if found is None:
        if type(obj).__dictoffset__:
            raise Unstampable(f"a {type(obj).__name__} without its dict yet")
        return None
    w.fact(OWNDICT, obj, found)
    return found  # type: ignore[no-any-return]


def _attr(w: _Walk, src: Attr) -> object:
    obj = w.value(src.base)
    if isinstance(obj, type):
        return _class_attr(w, obj, src.name)
    if _lookup(type(obj), "__getattribute__") not in _GENERIC:
        raise Unstampable(f"{type(obj).__name__} has its own __getattribute__")
    return _generic(w, obj, src.name)


def _generic_attr(w: _Walk, src: GenericAttr) -> object:
    obj = w.value(src.base)
    if isinstance(obj, type):
        raise Unstampable("object.__getattribute__ of a class")
    return _generic(w, obj, src.name)


def _generic(w: _Walk, obj: object, name: str, default: object = Unstampable) -> object:
    """``object.__getattribute__(obj, name)`` (``default`` when it finds nothing, if given):
    a data descriptor of the class, else the instance's dict, else the class's value."""
    if name == "__dict__":
        if (own := _own_dict(w, obj)) is None or getattr(obj, "__dict__", None) is not own:
            raise Unstampable("__dict__ is not the instance dict")
        return own  # what is read from it says what keeps it
    cls = w.typed(obj)
    found = _lookup(cls, name)
    if name in FUNC_FIELDS and isinstance(obj, types.FunctionType):
        value = getattr(obj, name)
        w.keep.append(value)
        w.fact(FUNC, obj, value, FUNC_FIELDS[name])
        return value
    if name == "__class__" and found is object.__dict__["__class__"]:
        return cls
    if found is not _MISSING and _is_data_descriptor(found):
        raise Unstampable(f"{cls.__name__}.{name} is computed")
    own = _own_dict(w, obj)
    value = _MISSING if own is None else w.read(own, name, _MISSING)
    if value is not _MISSING:
        return value
    if found is _MISSING and default is not Unstampable:
        return default
    if found is _MISSING or hasattr(type(found), "__get__"):
        raise Unstampable(f"{cls.__name__}.{name} is missing or bound on reading")
    return found


def _item(w: _Walk, src: Item) -> object:
    obj = w.value(src.base)
    if type(obj) is dict:
        return w.read(obj, src.key)
    if type(obj) is not tuple:
        raise Unstampable(f"items of a {type(obj).__name__}")
    return obj[src.key]  # type: ignore[index]


def _dict_item(w: _Walk, src: DictItem) -> object:
    obj = w.value(src.base)
    if not isinstance(obj, dict):
        raise Unstampable("not a dict")
    return w.read(obj, src.key)


def _module_child(w: _Walk, src: ModuleChild) -> object:
    return w.value(Item(Attr(src.base, src.slot), src.name))


def _default(w: _Walk, src: Default) -> object:
    field = "__defaults__" if isinstance(src.key, int) else "__kwdefaults__"
    return w.value(Item(Attr(src.base, field), src.key))


def _type_of(w: _Walk, src: TypeOf) -> object:
    return w.typed(w.value(src.base), versioned=False)


def _computed(w: _Walk, src: Computed) -> object:
    rule = COMPUTED.get(src.fn)
    if rule is None:
        raise Unstampable(f"{getattr(src.fn, '__name__', src.fn)}() is computed every call")
    args = [w.value(a) if isinstance(a, Source) else a for a in src.args]
    return rule(w, args)


def _contains(w: _Walk, args: list[Any]) -> object:
    container, key = args
    if type(container) is not dict or not _immutable(key):
        raise Unstampable("'in' over something other than a dict")
    return w.read(container, key, _MISSING) is not _MISSING


def _on_class(w: _Walk, args: list[Any]) -> object:
    cls, name = args
    if not isinstance(cls, type):
        raise Unstampable("a class attribute of something other than a class")
    w.keep.append(cls)  # a constant of the guard: alive as long as the program is
    return _class_attr(w, cls, name)


def _has_generic(w: _Walk, args: list[Any]) -> object:
    obj, name = args
    if isinstance(obj, type) or not isinstance(name, str):
        raise Unstampable("has_generic_attribute of a class")
    return _generic(w, obj, name, _MISSING) is not _MISSING


def _hasattr(w: _Walk, args: list[Any]) -> object:
    """``hasattr(obj, name)``: the generic lookup, then a module's ``__getattr__``, which
    looks in its parameters, buffers and submodules (any other ``__getattr__`` runs code)."""
    obj, name = args
    if isinstance(obj, type) or not isinstance(name, str):
        raise Unstampable("hasattr of a class")
    if _lookup(type(obj), "__getattribute__") not in _GENERIC:
        raise Unstampable(f"{type(obj).__name__} has its own __getattribute__")
    if _generic(w, obj, name, _MISSING) is not _MISSING:
        return True
    fallback = _lookup(type(obj), "__getattr__")
    if fallback is _MISSING:
        return False
    if fallback is not torch.nn.Module.__getattr__:
        raise Unstampable(f"{type(obj).__name__}.__getattr__ runs code")
    own = _own_dict(w, obj)
    if own is None:
        raise Unstampable("a module without its dict")
    for slot in (PARAMETERS, BUFFERS, MODULES):
        table = w.read(own, slot)
        if type(table) is not dict:
            raise Unstampable(f"{slot} is not a dict")
        if w.read(table, name, _MISSING) is not _MISSING:
            return True
    return False


def _class_attribute(w: _Walk, args: list[Any]) -> object:
    cls, name = args
    w.keep.append(cls)
    w.class_version(cls)
    return class_attribute(cls, name)


#: Source class -> how the walk reaches its value (the others are read every call).
STEPS: dict[type[Source], Callable[[Any, Any], object]] = {
    Local: _local,
    Cell: _cell,
    ModuleGlobal: _module_global,
    Attr: _attr,
    GenericAttr: _generic_attr,
    Item: _item,
    DictItem: _dict_item,
    ModuleChild: _module_child,
    Default: _default,
    TypeOf: _type_of,
    Computed: _computed,
}

#: Pure computations a Computed source may stand for, and the facts that keep each.
COMPUTED: dict[Callable[..., Any], Callable[[_Walk, list[Any]], object]] = {
    operator.contains: _contains,
    getattr: _on_class,
    class_attribute: _class_attribute,
    has_generic_attribute: _has_generic,
    hasattr: _hasattr,
}


def _leaf_equals(w: _Walk, value: object) -> None:
    if not _immutable(value):
        raise Unstampable(f"a {type(value).__name__} can change in place")


def _leaf_type(w: _Walk, value: object) -> None:
    w.typed(value, versioned=False)


def _leaf_length(w: _Walk, value: object) -> None:
    if type(value) is dict:
        w.dict_(value)
    elif type(value) not in (tuple, str, bytes, frozenset):
        raise Unstampable(f"the length of a {type(value).__name__} can change")


def _leaf_keys(w: _Walk, value: object) -> None:
    if type(value) is not dict:
        raise Unstampable(f"the keys of a {type(value).__name__}")
    w.dict_(value)


def _leaf_module(w: _Walk, value: object) -> None:
    """A module's training flag and hook dicts (what ``module_match`` reads)."""
    own = _own_dict(w, value)
    if own is None or not isinstance(w.read(own, "training"), bool):
        raise Unstampable("a module without its training flag")
    for name in _torch.MODULE_HOOK_DICTS:
        hooks = w.read(own, name)
        # An OrderedDict's move_to_end reorders without a new version: only an empty one
        # (nothing to move) is as fixed by its version as a dict
        if not (type(hooks) is dict or (type(hooks) is OrderedDict and not hooks)):
            raise Unstampable(f"{name} is not a dict")
        w.dict_(hooks)


#: Guard kind -> the facts its answer needs beyond its value being the same object.
LEAVES: dict[GuardKind, Callable[[_Walk, object], None]] = {
    GuardKind.EQUALS: _leaf_equals,
    GuardKind.TYPE_MATCH: _leaf_type,
    GuardKind.ID_MATCH: lambda w, value: None,
    GuardKind.IS_NONE: lambda w, value: None,
    GuardKind.NOT_NONE: lambda w, value: None,
    GuardKind.LENGTH: _leaf_length,
    GuardKind.DICT_KEYS: _leaf_keys,
    GuardKind.MODULE_STATE: _leaf_module,
}


def candidates(guards: Sequence[Guard]) -> int:
    """How many of ``guards`` a stamp program might cover (by kind and source alone).

    >>> from ember.guards import Local, equals
    >>> from ember.guards.sources import Attr
    >>> candidates([equals(Local("k"), 1), equals(Attr(Local("m"), "eps"), 0.1)])
    1
    """
    return sum(g.kind in LEAVES and not isinstance(g.source, Local) for g in guards)


class StampState:
    """The stamp program of one compiled check, and the check of the guards it leaves.

    ``slot`` is ``[program, rest]``: the generated check runs ``rest(*args)`` when
    ``stamps_match(program)``, else every guard and then :meth:`restamp`. The first full
    pass records nothing (a check that runs once needs no program). A restamp
    splits the guards into ``stamped`` (covered) and the rest, builds the rest's check
    when that split changed, and records the program. A dict whose version broke the last
    program (one the code writes every call, like a context variable's holder) is read key
    by key from then on. Stamps turn off for good when the facts keep failing.
    """

    #: fewer covered guards than this are not worth a second check function
    MINIMUM = 16

    def __init__(
        self,
        guards: Sequence[Guard],
        frame: FrameSpec,
        resolved: dict[str, bool],
        minimum: int | None = None,
        build: Callable[..., Any] | None = None,
    ) -> None:
        self.guards, self.frame, self.resolved = tuple(guards), frame, resolved
        self.minimum = self.MINIMUM if minimum is None else minimum
        self.build = build
        self.slot: list[Any] = [None, None]
        self.stamped: tuple[Guard, ...] = ()
        self.facts: tuple[tuple[int, int, int | None, int], ...] = ()
        self.volatile: set[int] = set()  # ids of dicts read key by key
        self.restamps = self.hits = self.passes = 0
        self.recording = False
        #: the check this state belongs to (set by ``build_check``), rerun after each walk
        self.check: Callable[..., bool] | None = None
        self.off = _native is None or _native.stamps_pack((), ()) is None
        self.pins = {
            g.source.name: g.expected.ref
            for g in self.guards
            if g.kind is GuardKind.ID_MATCH
            and isinstance(g.source, Local)
            and isinstance(g.expected, WeakIdentity)
        }

    def restamp(self, *args: object) -> None:
        """After the full check passed on ``args``: record the program again."""
        if self.off or self.recording:
            return
        if not self.passes:  # a check that passes once may never run again: no walk yet
            self.passes = 1
            return
        self.recording = True
        try:
            self._restamp(args)
        except Exception:  # never fail a check that passed: run the full check from now on
            self._stop()
        finally:
            self.recording = False

    def _restamp(self, frame_args: tuple[object, ...]) -> None:
        args = dict(zip(self.frame.arg_names, frame_args, strict=True))
        program = self.slot[0]
        if program is not None:
            self.hits += _native.stamps_hits(program)
            failed = _native.stamps_failure(program)
            if failed >= 0 and self.facts[failed][0] == DICT:  # read it key by key from now
                self.volatile.add(self.facts[failed][1])
        self.restamps += 1
        if self.restamps > 4 and self.hits < 8 * self.restamps:
            return self._stop()
        walk = _Walk(self.frame, args, self.pins, self.volatile)
        covered = []
        for guard in self.guards:
            if guard.kind in LEAVES and not isinstance(guard.source, Local):
                try:
                    walk.guard(guard)
                except Exception:  # Unstampable, or a value read some other way
                    continue
                covered.append(guard)
        if len(covered) < self.minimum:
            return self._stop()
        if [id(g) for g in covered] != [id(g) for g in self.stamped]:
            ids = {id(g) for g in covered}
            self.slot[0] = None  # a thread checking now runs the full check meanwhile
            self.slot[1] = self._build_rest([g for g in self.guards if id(g) not in ids])
            self.stamped = tuple(covered)
        # The walk read the values as they are now, which need not be as the check saw them
        # (another thread may have set one since). So the full check runs once more, and
        # the program is kept only if it still holds after: its facts then show that
        # nothing it covers changed from the walk to the end of that check.
        program = walk.program()
        self.slot[0] = None  # the check below runs in full
        if self.check is None or not self.check(*frame_args) or not stamps_match(program):
            return
        self.facts = tuple(walk.facts)
        self.slot[0] = program

    def _build_rest(self, rest: list[Guard]) -> Callable[..., bool]:
        if self.build is None:
            from ember.guards.codegen import build_check

            self.build = build_check
        return self.build(rest, self.frame, self.resolved)[1]

    def _stop(self) -> None:
        self.off, self.slot[0] = True, None
