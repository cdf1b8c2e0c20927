"""Sources: how a value is reached from a frame's arguments and globals.

A source is a small frozen dataclass. ``str(source)`` is the human name used
in messages (``x``, ``self.layers[0].weight``, ``G['config'].eps``), and
:data:`FETCHERS` maps each source class to the code that reaches the value
inside a compiled check. Names: bare names are the frame's arguments, ``G``
its globals (falling back to builtins, as ``LOAD_GLOBAL`` does), ``C`` its
closure cells.

>>> layer = ModuleChild(ModuleChild(Local("self"), "layers"), "0")
>>> weight = ModuleChild(layer, "weight", PARAMETERS)
>>> print(weight)
self.layers[0].weight
>>> print(Attr(Global("config"), "eps"), Item(Local("args"), 1), TypeOf(Local("x")))
G['config'].eps args[1] type(x)
>>> weight.root()
Local(name='self')
"""

from __future__ import annotations

import builtins
import keyword
import os  # noqa: F401  (doctests)
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, TypeVar

from ember.guards import _accel
from ember.guards.state import STATE_FIELDS, read_backend

__all__ = [
    "BUFFERS",
    "FETCHERS",
    "MODULES",
    "PARAMETERS",
    "TENSOR_ATTRS",
    "Attr",
    "Backend",
    "Cell",
    "Computed",
    "Default",
    "DictItem",
    "Emitter",
    "GenericAttr",
    "Global",
    "Item",
    "Local",
    "ModuleChild",
    "ModuleGlobal",
    "Source",
    "TensorAttr",
    "TensorSize",
    "TensorStride",
    "TorchState",
    "TypeOf",
    "class_attribute",
    "has_generic_attribute",
    "read_module_global",
]

MODULES: Final = "_modules"
PARAMETERS: Final = "_parameters"
BUFFERS: Final = "_buffers"
ModuleSlot = Literal["_modules", "_parameters", "_buffers"]

#: Tensor attributes a :class:`TensorAttr` may name: torch getters, no user code.
TENSOR_ATTRS: frozenset[str] = frozenset(
    {"grad", "shape", "dtype", "device", "layout", "requires_grad", "data", "_base", "ndim",
     "is_leaf", "grad_fn", "T", "mT", "H", "mH", "real", "imag", "names"}
)  # fmt: skip


class Emitter(Protocol):
    """What a fetcher may ask of the check compiler (see ``codegen.Emitter``)."""

    def value(self, source: Source) -> str:
        """A variable holding ``source``'s value, fetched once per check."""
        ...

    def bind(self, obj: object) -> str:
        """A name bound to ``obj`` in the compiled check."""
        ...

    def arg(self, name: str) -> str:
        """The parameter holding the frame argument ``name``."""
        ...

    def cell(self, name: str) -> str:
        """A name bound to the closure cell ``name``."""
        ...

    def global_(self, name: str) -> str:
        """An expression with ``LOAD_GLOBAL`` semantics for ``name``."""
        ...


class Source:
    """Base class of sources. Subclasses are frozen dataclasses with a ``base``
    field when they are reached from another source.

    >>> Attr(Local("x"), "y").base
    Local(name='x')
    """

    __slots__ = ()

    def root(self) -> Source:
        """The source this one is reached from: an argument, global, cell or state.

        >>> Item(Attr(Local("x"), "y"), 0).root()
        Local(name='x')
        """
        base: Source | None = getattr(self, "base", None)
        return self if base is None else base.root()

    def depth(self) -> int:
        """How many steps from the root; roots are 0.

        >>> Item(Attr(Local("x"), "y"), 0).depth()
        2
        """
        base: Source | None = getattr(self, "base", None)
        return 0 if base is None else 1 + base.depth()


@dataclass(frozen=True, slots=True)
class Local(Source):
    """A frame argument, by name (positional, keyword-only, ``*args`` or ``**kwargs``).

    >>> print(Local("x"))
    x
    """

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Global(Source):
    """A global name, falling back to builtins as ``LOAD_GLOBAL`` does.

    >>> print(Global("config"))
    G['config']
    """

    name: str

    def __str__(self) -> str:
        return f"G[{self.name!r}]"


@dataclass(frozen=True, slots=True)
class Cell(Source):
    """The contents of the frame function's closure cell ``name``.

    >>> print(Cell("scale"))
    C['scale']
    """

    name: str

    def __str__(self) -> str:
        return f"C[{self.name!r}]"


@dataclass(frozen=True, slots=True)
class Attr(Source):
    """``base.name`` through normal attribute lookup.

    >>> print(Attr(Local("self"), "eps"))
    self.eps
    """

    base: Source
    name: str

    def __str__(self) -> str:
        return f"{self.base}.{self.name}"


@dataclass(frozen=True, slots=True)
class GenericAttr(Source):
    """``object.__getattribute__(base, name)``: the instance's dict and its class's
    attributes, past a ``__getattribute__`` of the class's own. A class whose override calls
    up to object's (transformers' configs map a name, then do) is read here as its override
    read it, without running the override again on every check.

    >>> print(GenericAttr(Local("config"), "hidden_size"))
    object.__getattribute__(config, 'hidden_size')
    """

    base: Source
    name: str

    def __str__(self) -> str:
        return f"object.__getattribute__({self.base}, {self.name!r})"


def has_generic_attribute(obj: object, name: str) -> bool:
    """Whether ``object.__getattribute__(obj, name)`` finds something (``hasattr`` past the
    class's own ``__getattribute__`` and ``__getattr__``).

    >>> class C:
    ...     def __getattr__(self, name):
    ...         return 1
    >>> hasattr(C(), "x"), has_generic_attribute(C(), "x")
    (True, False)
    """
    try:
        object.__getattribute__(obj, name)
    except AttributeError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Item(Source):
    """``base[key]`` for an int or str key.

    >>> print(Item(Local("kwargs"), "mask"), Item(Local("args"), 0))
    kwargs['mask'] args[0]
    """

    base: Source
    key: int | str

    def __post_init__(self) -> None:
        if type(self.key) not in (int, str):
            raise TypeError(f"an item key must be an int or a str, not {type(self.key).__name__}")

    def __str__(self) -> str:
        return f"{self.base}[{self.key!r}]"


@dataclass(frozen=True, slots=True)
class DictItem(Source):
    """``dict.__getitem__(base, key)``: an item of a dict subclass instance, read past the
    subclass's own ``__getitem__`` (which may compute something else, or be traced code).

    >>> print(DictItem(Local("config"), "lr"))
    dict.__getitem__(config, 'lr')
    """

    base: Source
    key: int | str

    def __post_init__(self) -> None:
        if type(self.key) not in (int, str):
            raise TypeError(f"an item key must be an int or a str, not {type(self.key).__name__}")

    def __str__(self) -> str:
        return f"dict.__getitem__({self.base}, {self.key!r})"


@dataclass(frozen=True, slots=True)
class ModuleChild(Source):
    """A submodule, parameter or buffer of an ``nn.Module``, read from the dict
    where the module keeps it (``slot``) instead of through the slow
    ``nn.Module.__getattr__``.

    >>> print(ModuleChild(Local("self"), "weight", PARAMETERS))
    self.weight
    >>> print(ModuleChild(ModuleChild(Local("self"), "layers"), "0"))
    self.layers[0]
    """

    base: Source
    name: str
    slot: ModuleSlot = MODULES

    def __str__(self) -> str:
        if self.slot == MODULES and self.name.isdigit():
            return f"{self.base}[{self.name}]"
        return f"{self.base}.{self.name}"


@dataclass(frozen=True, slots=True)
class Default(Source):
    """A default of the function at ``base``: an int indexes ``__defaults__``,
    a str names a keyword-only default in ``__kwdefaults__``.

    >>> print(Default(Global("helper"), 0), Default(Global("helper"), "eps"))
    G['helper'].__defaults__[0] G['helper'].__kwdefaults__['eps']
    """

    base: Source
    key: int | str

    def __str__(self) -> str:
        if isinstance(self.key, int):
            return f"{self.base}.__defaults__[{self.key}]"
        return f"{self.base}.__kwdefaults__[{self.key!r}]"


@dataclass(frozen=True, slots=True)
class TensorAttr(Source):
    """A tensor attribute answered by torch itself (``.grad``, ``.shape``, ...).

    >>> print(TensorAttr(Local("x"), "grad"))
    x.grad
    """

    base: Source
    name: str

    def __post_init__(self) -> None:
        if self.name not in TENSOR_ATTRS:
            raise ValueError(f"{self.name!r} is not a tensor attribute; use Attr")

    def __str__(self) -> str:
        return f"{self.base}.{self.name}"


def _check_dim(dim: object) -> None:
    if type(dim) is not int or dim < 0:
        raise ValueError(f"a dim must be an int >= 0, not {dim!r}")


@dataclass(frozen=True, slots=True)
class TensorSize(Source):
    """``base.size(dim)``, read from the tensor itself (no Python override runs): the
    value of a dynamic size, for relation guards.

    >>> print(TensorSize(Local("x"), 0))
    x.size(0)
    """

    base: Source
    dim: int

    def __post_init__(self) -> None:
        _check_dim(self.dim)

    def __str__(self) -> str:
        return f"{self.base}.size({self.dim})"


@dataclass(frozen=True, slots=True)
class TensorStride(Source):
    """``base.stride(dim)``, read as :class:`TensorSize` reads a size.

    >>> print(TensorStride(Local("x"), 1))
    x.stride(1)
    """

    base: Source
    dim: int

    def __post_init__(self) -> None:
        _check_dim(self.dim)

    def __str__(self) -> str:
        return f"{self.base}.stride({self.dim})"


@dataclass(frozen=True, slots=True)
class TypeOf(Source):
    """``type(base)``.

    >>> print(TypeOf(Local("x")))
    type(x)
    """

    base: Source

    def __str__(self) -> str:
        return f"type({self.base})"


@dataclass(frozen=True, slots=True)
class TorchState(Source):
    """A piece of global torch state, named by its key in ``STATE_FIELDS``.

    >>> print(TorchState("grad_mode"))
    grad mode
    """

    field: str

    def __post_init__(self) -> None:
        if self.field not in STATE_FIELDS:
            raise ValueError(f"unknown torch state {self.field!r}; see STATE_FIELDS")

    def __str__(self) -> str:
        return STATE_FIELDS[self.field].label


@dataclass(frozen=True, slots=True)
class Backend(Source):
    """The backend of the running compiled callable (see ``state.backend_scope``).

    >>> print(Backend())
    backend
    """

    def __str__(self) -> str:
        return "backend"


@dataclass(frozen=True, slots=True)
class ModuleGlobal(Source):
    """A global of another module (a function inlined from it reads it), with
    ``LOAD_GLOBAL``'s fallback to builtins.

    >>> print(ModuleGlobal("torch.nn.functional", "F"))
    M['torch.nn.functional'].F
    """

    module: str
    name: str

    def __str__(self) -> str:
        return f"M[{self.module!r}].{self.name}"


def read_module_global(module: str, name: str) -> Any:
    """The value ``LOAD_GLOBAL name`` finds in ``module``'s code (KeyError if none).

    >>> read_module_global("os", "sep") == os.sep, read_module_global("os", "len") is len
    (True, True)
    """
    namespace = sys.modules[module].__dict__
    if name in namespace:
        return namespace[name]
    return builtins.__dict__[name]


def class_attribute(cls: type, name: str) -> Any:
    """``name`` as the first class of ``cls.__mro__`` defining it holds it (None if none does).

    >>> class C:
    ...     k = 2
    >>> class_attribute(C, "k"), class_attribute(C, "missing")
    (2, None)
    """
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return None


@dataclass(frozen=True, slots=True)
class Computed(Source):
    """``fn(*args)``, where each argument is a source or a constant: a number derived
    from the frame's numbers, so that a guard can check a condition on them
    (``loss > 0.0``) instead of their exact values.

    >>> import operator
    >>> print(Computed(operator.gt, (Local("loss"), 0.0)))
    gt(loss, 0.0)
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...]

    def depth(self) -> int:
        """One more than its deepest argument: checked after the arguments' own guards."""
        return 1 + max((a.depth() for a in self.args if isinstance(a, Source)), default=0)

    def __str__(self) -> str:
        name = getattr(self.fn, "__name__", repr(self.fn))
        return (
            f"{name}({', '.join(str(a) if isinstance(a, Source) else repr(a) for a in self.args)})"
        )


S = TypeVar("S", bound=Source)
Fetch = Callable[[Any, Emitter], str]

#: Source class -> code reaching its value, given the compiler. One entry per class.
FETCHERS: dict[type[Source], Fetch] = {}


def fetcher(cls: type[S]) -> Callable[[Callable[[S, Emitter], str]], Callable[[S, Emitter], str]]:
    """Register the code emitter of a source class in :data:`FETCHERS`."""

    def register(fn: Callable[[S, Emitter], str]) -> Callable[[S, Emitter], str]:
        if cls in FETCHERS:
            raise ValueError(f"{cls.__name__} already has a fetcher")
        FETCHERS[cls] = fn
        return fn

    return register


def _getattr_code(base: str, name: str) -> str:
    if name.isidentifier() and not keyword.iskeyword(name):
        return f"{base}.{name}"
    return f"getattr({base}, {name!r})"


@fetcher(Local)
def _fetch_local(src: Local, em: Emitter) -> str:
    return em.arg(src.name)


@fetcher(Global)
def _fetch_global(src: Global, em: Emitter) -> str:
    return em.global_(src.name)


@fetcher(Cell)
def _fetch_cell(src: Cell, em: Emitter) -> str:
    return f"{em.cell(src.name)}.cell_contents"


@fetcher(Attr)
def _fetch_attr(src: Attr, em: Emitter) -> str:
    return _getattr_code(em.value(src.base), src.name)


@fetcher(GenericAttr)
def _fetch_generic_attr(src: GenericAttr, em: Emitter) -> str:
    return f"{em.bind(object.__getattribute__)}({em.value(src.base)}, {src.name!r})"


@fetcher(TensorAttr)
def _fetch_tensor_attr(src: TensorAttr, em: Emitter) -> str:
    return _getattr_code(em.value(src.base), src.name)


@fetcher(TensorSize)
def _fetch_size(src: TensorSize, em: Emitter) -> str:
    return f"{em.bind(_accel.size_at)}({em.value(src.base)}, {src.dim})"


@fetcher(TensorStride)
def _fetch_stride(src: TensorStride, em: Emitter) -> str:
    return f"{em.bind(_accel.stride_at)}({em.value(src.base)}, {src.dim})"


@fetcher(Item)
def _fetch_item(src: Item, em: Emitter) -> str:
    return f"{em.value(src.base)}[{src.key!r}]"


@fetcher(DictItem)
def _fetch_dict_item(src: DictItem, em: Emitter) -> str:
    return f"{em.bind(dict.__getitem__)}({em.value(src.base)}, {src.key!r})"


@fetcher(ModuleChild)
def _fetch_module_child(src: ModuleChild, em: Emitter) -> str:
    # The slot dict is a source of its own so that siblings share one fetch of it.
    return f"{em.value(Attr(src.base, src.slot))}[{src.name!r}]"


@fetcher(Default)
def _fetch_default(src: Default, em: Emitter) -> str:
    if isinstance(src.key, int):
        return f"{em.value(src.base)}.__defaults__[{src.key}]"
    return f"{em.value(src.base)}.__kwdefaults__[{src.key!r}]"


@fetcher(TypeOf)
def _fetch_type(src: TypeOf, em: Emitter) -> str:
    return f"type({em.value(src.base)})"


@fetcher(ModuleGlobal)
def _fetch_module_global(src: ModuleGlobal, em: Emitter) -> str:
    return f"{em.bind(read_module_global)}({src.module!r}, {src.name!r})"


@fetcher(Computed)
def _fetch_computed(src: Computed, em: Emitter) -> str:
    args = [em.value(a) if isinstance(a, Source) else em.bind(a) for a in src.args]
    return f"{em.bind(src.fn)}({', '.join(args)})"


@fetcher(TorchState)
def _fetch_state(src: TorchState, em: Emitter) -> str:
    return f"{em.bind(STATE_FIELDS[src.field].read)}()"


@fetcher(Backend)
def _fetch_backend(src: Backend, em: Emitter) -> str:
    return f"{em.bind(read_backend)}()"
