"""Whose Python ember traces: one table of module prefixes, each with its reason.

ember traces all Python the same way, the user's and that of installed
libraries (transformers, diffusers, einops, ...): a call is inlined into the
graph and a frame is compiled, whatever package it comes from. What runs
natively instead is listed in :data:`RULES`, one row per module prefix, and
the longest matching prefix decides:

* ``TRACE``: calls are inlined and frames are compiled (the default for any
  module no row names);
* ``INLINE``: calls from traced code are inlined, but frames of the module
  that CPython runs on its own are not compiled (torch's ``nn``: a module's
  ``forward`` is traced when the user's code calls it, but torch's own eager
  code paths are not intercepted);
* ``SKIP``: never inlined and never compiled. A call from traced code is
  handled by a rule of the interpreter (a torch operation becomes a graph
  node, a builtin or polyfilled function is modelled) or else breaks the graph
  at that call, in that frame.

Users extend the table with :func:`set_rule`; ``ember.compiler.set_trace_rule``
is the same function.

>>> lookup("transformers.models.llama.modeling_llama").action
'trace'
>>> rule = lookup("logging.handlers"); rule.action, rule.prefix
('skip', 'logging')
>>> lookup("torch.nn.modules.linear").action, lookup("torch._tensor").action
('inline', 'skip')
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["RULES", "Action", "TraceRule", "lookup", "module_of", "set_rule", "traceable"]

Action = Literal["trace", "inline", "skip"]
TRACE: Action = "trace"
INLINE: Action = "inline"
SKIP: Action = "skip"


@dataclass(frozen=True, slots=True)
class TraceRule:
    """One row of the table: modules named ``prefix`` (or below it) get ``action``.

    >>> TraceRule("mylib.io", "skip", "reads files").matches("mylib.io.csv")
    True
    """

    prefix: str
    action: Action
    reason: str

    def matches(self, module: str) -> bool:
        return module == self.prefix or module.startswith(self.prefix + ".")


_STDLIB_REASON = (
    "the standard library: C-backed or introspective code; what traced code needs of it "
    "is modelled by the interpreter's rules or written as a polyfill"
)

# The table. Rows are kept sorted by prefix in the docs; lookup takes the longest match.
RULES: list[TraceRule] = [
    TraceRule("ember", SKIP, "ember itself: the compiler never compiles its own code"),
    TraceRule(
        "ember.capture.polyfills",
        INLINE,
        "plain-Python stand-ins for builtins and C functions, written to be traced",
    ),
    TraceRule(
        "torch",
        SKIP,
        "torch's Python: its operations become one graph node each (calls.GRAPH_NAMESPACES); "
        "anything else in it runs natively",
    ),
    TraceRule("torch.nn", INLINE, "modules and their forward methods are traced into the graph"),
    TraceRule("torch.nn.parallel", INLINE, "DataParallel/DDP wrappers: traced to reach forward"),
    TraceRule("torch.nn.utils.parametrize", INLINE, "parametrized weights are computed in-graph"),
    TraceRule("torch.optim", INLINE, "optimizer steps are plain tensor code"),
    TraceRule("torch.utils.checkpoint", INLINE, "activation checkpointing wraps traced code"),
    TraceRule("torch.autograd.function", SKIP, "custom autograd Functions run natively"),
    TraceRule(
        "_collections_abc",
        INLINE,
        "collections.abc's mixin methods (Mapping.get, Sequence.__iter__) are plain Python over "
        "the class's own special methods",
    ),
    TraceRule("threading", SKIP, "locks and threads: real synchronisation"),
    TraceRule("_threading_local", SKIP, "thread-local storage"),
    TraceRule("logging", SKIP, "logging has I/O and global handler state"),
    TraceRule("warnings", SKIP, "warnings filters are global, mutable state"),
    TraceRule("importlib", SKIP, "imports have global side effects"),
    TraceRule("inspect", SKIP, "introspection of live frames and objects; polyfilled"),
    TraceRule("copyreg", SKIP, "pickling registry"),
    TraceRule("copy", SKIP, "copies real objects"),
    TraceRule("contextvars", SKIP, "context variables are per-thread state"),
    TraceRule("weakref", SKIP, "weak references to real objects"),
    TraceRule("abc", SKIP, "ABC registration and checks (isinstance is modelled)"),
    TraceRule("typing", SKIP, "typing constructs are constants"),
    TraceRule("typing_extensions", SKIP, "typing's backports: constants, and frame introspection"),
    TraceRule("sympy", SKIP, "symbolic math of ember's and torch's own size reasoning"),
    TraceRule("enum", SKIP, "enum members are constants"),
    TraceRule("os", SKIP, "the operating system"),
    TraceRule("re", SKIP, "regular expressions (a C engine)"),
]
_STDLIB = frozenset(sys.stdlib_module_names)
_added: list[TraceRule] = []  # rows users added, which win over the built-in ones


def lookup(module: str) -> TraceRule:
    """The row that decides for ``module`` (a dotted module name): longest prefix wins.

    A module no row names is traced, unless it is part of the standard library.

    >>> lookup("my_project.model").action
    'trace'
    """
    found = _looked_up.get(module)
    if found is None:
        found = _looked_up[module] = _lookup(module)
    return found


_looked_up: dict[str, TraceRule] = {}  # module -> its row (cleared when the rows change)


def _lookup(module: str) -> TraceRule:
    best: TraceRule | None = None
    for row in (*RULES, *_added):
        if row.matches(module) and (best is None or len(row.prefix) >= len(best.prefix)):
            best = row
    if best is not None:
        return best
    top = module.split(".")[0]
    if top in _STDLIB or (top.startswith("_") and top.lstrip("_") in _STDLIB):
        return TraceRule(top, SKIP, _STDLIB_REASON)
    return TraceRule(module, TRACE, "third-party and user code is traced")


def module_of(globals_: dict[str, Any] | None) -> str:
    """The module a function belongs to, from its globals (``""`` when unknown).

    Only a module's own namespace counts: code run with a copy of it (a doctest, an
    ``exec`` with a namespace of its own) is not that module's code.

    >>> module_of(sys.modules["json"].__dict__), module_of({"__name__": "json"})
    ('json', '')
    """
    if globals_ is None:
        return ""
    name = globals_.get("__name__")
    module = sys.modules.get(name) if isinstance(name, str) else None
    if module is not None and getattr(module, "__dict__", None) is globals_:
        return name  # type: ignore[return-value]
    # A module whose __name__ is not its key (_collections_abc calls itself collections.abc),
    # or no module's namespace at all: found by identity, once per namespace.
    known = _namespaces.get(id(globals_))
    if known is None or known[0] is not globals_:
        found = next(
            (
                key
                for key, m in sys.modules.copy().items()
                if getattr(m, "__dict__", None) is globals_
            ),
            "",
        )
        if len(_namespaces) > 4096:
            _namespaces.clear()
        known = _namespaces[id(globals_)] = (globals_, found)
    return known[1]


# id(namespace) -> (namespace, module name or ""): the namespace is held so its id stays its own
_namespaces: dict[int, tuple[dict[str, Any], str]] = {}


def traceable(fn: Any) -> bool:
    """Whether a call of the Python function ``fn`` is inlined by the interpreter.

    >>> import logging, torch
    >>> traceable(logging.getLogger), traceable(torch.nn.Linear.forward)
    (False, True)
    """
    if not isinstance(fn, types.FunctionType):
        return False
    return lookup(module_of(fn.__globals__)).action != SKIP


def compiles_frames(globals_: dict[str, Any] | None) -> bool:
    """Whether frames of code with these globals are compiled when CPython runs them."""
    return lookup(module_of(globals_)).action == TRACE


def set_rule(prefix: str, action: Action, reason: str) -> TraceRule:
    """Add a row to the table: modules named ``prefix`` (and below) get ``action``.

    Rows added here win over the built-in rows with the same prefix. Use ``"skip"``
    for a library ember should never trace (code with I/O, or that ember cannot
    follow), ``"trace"`` to trace a module a built-in row skips.

    >>> row = set_rule("mylib.io", "skip", "reads files")
    >>> lookup("mylib.io.csv") == row
    True
    >>> remove_rule("mylib.io")
    """
    if action not in (TRACE, INLINE, SKIP):
        raise ValueError(f"action must be 'trace', 'inline' or 'skip', not {action!r}")
    if not prefix or not isinstance(prefix, str):
        raise ValueError(f"prefix must be a module name, not {prefix!r}")
    if not reason:
        raise ValueError("a rule needs a reason (shown by explain())")
    remove_rule(prefix)
    row = TraceRule(prefix, action, reason)
    _added.append(row)
    _looked_up.clear()
    return row


def remove_rule(prefix: str) -> None:
    """Remove the row :func:`set_rule` added for ``prefix`` (if any)."""
    _added[:] = [row for row in _added if row.prefix != prefix]
    _looked_up.clear()
