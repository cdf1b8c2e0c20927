"""Compile guards to Python source: one check function, one explainer.

Both functions come from the same emitters (``KINDS`` and ``FETCHERS``), so
the explainer finds exactly the guard that made the check fail. The explainer
is built only when a check failed and someone asks why (it costs as much as the
check to build); it reads globals as the check was built to, from the
``resolved`` record the check's emitter left (see :meth:`CheckEmitter.global_`).
Each source
is fetched once, into a local, right before the first guard that needs it;
guards run in the order of their :class:`~ember.guards.guardset.GuardSet`.
Every exception (a missing attribute, a raising ``__eq__``) means False.

>>> from ember.guards import FrameSpec, Local, equals
>>> frame = FrameSpec("f", ("k",), {}, {})
>>> source, check = build_check([equals(Local("k"), 3)], frame)
>>> print(source)
def __make():
    def check_f(L_k, /):
        try:
            if not (type(L_k) is int and L_k == 3): return False
        except Exception:
            return False
        return True
    return check_f
>>> check(3), check(3.0), check("3")
(True, False, False)
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator, Sequence
from types import CodeType
from typing import Any

from ember.guards.frame import FrameSpec
from ember.guards.kinds import KINDS, Guard
from ember.guards.sources import FETCHERS, Local, Source
from ember.guards.stamps import StampState, stamps_match

__all__ = [
    "CheckEmitter",
    "build_check",
    "build_explainer",
    "build_fetch",
    "compiled_source",
    "precompiled",
]

# Code compiled from generated guard source by another process, by a digest of its file name
# and source (see :func:`precompiled`): compile() is most of what a check costs to build
# (2-4 ms for a model's 130-250 guards; emitting the source is a fraction of that).
_PRECOMPILED: dict[str, CodeType] = {}


def _filename(frame: FrameSpec) -> str:
    return f"<ember guards for {frame.name}>"


def _digest(filename: str, source: str) -> str:
    return hashlib.sha256(f"{filename}\n{source}".encode()).hexdigest()


def _code(source: str, frame: FrameSpec) -> CodeType:
    filename = _filename(frame)
    if _PRECOMPILED:
        code = _PRECOMPILED.get(_digest(filename, source))
        if code is not None:
            return code
    return compile(source, filename, "exec")


def compiled_source(source: str, frame: FrameSpec) -> tuple[str, CodeType]:
    """``(digest, code)``: generated guard ``source`` for ``frame`` compiled, and what names
    exactly that source and file name, for :func:`precompiled` in another process.

    >>> frame = FrameSpec("f", ("k",), {}, {})
    >>> source, _ = build_check([], frame)
    >>> digest, code = compiled_source(source, frame)
    >>> len(digest), code.co_filename
    (64, '<ember guards for f>')
    """
    return _digest(_filename(frame), source), _code(source, frame)


@contextlib.contextmanager
def precompiled(codes: dict[str, CodeType]) -> Iterator[None]:
    """Inside the block, generated guard source whose digest (:func:`compiled_source`) is a
    key of ``codes`` runs that code instead of being compiled. A portable pack carries the
    code of its entries' checks: the source is still emitted from the guards and must be
    the very text the code was compiled from (the digest says so), so only compiling is
    saved. The code is trusted as the pack's other bytecode is.

    >>> from ember.guards import Local, equals
    >>> frame = FrameSpec("f", ("k",), {}, {})
    >>> source, _ = build_check([equals(Local("k"), 3)], frame)
    >>> codes = dict([compiled_source(source, frame)])  # where the pack is saved
    >>> with precompiled(codes):  # where it is loaded: the same source, not compiled again
    ...     _, check = build_check([equals(Local("k"), 3)], frame)
    >>> check(3), check(4)
    (True, False)
    """
    _PRECOMPILED.update(codes)
    try:
        yield
    finally:
        for digest in codes:
            _PRECOMPILED.pop(digest, None)


class CheckEmitter:
    """Collects the body lines and bound constants of one generated function.

    >>> em = CheckEmitter(FrameSpec("f", ("x",), {"w": 1}, {}))
    >>> em.global_("w"), em.global_("len")
    ("G['w']", "(G['len'] if 'len' in G else B['len'])")
    >>> em.resolved
    {'w': True, 'len': False}
    """

    def __init__(self, frame: FrameSpec, resolved: dict[str, bool] | None = None) -> None:
        self.frame = frame
        # global name -> whether it was one when first emitted; shared between the check's
        # emitter and those made later for the same frame (explainer, fetches), so that all
        # read a name the way the check does though the module's globals changed since
        self.resolved: dict[str, bool] = {} if resolved is None else resolved
        self.lines: list[str] = []
        self.names: dict[str, object] = {}
        self._bound: dict[int, str] = {}
        self._values: dict[Source, str] = {}
        self._temps = 0
        self.params = [
            f"L_{name}" if name.isidentifier() else f"L_{i}_"
            for i, name in enumerate(frame.arg_names)
        ]

    def bind(self, obj: object) -> str:
        """A name for ``obj`` in the function's closure (one name per object)."""
        name = self._bound.get(id(obj))
        if name is None:
            name = self._bound[id(obj)] = f"K{len(self._bound)}"
            self.names[name] = obj
        return name

    def arg(self, name: str) -> str:
        """The parameter that receives the frame argument ``name``."""
        if name not in self.frame.arg_names:
            raise ValueError(f"{name!r} is not an argument of {self.frame.name}")
        return self.params[self.frame.arg_names.index(name)]

    def cell(self, name: str) -> str:
        """A name bound to closure cell ``name`` (read at check time)."""
        if name not in self.frame.cells:
            raise ValueError(f"{name!r} is not a closure variable of {self.frame.name}")
        return self.bind(self.frame.cells[name])

    def global_(self, name: str) -> str:
        """``LOAD_GLOBAL`` semantics. A name that is a global now stays one: if
        it is deleted the lookup raises and the check fails. "Now" is when the
        first emitter sharing ``resolved`` saw the name."""
        self.names.setdefault("G", self.frame.globals)
        is_global = self.resolved.get(name)
        if is_global is None:
            is_global = self.resolved[name] = name in self.frame.globals
        if is_global:
            return f"G[{name!r}]"
        self.names.setdefault("B", self.frame.builtins)
        return f"(G[{name!r}] if {name!r} in G else B[{name!r}])"

    def value(self, source: Source) -> str:
        """A local holding ``source``'s value; emits the fetch the first time."""
        name = self._values.get(source)
        if name is None:
            code = FETCHERS[type(source)](source, self)
            if isinstance(source, Local):
                name = code
            else:
                name, self._temps = f"v{self._temps}", self._temps + 1
                self.lines.append(f"{name} = {code}")
            self._values[source] = name
        return name

    def render(self, fn_name: str, body: Sequence[str]) -> str:
        """The source of ``__make(<bound names>)``, which returns the function."""
        params = ", ".join([*self.params, "/"]) if self.params else ""
        return "\n".join(
            [f"def __make({', '.join(self.names)}):", f"    def {fn_name}({params}):"]
            + [f"        {line}" for line in body]
            + [f"    return {fn_name}"]
        )

    def make(self, source: str) -> Callable[..., Any]:
        """Execute ``source`` and call ``__make`` with the bound objects."""
        namespace: dict[str, Any] = {}
        exec(_code(source, self.frame), namespace)
        fn: Callable[..., Any] = namespace["__make"](**self.names)
        return fn


def _indent(lines: Sequence[str]) -> list[str]:
    return [f"    {line}" for line in lines] or ["    pass"]


def _fn_name(frame: FrameSpec, prefix: str) -> str:
    tail = frame.name.rsplit(".", 1)[-1]
    return f"{prefix}_{tail}" if tail.isidentifier() else prefix


def _runs(guards: Sequence[Guard]) -> list[list[Guard]]:
    """Consecutive guards of one batchable kind form a run; others stand alone."""
    runs: list[list[Guard]] = []
    for guard in guards:
        if runs and KINDS[guard.kind].batch is not None and runs[-1][0].kind is guard.kind:
            runs[-1].append(guard)
        else:
            runs.append([guard])
    return runs


def build_check(
    guards: Sequence[Guard],
    frame: FrameSpec,
    resolved: dict[str, bool] | None = None,
    stamps: StampState | None = None,
) -> tuple[str, Callable[..., bool]]:
    """The hot check: ``check(*frame_args) -> bool``, and its source. How it read each
    global name goes into ``resolved`` (see :class:`CheckEmitter`). With ``stamps``, it
    first asks whether the stamp program still holds, and if so runs only the guards the
    stamps leave (see :mod:`ember.guards.stamps`); after a full pass it records again."""
    em = CheckEmitter(frame, resolved)
    for run in _runs(guards):
        rule = KINDS[run[0].kind]
        test = rule.batch(run, em) if rule.batch and len(run) > 1 else rule.emit(run[0], em)
        em.lines.append(f"if not ({test}): return False")
    args = ", ".join(em.params)
    fast, restamp = [], []
    if stamps is not None:
        slot = em.bind(stamps.slot)
        fast = [f"if {em.bind(stamps_match)}({slot}[0]): return {slot}[1]({args})"]
        restamp = [f"{em.bind(stamps.restamp)}({args})"]
    body = ["try:", *_indent([*fast, *em.lines]), "except Exception:", "    return False"]
    source = em.render(_fn_name(frame, "check"), [*body, *restamp, "return True"])
    check: Callable[..., bool] = em.make(source)
    if stamps is not None:
        stamps.check = check
    return source, check


def build_explainer(
    guards: Sequence[Guard], frame: FrameSpec, resolved: dict[str, bool] | None = None
) -> Callable[..., Any]:
    """``explain(*frame_args) -> (index of the first failing guard or -1, exception)``.
    Pass the check's ``resolved`` so that it reads globals as the check does.

    >>> from ember.guards import FrameSpec, Local, equals
    >>> explain = build_explainer([equals(Local("k"), 3)], FrameSpec("f", ("k",), {}, {}))
    >>> explain(3), explain(4)
    ((-1, None), (0, None))
    """
    em = CheckEmitter(frame, resolved)
    for index, guard in enumerate(guards):
        em.lines.append(f"i = {index}")
        test = KINDS[guard.kind].emit(guard, em)
        em.lines.append(f"if not ({test}): return {index}, None")
    body = [
        "i = -1",
        "try:",
        *_indent(em.lines),
        "except Exception as error:",
        "    return i, error",
    ]
    return em.make(em.render(_fn_name(frame, "explain"), [*body, "return -1, None"]))


def build_fetch(
    source: Source, frame: FrameSpec, resolved: dict[str, bool] | None = None
) -> Callable[..., Any]:
    """``fetch(*frame_args)`` returns ``source``'s value (raising if it cannot).

    >>> from ember.guards import Attr, FrameSpec, Local
    >>> fetch = build_fetch(Attr(Local("x"), "real"), FrameSpec("f", ("x",), {}, {}))
    >>> fetch(3)
    3
    """
    em = CheckEmitter(frame, resolved)
    result = em.value(source)
    return em.make(em.render(_fn_name(frame, "fetch"), [*em.lines, f"return {result}"]))
