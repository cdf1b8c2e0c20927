"""The translator's side of ``ember.guards``: the sources it builds and the guards it records.

Everything capture knows about guards goes through this module: how a value
read from the frame is named (:func:`local`, :func:`attr`, :func:`item`, ...),
which guard its use implies (:class:`GuardCollector`), and how a source is
reached again by the generated replacement (:func:`source_expression`).
"""

from __future__ import annotations

import operator
import sys
import types
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ember.guards import kinds, sources
from ember.guards.sources import (
    BUFFERS,
    MODULES,
    PARAMETERS,
    Attr,
    Cell,
    Default,
    DictItem,
    Global,
    Item,
    Local,
    ModuleChild,
    Source,
    TensorAttr,
    TypeOf,
    class_attribute,
)


def is_module_tensor(source: Source) -> bool:
    """Whether ``source`` reaches a module's parameter or buffer (static unless marked)."""
    return isinstance(source, ModuleChild) and source.slot in (PARAMETERS, BUFFERS)


class SizeSources:
    """How a shape relation reads a tensor's size, stride and storage offset."""

    @staticmethod
    def size(base: Source, dim: int) -> Source:
        return sources.TensorSize(base, dim)

    @staticmethod
    def stride(base: Source, dim: int) -> Source:
        return sources.TensorStride(base, dim)

    @staticmethod
    def offset(base: Source) -> Source:
        return sources.Computed(torch.Tensor.storage_offset, (base,))


def local(name: str) -> Source:
    return Local(name)


def global_(name: str) -> Source:
    return Global(name)


def cell(name: str) -> Source:
    return Cell(name)


def attr(base: Source, name: str) -> Source:
    return Attr(base, name)


def module_child(base: Source, name: str, table: str) -> Source:
    """A parameter, buffer or submodule, read from the module's own dict (fast, no __getattr__)."""
    for slot in (PARAMETERS, BUFFERS, MODULES):
        if slot == table:
            return ModuleChild(base, name, slot)
    raise ValueError(f"{table!r} is not a module table")


def generic_attr(base: Source, name: str) -> Source:
    """``object.__getattribute__(base, name)``, as a class's own ``__getattribute__`` reads
    past itself (the check reads it so too, without running the override)."""
    return sources.GenericAttr(base, name)


def item(base: Source, key: Any) -> Source | None:
    """``base[key]``; None when the key is not an int or str (the value is then unguardable)."""
    if type(key) not in (int, str):
        return None
    return Item(base, key)


def dict_item(base: Source, key: Any) -> Source | None:
    """An item of the dict subclass instance at ``base``, read as ``dict.__getitem__`` reads
    it (the subclass's ``__getitem__`` is traced where the program calls it, never run by the
    guards or the graph's inputs); None for a key that is not an int or str."""
    if type(key) not in (int, str):
        return None
    return DictItem(base, key)


def closure_cell(function: Source, index: int) -> Source:
    """The contents of cell ``index`` of the function at ``function``."""
    return Attr(Item(Attr(function, "__closure__"), index), "cell_contents")


def module_global(namespace: dict[str, Any], name: str) -> Source | None:
    """A global of another module, read through ``sys.modules`` (None when ``namespace`` is
    not a loaded module's dict, as for code run by ``exec``: then it is unguardable)."""
    module = namespace.get("__name__")
    loaded = sys.modules.get(module) if isinstance(module, str) else None
    if loaded is None or getattr(loaded, "__dict__", None) is not namespace:
        return None
    return sources.ModuleGlobal(module, name)  # type: ignore[arg-type]


def computed(fn: Callable[..., Any], args: tuple[Any, ...]) -> Source:
    """``fn(*args)`` over sources and constants (a condition on the frame's numbers)."""
    return sources.Computed(fn, args)


def _data_descriptor(obj: Any) -> bool:
    return hasattr(type(obj), "__set__") or hasattr(type(obj), "__delete__")


def source_key(source: Source) -> str:
    """A key equal for two sources exactly when they reach the value the same way."""
    return repr(source)


def source_name(source: Source) -> str:
    """The human name: ``x``, ``self.layers[0].weight``, ``G['w']``."""
    return str(source)


# -- expressions reaching a source inside generated code ---------------------------------------

_EXPRESSIONS: dict[type, Callable[[Any, Callable[[Any], str], str], str]] = {
    Local: lambda s, sub, g: sub(("local", s.name)),
    Global: lambda s, sub, g: f"{g}[{s.name!r}]",
    Cell: lambda s, sub, g: s.name,
    Attr: lambda s, sub, g: f"{sub(s.base)}.{s.name}",
    sources.GenericAttr: lambda s, sub, g: (
        f"{g[:-1]}B.object.__getattribute__({sub(s.base)}, {s.name!r})"
    ),
    Item: lambda s, sub, g: f"{sub(s.base)}[{s.key!r}]",
    DictItem: lambda s, sub, g: f"{g[:-1]}B.dict.__getitem__({sub(s.base)}, {s.key!r})",
    ModuleChild: lambda s, sub, g: f"{sub(s.base)}.__dict__[{s.slot!r}][{s.name!r}]",
    Default: lambda s, sub, g: (
        f"{sub(s.base)}.__defaults__[{s.key}]"
        if isinstance(s.key, int)
        else f"{sub(s.base)}.__kwdefaults__[{s.key!r}]"
    ),
    TensorAttr: lambda s, sub, g: f"{sub(s.base)}.{s.name}",
    TypeOf: lambda s, sub, g: f"type({sub(s.base)})",
    sources.Computed: lambda s, sub, g: _computed_expression(s, sub, g),
    # generated code names builtins like its globals, with a B for the G (codegen's helpers)
    sources.ModuleGlobal: lambda s, sub, g: (
        f"{g[:-1]}B.__import__('ember.guards').guards.read_module_global({s.module!r}, {s.name!r})"
    ),
}


# Functions a Computed source may apply in generated code, as that code names them.
_COMPUTED_NAMES = {
    dict.__getitem__: "dict.__getitem__",
    weakref.ref.__call__: "__import__('weakref').ref.__call__",
}


def _computed_expression(s: Any, sub: Callable[[Any], str], g: str) -> str:
    name = _COMPUTED_NAMES.get(s.fn)
    if name is None:
        raise TypeError(f"no expression for source {s!r}")
    args = [sub(a) if isinstance(a, Source) else repr(a) for a in s.args]
    return f"{g[:-1]}B.{name}({', '.join(args)})"  # builtins, as the G's B


def source_expression(
    source: Source,
    *,
    globals_name: str,
    local: Callable[[str], str] = lambda name: name,
    named: Mapping[Source, str] | None = None,
) -> str:
    """Python code reaching ``source`` in a function with the frame's arguments and cells;
    a source in ``named`` (itself or one it is reached through) is read from that name.

    >>> w = ModuleChild(Local("self"), "w", PARAMETERS)
    >>> source_expression(w, globals_name="G")
    "self.__dict__['_parameters']['w']"
    >>> source_expression(Attr(w, "T"), globals_name="G", named={w: "t0"})
    't0.T'
    """

    def sub(s: Any) -> str:
        if named and not isinstance(s, tuple) and s in named:
            return named[s]
        if isinstance(s, tuple):  # ("local", name): the name of an argument in the code
            return local(s[1])
        rule = _EXPRESSIONS.get(type(s))
        if rule is None:
            raise TypeError(f"no expression for source {s!r}")
        return rule(s, sub, globals_name)

    return sub(source)


def _plain_tensor(value: Any) -> bool:
    """A tensor whose storage the aliasing guard can read (not a fake or meta one)."""
    return isinstance(value, torch.Tensor) and value.device.type != "meta"


# -- recording guards --------------------------------------------------------------------------


class GuardCollector:
    """The guards one translation relies on, each with the user location that needed it."""

    def __init__(self) -> None:
        self.guards: list[kinds.Guard] = []
        self.where: tuple[str, int | None] | None = None  # set by the interpreter per instruction

    def _add(self, guard: kinds.Guard) -> None:
        self.guards.append(guard)

    def _where(self) -> str | None:
        return None if self.where is None else f"{self.where[0]}:{self.where[1]}"

    def tensor(
        self,
        source: Source,
        t: torch.Tensor,
        symbolic: tuple[frozenset[int], ...] = (frozenset(), frozenset(), frozenset()),
    ) -> None:
        """``source`` holds a tensor like ``t``; the ``symbolic`` (sizes, strides) are left
        to shape relations (:meth:`shape_relation`), and the unbacked sizes (the third) do
        not specialise at 0 and 1."""
        sizes, strides, unbacked = symbolic
        if not sizes and not strides:
            self._add(kinds.tensor_match(source, t, self._where()))
            return
        self._add(
            kinds.tensor_match(
                source, t, self._where(),
                dynamic_sizes=sizes, dynamic_strides=strides, unbacked_sizes=unbacked,
            )
        )  # fmt: skip

    def shape_relation(self, expr: str, symbols: dict[str, Source], where: str | None) -> None:
        """``expr`` (Python, over ``symbols``' names) holds for the frame's sizes; ``where``
        is the user line whose branch set it (None: the frame's end)."""
        self._add(kinds.shape_relation(expr, symbols, where or self._where()))

    def same_tensor(self, first: Source, second: Source) -> None:
        self._add(kinds.same_tensor(first, second, self._where()))

    def storage_aliasing(self, sources: Sequence[Any], values: Sequence[Any]) -> None:
        """The graph's tensor inputs still share storage exactly as now (none, often): a graph
        traced for distinct inputs mutates one and reads another as if they were apart."""
        with torch._C.DisableTorchFunctionSubclass():  # a subclass's handler sees nothing
            pairs = [(s, v) for s, v in zip(sources, values, strict=True) if _plain_tensor(v)]
            if len(pairs) >= 2:
                srcs, tensors = zip(*pairs, strict=True)
                self._add(kinds.storage_aliasing(srcs, tensors, self._where()))

    def equals(self, source: Source, value: Any) -> None:
        try:
            self._add(kinds.equals(source, value, self._where()))
        except TypeError:
            # Not a scalar EQUALS understands (an enum member, a range): the very same object.
            self._add(kinds.type_match(source, value, self._where()))
            self._add(kinds.id_match(source, value, self._where()))

    def identity(self, source: Source, obj: Any) -> None:
        self._add(kinds.id_match(source, obj, self._where()))

    def type_of(self, source: Source, obj: Any) -> None:
        """``source`` holds an object of exactly ``type(obj)``."""
        self._add(kinds.type_match(source, obj, self._where()))

    def length(self, source: Source, seq: Any) -> None:
        self._add(kinds.length(source, seq, self._where()))

    def dict_keys(self, source: Source, d: dict[Any, Any]) -> None:
        self._add(kinds.dict_keys(source, d, self._where()))

    def builtin(self, source: Source | None, obj: Any) -> None:
        """A builtin was used: the name still resolves to it (no global shadows it)."""
        if source is not None:
            self._add(kinds.id_match(source, obj, self._where()))

    def class_member(self, source: Source, obj: Any, name: str, found: Any) -> None:
        """``obj.name`` (``obj`` at ``source``, whose type its own guard fixes) still finds
        ``found``, a method or other descriptor of its class: nothing of that name set on the
        instance since (``m.forward = ...``), the class attribute the same object, and a user
        function's the same code. The class's part is one check per class, however many
        instances share it; all are C calls and attribute loads, cheap on the hot path.

        >>> class C:
        ...     def f(self): ...
        >>> guards = GuardCollector(); guards.class_member(Local("c"), C(), "f", C.f)
        >>> [(g.kind.name, str(g.source).replace(repr(C), "C")) for g in guards.guards]
        [('EQUALS', "contains(c.__dict__, 'f')"), ('ID_MATCH', "getattr(C, 'f')"), \
('ID_MATCH', "getattr(C, 'f').__code__")]
        """
        if isinstance(getattr(obj, "__dict__", None), dict) and not _data_descriptor(found):
            self.equals(computed(operator.contains, (Attr(source, "__dict__"), name)), False)
        plain = isinstance(found, types.FunctionType | property)  # getattr would bind the rest
        on_class = computed(getattr if plain else class_attribute, (type(obj), name))
        self.identity(on_class, found)
        if isinstance(found, types.FunctionType):
            self.identity(Attr(on_class, "__code__"), found.__code__)

    def module_hooks(self, source: Source, module: torch.nn.Module) -> None:
        self._add(kinds.module_state(source, module, self._where()))

    def global_state(self) -> None:
        self.guards.extend(kinds.global_state())

    def backend(self, name: str) -> None:
        self._add(kinds.backend(name))


__all__ = [
    "GuardCollector",
    "attr",
    "cell",
    "class_attribute",
    "closure_cell",
    "computed",
    "dict_item",
    "global_",
    "item",
    "local",
    "module_child",
    "module_global",
    "source_expression",
    "source_key",
    "source_name",
    "sources",
]
