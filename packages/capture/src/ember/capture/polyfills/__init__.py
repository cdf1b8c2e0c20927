"""Plain-Python stand-ins for library code the interpreter cannot step through.

A *polyfill* is ordinary Python that does what a C function, an introspective
stdlib function or one of torch's compiler hooks does, written so that ember's
interpreter can trace it. When traced code calls a callable that has one, the
interpreter calls the polyfill instead (``calls.call_value``): a function is
inlined, a class (``contextlib.nullcontext``'s stand-in) is instantiated like any
user class. Polyfills live in one module per module they stand in for
(``polyfills/dataclasses.py`` for ``dataclasses``, ``polyfills/torch_compiler.py``
for ``torch.compiler``) and register with :func:`polyfill`, keyed by the real
callable, or by its code object where a library makes many functions of one code
(each namedtuple class's ``_replace``). A function whose whole body returns another
function's result has that function's polyfill (:func:`forwarded_call`): the older
spellings of ``is_compiling`` that torch keeps are found so, never named. :func:`lookup` also
finds callables that are one of many made by a library function around another (each
``@contextlib.contextmanager`` function is its own ``helper`` closure, each ``torch.optim`` step
its own ``_use_grad``): :func:`closure_polyfill` registers the code they share. Polyfill code
is traced although it lives in ember's package (its trace rule says so).

>>> import contextlib, dataclasses
>>> lookup(contextlib.nullcontext).__name__, lookup(dataclasses.fields).__module__
('NullContext', 'ember.capture.polyfills.dataclasses')
>>> lookup(len) is None
True
"""

from __future__ import annotations

import builtins
import dis
import importlib
import os
import types
from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = [
    "CLOSURE_POLYFILLS",
    "FOLDER",
    "POLYFILLS",
    "TENSOR_METHODS",
    "closure_polyfill",
    "contextmanager_parts",
    "forwarded_call",
    "lazy_builtin",
    "lookup",
    "lookup_tensor_method",
    "polyfill",
    "qualified_name",
    "tensor_method",
]

F = TypeVar("F", bound=Callable[..., Any])

FOLDER = os.path.join(os.path.dirname(__file__), "")

# real callable (or "module.qualname") -> the polyfill called in its place
POLYFILLS: dict[Any, Any] = {}


def polyfill(*reals: Any) -> Callable[[F], F]:
    """Register the decorated function or class as the polyfill of each of ``reals``."""

    def register(fn: F) -> F:
        for real in reals:
            if real in POLYFILLS:
                raise ValueError(f"{real!r} already has a polyfill: {POLYFILLS[real]!r}")
            POLYFILLS[real] = fn
        return fn

    return register


# Tensor method name -> the polyfill traced in place of ``t.name(...)`` (called with ``t``
# first). Keyed by name, not by the method: the polyfill calls ``torch.Tensor.name`` itself
# (a graph node) for the cases it does not rewrite.
TENSOR_METHODS: dict[str, Any] = {}


def tensor_method(name: str) -> Callable[[F], F]:
    """Register the decorated function as the polyfill of the tensor method ``name``."""

    def register(fn: F) -> F:
        if name in TENSOR_METHODS or not hasattr(torch.Tensor, name):
            raise ValueError(f"Tensor.{name} has a polyfill already, or is no tensor method")
        TENSOR_METHODS[name] = fn
        return fn

    return register


def lookup_tensor_method(name: str) -> Any:
    """The polyfill of the tensor method ``name``, or None."""
    _load()
    return TENSOR_METHODS.get(name)


def qualified_name(fn: Any) -> str:
    """``module.qualname`` of a function (``""`` for objects without them).

    >>> qualified_name(os.path.join)
    'posixpath.join'
    """
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return ""
    return f"{module}.{qualname}"


def lookup(fn: Any) -> Any:
    """The polyfill called in place of ``fn``, or None."""
    _load()
    try:
        found = POLYFILLS.get(fn)
    except TypeError:  # unhashable
        return None
    if found is None and isinstance(fn, types.FunctionType):
        found = POLYFILLS.get(fn.__code__)  # one of many functions a library makes (namedtuple's)
    if found is None and isinstance(fn, types.FunctionType):
        forwarded = forwarded_call(fn)  # ``return torch.compiler.is_compiling()``
        if forwarded is not None and forwarded is not fn:
            found = lookup(forwarded)
    if found is None and isinstance(fn, types.FunctionType):
        found = _undisabled(fn)
    return found


def _undisabled(fn: types.FunctionType) -> Any:
    """The optimizer method torch's compiler wrapped in its ``disable`` once it ran in this
    process (it puts one around every ``Optimizer._init_group``, which it handles apart):
    ember traces the method itself. Other functions so wrapped stay as they are."""
    original = fn.__dict__.get("_torchdynamo_orig_callable")
    if not isinstance(original, types.FunctionType) or original is fn:
        return None
    module = original.__module__ or ""
    return original if module.startswith("torch.optim.") else None


# What a function that only returns another's result, called with no arguments, is made of.
_FORWARDER_OPS = frozenset(
    {"RESUME", "NOP", "PUSH_NULL", "LOAD_GLOBAL", "LOAD_ATTR", "LOAD_METHOD", "PRECALL", "CALL",
     "RETURN_VALUE", "CACHE"}
)  # fmt: skip


def forwarded_call(fn: types.FunctionType) -> Any:
    """The function ``fn`` calls if its whole body is ``return a.b.c()`` (no arguments,
    names reached from its globals), else None. Such a wrapper has its target's polyfill.

    >>> forwarded_call(lambda: os.getcwd()) is os.getcwd
    True
    """
    code = fn.__code__
    if code.co_argcount or code.co_kwonlyargcount or code.co_flags & 0x0C:  # *args, **kw
        return None
    if len(code.co_code) > 64:  # far more than a forwarder's few instructions
        return None
    instrs = list(dis.get_instructions(code))
    calls = [i for i in instrs if i.opname == "CALL"]
    if any(i.opname not in _FORWARDER_OPS for i in instrs) or len(calls) != 1 or calls[0].arg:
        return None
    target: Any = None
    for ins in instrs:
        if ins.opname == "LOAD_GLOBAL":
            if target is not None:
                return None
            name = ins.argval[1] if isinstance(ins.argval, tuple) else ins.argval
            target = fn.__globals__.get(name, getattr(builtins, name, None))
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD"):
            target = getattr(target, ins.argval, None)
    return target


# code of a function a library makes as a closure over the function it wraps (each
# ``@contextmanager`` function's ``helper``, each ``torch.optim`` step's ``_use_grad``) ->
# (the polyfill, called as ``polyfill(*cells, *args, **kwargs)``, the free variables whose
# cells it is given, in order)
CLOSURE_POLYFILLS: dict[types.CodeType, tuple[Any, tuple[str, ...]]] = {}


def closure_polyfill(code: types.CodeType, *freevars: str) -> Callable[[F], F]:
    """Register the decorated function as the polyfill of every closure made of ``code``:
    it is called with the contents of the closure's ``freevars`` and the call's arguments."""

    def register(fn: F) -> F:
        if code in CLOSURE_POLYFILLS:
            raise ValueError(f"{code.co_qualname} already has a polyfill")
        missing = [name for name in freevars if name not in code.co_freevars]
        if missing or not freevars:
            raise ValueError(f"{code.co_qualname} has no free variables {missing or freevars}")
        CLOSURE_POLYFILLS[code] = (fn, freevars)
        return fn

    return register


def contextmanager_parts(fn: Any) -> tuple[Any, tuple[int, ...]] | None:
    """For a closure one of :data:`CLOSURE_POLYFILLS` stands in for (a function made by
    ``@contextlib.contextmanager``, a ``torch.optim`` step): the polyfill that calls it and
    the indices in its closure of the cells it is given; else None."""
    code = getattr(fn, "__code__", None)
    if type(code) is not types.CodeType:
        return None
    _load()
    found = CLOSURE_POLYFILLS.get(code)
    if found is None or fn.__closure__ is None:
        return None
    return found[0], tuple(code.co_freevars.index(name) for name in found[1])


def lazy_builtin(obj: Any) -> Any:
    """The generator version of ``enumerate``/``zip``/``map``/``filter`` (None for others)."""
    from ember.capture.polyfills import builtins

    return builtins.LAZY.get(obj)


_MODULES = (
    "builtins", "collections", "collections_abc", "contextlib", "copy", "dataclasses", "itertools",
    "torch_autograd", "torch_compiler", "torch_core", "torch_foreach", "torch_nn", "torch_optim",
    "torch_tensor", "torch_utils", "typing",
)  # fmt: skip
_loaded = False


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for name in _MODULES:
            importlib.import_module(f"{__name__}.{name}")
