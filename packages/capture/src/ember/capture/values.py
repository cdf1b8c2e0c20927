"""The symbolic values the translator keeps on its stack and in its locals.

Every value is a small frozen dataclass. What a value *is* (a tensor in the
graph, a Python constant, a user function to inline, a module, ...) is its
class; what may be done with it lives in rule tables elsewhere
(``call_rules.py``, the opcode handlers), not in methods here.

Mutable Python containers built or read during tracing (lists, dicts,
iterators, cells) are not stored inside values: a value holds a reference
(``ref``) into the translation's :class:`Heap`, so two names bound to the same
list see the same mutations, as in Python.

A value read from the frame carries the *source* that reaches it
(``ember.guards`` sources), which is how guards and graph inputs name it.

>>> import torch
>>> c = Const(3)
>>> c.value, c.source is None
(3, True)
>>> heap = Heap()
>>> lst = ListV(heap.new([c, Const("a")]))
>>> [v.value for v in heap.get(lst.ref)]
[3, 'a']
"""

from __future__ import annotations

import collections
import types
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

__all__ = [
    "NULL",
    "BoundV",
    "CellV",
    "Const",
    "DictV",
    "ExcV",
    "FuncV",
    "GenV",
    "GradExitV",
    "GradModeV",
    "Heap",
    "InstanceV",
    "IterV",
    "Lazy",
    "ListV",
    "MethodV",
    "ModeExitV",
    "ModeV",
    "ModuleV",
    "Null",
    "ObjV",
    "PartialV",
    "SetV",
    "SuperV",
    "SymV",
    "TensorV",
    "TupleV",
    "Value",
    "ViewV",
    "is_namedtuple_class",
    "is_plain_class",
    "is_structseq_class",
    "tuple_fields",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Value:
    """Base of every symbolic value. ``source`` says how the frame reaches it, if it does."""

    source: Any = None  # an ember.guards source, or None for values made while tracing


@dataclass(frozen=True, slots=True, kw_only=True)
class Null(Value):
    """The NULL that 3.11 pushes below a callable (``PUSH_NULL``, ``LOAD_GLOBAL`` with bit 0)."""


NULL = Null()


@dataclass(frozen=True, slots=True)
class Const(Value):
    """A Python value known while tracing: numbers, strings, None, dtypes, sizes, classes, ...

    Constants read from the frame are guarded (their value, or their identity)
    by whoever reads them; constants computed from other constants need no guard.
    """

    value: Any


@dataclass(frozen=True, slots=True)
class TensorV(Value):
    """A tensor in the graph: its FX node and a fake tensor with its metadata."""

    node: torch.fx.Node
    fake: torch.Tensor


@dataclass(frozen=True, slots=True)
class SymV(Value):
    """A Python number the graph takes as an input, or computes from such inputs.

    A float argument of the frame (``loss.item()`` passed on to a resume function,
    a learning rate) is not baked into the graph: it becomes a placeholder, so a new
    value reuses the same graph. ``example`` is its value at compile time. It is
    guarded by value only if something needs the number itself (a size, a library
    call), and a branch on it guards the condition (``loss > 0.0``), not the value.
    """

    node: torch.fx.Node
    example: Any  # int, float or bool


@dataclass(frozen=True, slots=True)
class SliceV(Value):
    """A slice with a symbolic size in it (``x[:n]`` for a symbolic ``n``): its parts stay
    values, so that indexing a tensor keeps the expression; elsewhere it specialises."""

    parts: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class TupleV(Value):
    """A tuple of values (immutable, so held inline); ``cls`` is a namedtuple's class."""

    items: tuple[Value, ...]
    cls: Any = None  # a namedtuple or struct sequence class, or None for a plain tuple
    # the tuple itself when read from the frame as an instance of a namedtuple subclass:
    # its class attributes and instance ``__dict__`` are looked up on it (through ``source``)
    real: Any = field(default=None, compare=False)


def is_namedtuple_class(cls: Any) -> bool:
    """A class made by ``collections.namedtuple`` or ``typing.NamedTuple`` (or a subclass
    keeping its ``__new__``): its instances are tuples ember can build and read.

    >>> import collections
    >>> is_namedtuple_class(collections.namedtuple("P", "a b")), is_namedtuple_class(tuple)
    (True, False)
    """
    return (
        isinstance(cls, type)
        and issubclass(cls, tuple)
        and isinstance(getattr(cls, "_fields", None), tuple)
        and (getattr(cls.__new__, "__doc__", None) or "").startswith("Create new instance of")
    )


def is_structseq_class(cls: Any) -> bool:
    """A C struct sequence whose every field is a tuple item: what torch ops with named
    results return (``torch.return_types.sort``), built as ``cls(items)``.

    >>> import torch
    >>> is_structseq_class(type(torch.sort(torch.ones(2)))), is_structseq_class(tuple)
    (True, False)
    """
    return (
        isinstance(cls, type)
        and issubclass(cls, tuple)
        and isinstance(getattr(cls, "n_sequence_fields", None), int)
        and getattr(cls, "n_fields", None) == cls.n_sequence_fields  # type: ignore[attr-defined]
    )


def tuple_fields(cls: Any) -> tuple[str, ...]:
    """The field names of a namedtuple or struct sequence class, in item order.

    >>> import torch
    >>> tuple_fields(type(torch.sort(torch.ones(2))))
    ('values', 'indices')
    """
    if is_structseq_class(cls):
        return tuple(cls.__match_args__)
    return tuple(cls._fields)


@dataclass(frozen=True, slots=True)
class ListV(Value):
    """A list; its items live in the heap under ``ref``."""

    ref: int


@dataclass(frozen=True, slots=True)
class SetV(Value):
    """A set of constants made while tracing; the heap holds the real Python ``set``
    (its elements are hashable constants, so iterating it is what the program sees)."""

    ref: int


@dataclass(frozen=True, slots=True)
class DictV(Value):
    """A dict with constant keys; its ``{key: Value}`` lives in the heap under ``ref``."""

    ref: int


@dataclass(frozen=True, slots=True)
class IterV(Value):
    """An iterator over a static sequence; the heap holds ``[remaining values]``."""

    ref: int


@dataclass(frozen=True, slots=True)
class ViewV(Value):
    """``d.keys()``, ``d.values()`` or ``d.items()``: a live view of the dict's items in the
    heap, so a change to the dict after the view was made shows through it, as in Python."""

    of: DictV
    kind: str  # "keys", "values" or "items"


@dataclass(frozen=True, slots=True)
class InstanceV(Value):
    """An instance of a plain user class made while tracing (``Point(2.0)``, a dataclass);
    the heap holds its ``{attribute: Value}``. Made for real only if it outlives the graph."""

    cls: type
    ref: int
    items: int | None = None  # a dict-derived class: the heap ref of its {key: Value} items


def is_plain_class(cls: Any) -> bool:
    """A class ember can instantiate while tracing: made by a class statement (any
    metaclass that keeps ``type.__call__``, ``ABCMeta`` included), with ``object``'s
    ``__new__`` (or ``dict``'s or ``OrderedDict``'s, whose items ember then keeps; a
    ``defaultdict`` subclass too),
    instances with a ``__dict__`` and no other builtin base. A ``__setattr__`` of its
    own is traced like any method.

    >>> class P:
    ...     def __init__(self, a):
    ...         self.a = a
    >>> is_plain_class(P), is_plain_class(dict), is_plain_class(Exception)
    (True, False, False)
    """
    klass: Any = cls
    return (
        isinstance(klass, type)
        and type(klass).__call__ is _TYPE_CALL
        and klass.__new__ in _PLAIN_NEW
        and bool(klass.__flags__ & _HEAPTYPE)
        and klass.__dictoffset__ != 0  # instances have a __dict__
        and all(c in _PLAIN_BASES or not c.__dict__.get("__slots__") for c in klass.__mro__)
        and all(c in _PLAIN_BASES or c.__flags__ & _HEAPTYPE for c in klass.__mro__)
    )


_TYPE_CALL: Any = type.__call__
_PLAIN_NEW: tuple[Any, ...] = (object.__new__, dict.__new__, collections.OrderedDict.__new__)
_PLAIN_BASES: tuple[type, ...] = (
    object, dict, collections.OrderedDict, collections.defaultdict,
)  # fmt: skip
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement, not a builtin


def is_frozen_dataclass(cls: Any) -> bool:
    """A ``@dataclass(frozen=True)``: its ``__setattr__`` refuses every store."""
    params = cls.__dict__.get("__dataclass_params__")
    return params is not None and bool(params.frozen)


@dataclass(frozen=True, slots=True)
class CellV(Value):
    """A closure cell; the heap holds its content (a Value) or ``EMPTY``."""

    ref: int


@dataclass(frozen=True, slots=True)
class FuncV(Value):
    """A user Python function, inlined when called.

    ``fn`` is the real function when the frame gave us one; functions made by
    ``MAKE_FUNCTION`` while tracing have ``fn=None`` and carry their parts.
    """

    code: types.CodeType
    globals: dict[str, Any]
    fn: Any = None  # the types.FunctionType, or None (Any: mypy would bind a FunctionType field)
    defaults: tuple[Value, ...] = ()
    kwdefaults: tuple[tuple[str, Value], ...] = ()
    closure: tuple[CellV, ...] = ()  # ordered like code.co_freevars
    closure_cells: tuple[Any, ...] | None = None  # real cells, for real functions


@dataclass(frozen=True, slots=True)
class ModuleV(Value):
    """An ``nn.Module`` instance; calling it inlines its ``forward``."""

    module: torch.nn.Module


@dataclass(frozen=True, slots=True)
class ObjV(Value):
    """Any other Python object: torch functions, builtins, Python modules, user objects.

    What can be done with it is decided by rule tables keyed by the object
    itself (``call_rules.CALL_RULES``) or by its type.
    """

    obj: Any


@dataclass(frozen=True, slots=True)
class BoundV(Value):
    """A function bound to a first argument: ``super().forward``, a classmethod, a
    real bound method. Calling it inlines ``func`` with ``self_value`` first."""

    func: Value
    self_value: Value


@dataclass(frozen=True, slots=True)
class SuperV(Value):
    """``super()`` inside a method: attribute lookups start after ``cls`` in the MRO."""

    cls: type
    self_value: Value


@dataclass(frozen=True, slots=True)
class PartialV(Value):
    """``functools.partial(func, *args, **kwargs)``; ``kwargs`` is its ``keywords`` dict (in the
    heap: mutating ``p.keywords`` changes what later calls pass, as in CPython)."""

    func: Value
    args: tuple[Value, ...]
    kwargs: DictV


@dataclass(frozen=True, slots=True)
class GradModeV(Value):
    """``torch.no_grad()``, ``torch.enable_grad()`` or ``torch.set_grad_enabled(b)``.

    ``applied``: the mode is already set (``set_grad_enabled`` sets it when called);
    ``previous`` is the mode to restore on exit.
    """

    enabled: bool
    previous: bool
    applied: bool


@dataclass(frozen=True, slots=True)
class GradExitV(Value):
    """The ``__exit__`` of a grad-mode block: restores ``previous``."""

    previous: bool


@dataclass(frozen=True, slots=True)
class ModeV(Value):
    """``torch.autocast(...)`` or ``torch.inference_mode(...)`` before its ``with``: entering
    it is ``enter(*args)``, a node of the graph that returns the token its exit takes."""

    enter: Any  # torch.amp.autocast_mode._enter_autocast, grad_mode._enter_inference_mode
    exit: Any
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class ModeExitV(Value):
    """The ``__exit__`` of an entered :class:`ModeV` block: ``exit(token)`` in the graph."""

    exit: Any
    token: torch.fx.Node


@dataclass(frozen=True, slots=True)
class ExcV(Value):
    """An exception made while tracing by calling ``cls(*args)``: raised and caught inside
    the trace, or rebuilt (``cls`` called again, so every run gets a fresh object) when it
    outlives the graph or is raised natively. ``cause`` is set by ``raise ... from cause``."""

    cls: Any
    args: tuple[Value, ...]
    cause: Value | None = None


@dataclass(frozen=True, slots=True)
class GenV(Value):
    """A generator made while tracing (a generator function called): the heap holds its
    suspended frame (``generators.GenState``); ``next``/``send``/``FOR_ITER`` resume it."""

    ref: int


@dataclass(frozen=True, slots=True)
class MethodV(Value):
    """``self_value.name`` looked up as a method, not yet called."""

    self_value: Value
    name: str


@dataclass(frozen=True, slots=True)
class Lazy(Value):
    """A real object from the frame, wrapped (and so guarded) only when first used.

    Locals and closure contents start lazy so that an argument the code never
    reads adds no guard and no graph input.
    """

    obj: Any


EMPTY = object()  # the content of a cell that has not been assigned


@dataclass(slots=True)
class Heap:
    """The mutable state of one translation: list items, dict items, iterators, cells.

    >>> heap = Heap()
    >>> ref = heap.new([])
    >>> heap.get(ref).append(Const(1)); len(heap.get(ref))
    1
    """

    cells: dict[int, Any] = field(default_factory=dict)
    # refs whose container came from the frame: mutating them is a side effect
    # that issue 4's full-graph path does not replay, so it is unsupported.
    from_frame: set[int] = field(default_factory=set)
    # refs holding the items of a real dict subclass instance (written back with its base
    # class's own methods, which the subclass may have overridden)
    subclassed: set[int] = field(default_factory=set)
    # refs of IterVs over a dict (``iter(d)``, ``iter(d.items())``): (the dict's ref, "keys",
    # "values" or "items", its keys when the iterator was made); each step reads the dict
    # as it is then, as CPython's dict iterators do
    dict_iters: dict[int, tuple[int, str, tuple[Any, ...]]] = field(default_factory=dict)

    def new(self, content: Any, *, from_frame: bool = False) -> int:
        ref = len(self.cells)
        self.cells[ref] = content
        if from_frame:
            self.from_frame.add(ref)
        return ref

    def get(self, ref: int) -> Any:
        return self.cells[ref]

    def set(self, ref: int, content: Any) -> None:
        self.cells[ref] = content
