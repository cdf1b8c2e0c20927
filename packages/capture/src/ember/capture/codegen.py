"""Write the function that replaces a translated frame.

The replacement takes the frame's argument slots (as the hook passes them),
loads every graph input from its source, calls the compiled graph with the
hook passing frames through, and rebuilds the frame's return value from the
graph outputs and constants. It is generated as Python source and compiled by
CPython (so its bytecode is always valid), then given the original function's
globals, closure cells, file name and first line, so that tracebacks point
into the user's function and the hook's "same globals and closure" rule holds.

>>> from ember.guards import Local, Attr
>>> print(source_expr(Attr(Local("self"), "scale")))
self.scale
"""

from __future__ import annotations

import builtins
import math
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ember.capture import _eval_frame, guarding
from ember.capture.hook import argument_names
from ember.capture.userobjects import make_instance, replace_items

# How to rebuild one part of the return value. A small tree:
#   ("out", i)             graph output i
#   ("const", value)       a constant
#   ("source", source)     an object the frame reaches (returned as is)
#   ("tuple"|"list", [..]) a container of parts
#   ("dict", [(k, part)])  a dict with constant keys
#   ("attr", (part, name)) part.name (a bound method, at a graph break)
#   ("iter", [..])         an iterator over the parts (a loop's iterator, at a graph break)
#   ("shared", (ref, part)) a list or dict built once however many names refer to it
#   ("new", (cls, [..]))   cls(*parts), made afresh on every run (an exception to raise)
#   ("call", (part, [..], [(k, part)]))  part(*parts, **kwparts): an unstarted generator
#   ("object", (cls, [(name, part)], [(key, part)] | None))  an instance made inside the
#                          frame, attributes (and a dict-derived class's items) set
#   ("function", (code, globals, [defaults], [(k, kwdefault)], [cell content | None]))
#                          a function made inside the frame (a comprehension at a break),
#                          with new cells holding the contents its closure had
Part = tuple[str, Any]

_UNBOUND = object()  # an empty closure cell


def make_namedtuple(cls: type[tuple[Any, ...]], *items: Any) -> tuple[Any, ...]:
    """``cls(*items)`` for a namedtuple class (``cls(items)`` for a struct sequence), without
    running its ``__new__`` in Python (which the hook would then compile as a frame of its own).

    >>> import collections
    >>> make_namedtuple(collections.namedtuple("P", "a b"), 1, 2)
    P(a=1, b=2)
    """
    if hasattr(cls, "n_sequence_fields"):  # a struct sequence (torch.return_types.sort)
        return cls(items)
    return tuple.__new__(cls, items)


def inference_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t`` as an inference tensor, as eager makes a tensor computed inside
    ``torch.inference_mode()``: a backend that traces the graph to aten ops (aotgraph)
    computes it as a normal tensor, so it is copied once under the mode.

    >>> inference_tensor(torch.ones(2)).is_inference()
    True
    """
    if t.is_inference():
        return t
    with torch.inference_mode():
        return t.clone()


def normal_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a normal tensor, as eager makes a tensor computed outside (or after) an
    inference-mode block: an aotgraph-traced graph entered inside a split block runs whole
    under the mode, so it is copied once outside it.

    >>> with torch.inference_mode():
    ...     t = torch.ones(2)
    >>> normal_tensor(t).is_inference()
    False
    """
    if not t.is_inference():
        return t
    with torch.inference_mode(False):
        return t.clone()


class GradModeExit:
    """The ``__exit__`` of a grad-mode ``with`` block that a graph break splits: the frame's
    replacement and the resume function hold this in its place, and calling it (at the
    block's end, or on an exception) restores the grad mode from before the block.

    >>> import torch
    >>> with torch.no_grad():
    ...     GradModeExit(True)(None, None, None)
    ...     torch.is_grad_enabled()
    True
    """

    __slots__ = ("previous",)

    def __init__(self, previous: bool) -> None:
        self.previous = previous

    def __call__(self, *exc_info: object) -> None:
        torch._C._set_grad_enabled(self.previous)  # None: an exception propagates

    def __repr__(self) -> str:
        return f"GradModeExit(previous={self.previous})"


class ModeReentry:
    """The ``__exit__`` of an autocast or inference-mode ``with`` block that a graph break
    splits. The graph leaves the mode at its end; making this object enters it again for the
    native instruction and the resume function, and calling it (at the block's end, or on an
    exception) leaves it, as the block's own exit would.

    >>> import torch
    >>> from torch.amp.autocast_mode import _enter_autocast, _exit_autocast
    >>> block = ModeReentry(_enter_autocast, _exit_autocast, "cpu", torch.bfloat16, True, None)
    >>> torch.is_autocast_enabled("cpu"), block(None, None, None), torch.is_autocast_enabled("cpu")
    (True, None, False)
    """

    __slots__ = ("enter", "exit", "off", "token")

    def __init__(self, enter: Callable[..., Any], exit: Callable[[Any], Any], *args: Any) -> None:
        self.enter, self.exit = enter, exit
        # The arguments of ``enter`` that switch the mode off, when it was off before the
        # block (a later graph leaves the block by entering that), else None.
        self.off = _MODE_OFF[enter.__name__](*args) if enter.__name__ in _MODE_OFF else None
        self.token = enter(*args)

    def __call__(self, *exc_info: object) -> None:
        self.exit(self.token)  # None: an exception propagates


# enter function -> (its arguments -> the arguments that switch the mode off, if it is off now)
_MODE_OFF: dict[str, Callable[..., tuple[Any, ...] | None]] = {
    "_enter_autocast": lambda device, dtype, enabled, cache: (
        (device, dtype, False, cache) if not torch.is_autocast_enabled(device) else None
    ),
    "_enter_inference_mode": lambda mode: (
        (False,) if not torch.is_inference_mode_enabled() else None
    ),
}


def make_function(
    code: types.CodeType,
    globals_: dict[str, Any],
    defaults: tuple[Any, ...],
    kwdefaults: dict[str, Any],
    contents: tuple[Any, ...],
) -> types.FunctionType:
    """A function made inside a frame, rebuilt with fresh cells holding ``contents``.

    >>> f = make_function((lambda a, b=1: a + b).__code__, {}, (2,), {}, ())
    >>> f(1)
    3
    """
    cells = tuple(types.CellType() if c is _UNBOUND else types.CellType(c) for c in contents)
    fn = types.FunctionType(code, globals_, code.co_name, defaults or None, cells or None)
    fn.__kwdefaults__ = kwdefaults or None
    return fn


PREFIX = "__ember_"


@dataclass(frozen=True, slots=True)
class Replacement:
    """The generated function and the source it was compiled from (for dumps)."""

    fn: types.FunctionType
    source: str


def source_expr(
    source: Any, names: dict[str, str] | None = None, named: dict[Any, str] | None = None
) -> str:
    """A Python expression that reaches ``source`` inside the generated function.

    The generated function's parameters are renamed (``names``): a frame's local may
    be named anything, e.g. pytest's assertion rewriting makes locals like "@py_assert1".
    Sources in ``named`` are read from those names (see :func:`shared_reads`).
    """
    mapping = names if names is not None else {}
    return guarding.source_expression(
        source, globals_name=PREFIX + "G", local=lambda n: mapping.get(n, n), named=named
    )


def shared_reads(sources: list[Any], names: dict[str, str]) -> tuple[list[str], dict[Any, str]]:
    """Statements reading once each object that two or more of ``sources`` are reached
    through, and the names they bind. A model's graph takes every parameter, each some ten
    subscripts from ``self`` (``self.__dict__['_modules']['encoder']...``); sharing the
    common part cuts the reads per call several times over.

    >>> from ember.guards import Local, ModuleChild
    >>> layer = ModuleChild(Local("self"), "layer")
    >>> lines, named = shared_reads([ModuleChild(layer, "a"), ModuleChild(layer, "b")], {})
    >>> lines
    ["__ember_p0 = self.__dict__['_modules']['layer']"]
    """
    uses: dict[Any, int] = {}
    for source in sources:
        base = getattr(source, "base", None)
        while base is not None and getattr(base, "base", None) is not None:  # not a root
            uses[base] = uses.get(base, 0) + 1
            base = base.base
    shared = sorted((s for s, n in uses.items() if n > 1), key=lambda s: s.depth())
    lines: list[str] = []
    named: dict[Any, str] = {}
    for source in shared:
        expr = source_expr(source, names, named)
        named[source] = f"{PREFIX}p{len(lines)}"
        lines.append(f"{named[source]} = {expr}")
    return lines, named


def _input_reads(sources: list[Any], names: dict[str, str]) -> tuple[list[str], str]:
    """The statements reading the modules the graph inputs share, and the inputs' list."""
    prefetch, named = shared_reads(sources, names)
    return prefetch, ", ".join(source_expr(s, names, named) for s in sources)


def _literal(value: Any) -> bool:
    if type(value) in (int, bool, str, type(None)):
        return True
    return type(value) is float and math.isfinite(value)


@dataclass
class _Rebuild:
    """Writes expressions that rebuild parts. Constants that are not literals go to
    ``constants`` (the generated function's ``c``); a "shared" part (an object several
    names refer to) is built once, bound with ``:=``, and named afterwards (``shared``
    holds the ones built); ``names`` maps the frame's argument names to parameters."""

    constants: list[Any]
    shared: set[int]
    names: dict[str, str]

    def expr(self, part: Part) -> str:
        kind, payload = part
        return PART_RULES[kind](self, payload)

    def const(self, obj: Any) -> str:
        self.constants.append(obj)
        return f"{PREFIX}c[{len(self.constants) - 1}]"

    def items(self, parts: list[Part]) -> str:
        return ", ".join(self.expr(p) for p in parts)


def _shared(r: _Rebuild, payload: Any) -> str:
    ref, inner = payload
    name = f"{PREFIX}h{ref}"
    if ref in r.shared:
        return name
    r.shared.add(ref)
    return f"({name} := {r.expr(inner)})"


def _function(r: _Rebuild, payload: Any) -> str:
    code, globals_, defaults, kwdefaults, contents = payload
    cells = "".join(f"{r.const(_UNBOUND) if p is None else r.expr(p)}, " for p in contents)
    kw = ", ".join(f"{n!r}: {r.expr(p)}" for n, p in kwdefaults)
    defaults_expr = "".join(f"{r.expr(p)}, " for p in defaults)
    return (
        f"{r.const(make_function)}({r.const(code)}, {r.const(globals_)}, "
        f"({defaults_expr}), {{{kw}}}, ({cells}))"
    )


# One rule per kind of part (see ``Part``): the expression that rebuilds it.
PART_RULES: dict[str, Callable[[_Rebuild, Any], str]] = {
    "shared": _shared,
    "out": lambda r, i: f"{PREFIX}o[{i}]",
    "const": lambda r, value: repr(value) if _literal(value) else r.const(value),
    "source": lambda r, source: source_expr(source, r.names),
    "tuple": lambda r, parts: f"({r.items(parts)}{',' if len(parts) == 1 else ''})",
    "list": lambda r, parts: f"[{r.items(parts)}]",
    "dict": lambda r, pairs: "{" + ", ".join(f"{k!r}: {r.expr(p)}" for k, p in pairs) + "}",
    "attr": lambda r, p: f"{PREFIX}B.getattr({r.expr(p[0])}, {p[1]!r})",  # a bound method
    "new": lambda r, p: f"{r.const(p[0])}({r.items(p[1])})",  # made again on every run
    "object": lambda r, p: (
        f"{r.const(make_instance)}({r.const(p[0])}, "
        + "{"
        + ", ".join(f"{n!r}: {r.expr(v)}" for n, v in p[1])
        + "}, "
        + (
            "None"
            if p[2] is None
            else "{" + ", ".join(f"{k!r}: {r.expr(v)}" for k, v in p[2]) + "}"
        )
        + ")"
    ),
    "function": _function,
    "call": lambda r, p: (
        f"{r.expr(p[0])}({''.join(f'{r.expr(a)}, ' for a in p[1])}"
        + "".join(f"{k}={r.expr(v)}, " for k, v in p[2])
        + ")"
    ),
    "iter": lambda r, parts: f"{PREFIX}B.iter([{r.items(parts)}])",  # what a loop has left
}


def _part_expr(part: Part, constants: list[Any], shared: set[int], names: dict[str, str]) -> str:
    """A Python expression that rebuilds ``part`` (see :class:`_Rebuild`)."""
    return _Rebuild(constants, shared, names).expr(part)


def _effect_lines(
    effects: list[tuple[Any, ...]], constants: list[Any], shared: set[int], names: dict[str, str]
) -> tuple[list[str], list[str]]:
    """Statements replaying the frame's side effects, in program order, in two phases.

    The first phase evaluates every object and value the effects need, the second
    performs the effects. Values are read before anything is mutated, so a value that is
    read from a container the frame mutates (``kwargs.pop("a")`` returned, or stored
    elsewhere) is the one the frame saw, however the effects are ordered.
    """

    def expr(part: Part) -> str:
        return _part_expr(part, constants, shared, names)

    reads: list[str] = []
    writes: list[str] = []
    for n, effect in enumerate(effects):
        kind, value = effect[0], f"{PREFIX}v{n}"
        if kind in ("setattr", "object_setattr"):  # (the latter past the class's __setattr__)
            _, source, name, part = effect
            setter = "setattr" if kind == "setattr" else "object.__setattr__"
            reads.append(f"{PREFIX}t{n} = {source_expr(source, names)}; {value} = {expr(part)}")
            writes.append(f"{PREFIX}B.{setter}({PREFIX}t{n}, {name!r}, {value})")
        elif kind == "global":
            reads.append(f"{value} = {expr(effect[2])}")
            writes.append(f"{PREFIX}G[{effect[1]!r}] = {value}")
        elif kind == "exit_block":  # a split autocast/inference-mode block's real exit
            reads.append(f"{PREFIX}t{n} = {source_expr(effect[1], names)}")
            writes.append(f"{PREFIX}t{n}(None, None, None)")
        elif kind == "grad_mode":  # the mode the frame left set (a backend may restore its own)
            writes.append(f"{_const_ref(constants, torch._C._set_grad_enabled)}({effect[1]!r})")
        elif kind == "cell":
            reads.append(f"{value} = {expr(effect[2])}")
            writes.append(f"{effect[1]} = {value}")
        elif kind == "list":
            items = ", ".join(expr(p) for p in effect[2])
            reads.append(f"{PREFIX}t{n} = {source_expr(effect[1], names)}; {value} = [{items}]")
            writes.append(f"{PREFIX}t{n}[:] = {value}")
        elif kind in ("dict", "dict_items"):
            items = ", ".join(f"{k!r}: {expr(p)}" for k, p in effect[2])
            reads.append(f"{PREFIX}t{n} = {source_expr(effect[1], names)}; {value} = {{{items}}}")
            if kind == "dict":
                writes.append(f"{PREFIX}t{n}.clear(); {PREFIX}t{n}.update({value})")
            else:  # a dict subclass's items, written with its base class's own methods
                writes.append(f"{_const_ref(constants, replace_items)}({PREFIX}t{n}, {value})")
        else:
            raise AssertionError(kind)
    return reads, writes


def _const_ref(constants: list[Any], obj: Any) -> str:
    constants.append(obj)
    return f"{PREFIX}c[{len(constants) - 1}]"


def switches_grad_mode(graph: torch.fx.Graph) -> bool:
    """Whether a captured graph switches grad mode (so a raise inside it must restore it).

    >>> switches_grad_mode(torch.fx.symbolic_trace(lambda x: x + 1).graph)
    False
    """
    return any(node.target is torch._C._set_grad_enabled for node in graph.nodes)


def _call_lines(call: str, restore_grad_mode: bool, constants: list[Any]) -> list[str]:
    """``o = call``; with the grad mode put back if the graph raises, when it switches it."""
    if not restore_grad_mode:
        return [f"{PREFIX}o = {call}"]
    # constants, not an import per call (2-3 us each)
    is_enabled = _const_ref(constants, torch._C.is_grad_enabled)
    set_enabled = _const_ref(constants, torch._C._set_grad_enabled)
    return [
        f"{PREFIX}m = {is_enabled}()",
        "try:",
        f"    {PREFIX}o = {call}",
        "except BaseException:",
        f"    {set_enabled}({PREFIX}m)",
        "    raise",
    ]


def _body_lines(call: list[str], reads: list[str], writes: list[str], result: str) -> list[str]:
    """Run the graph, read what the side effects store and the result, then mutate and
    return: the result is read before the frame's mutations are replayed, too."""
    if not writes:
        return [*call, *reads, f"return {result}"]
    return [*call, *reads, f"{PREFIX}r = {result}", *writes, f"return {PREFIX}r"]


def generate(
    code: types.CodeType,
    function: types.FunctionType,
    compiled: Callable[..., Any],
    input_sources: list[Any],
    output: Part,
    effects: list[tuple[Any, ...]] | None = None,
    restore_grad_mode: bool = False,
) -> Replacement:
    """The replacement for frames of ``code`` (as called through ``function``).

    It loads the graph inputs, runs the graph, replays the side effects
    (``effects``, see ``translate._effect_parts``) and returns ``output`` rebuilt.
    """
    names = {a: f"{PREFIX}a{i}" for i, a in enumerate(argument_names(code))}
    constants: list[Any] = []
    shared: set[int] = set()
    prefetch, inputs = _input_reads(list(input_sources), names)
    reads, writes = _effect_lines(effects or [], constants, shared, names)
    result = _part_expr(output, constants, shared, names)
    rebound = sorted({e[1] for e in effects or [] if e[0] == "cell"})
    freevars = code.co_freevars
    helpers = ["compiled", "unhooked", "G", "c", "B"]  # B: builtins, never shadowed
    params = ", ".join([*names.values(), *(f"{PREFIX}{h}" for h in helpers)])
    lines = [f"def {PREFIX}make():"]
    if freevars:
        lines.append(f"    {', '.join(freevars)} = {', '.join('None' for _ in freevars)}")
    lines.append(f"    def {PREFIX}fn({params}):")
    if rebound:  # nonlocal stores write the original closure cells
        lines.append(f"        nonlocal {', '.join(rebound)}")
    if freevars:  # names the same free variables as the original, in the same order
        lines.append(f"        if False: ({', '.join(freevars)},)")
    call = f"{PREFIX}unhooked({PREFIX}compiled{', ' if inputs else ''}{inputs})"
    call_lines = [*prefetch, *_call_lines(call, restore_grad_mode, constants)]
    body = _body_lines(call_lines, reads, writes, result)
    lines += [f"        {line}" for line in body]
    lines.append(f"    return {PREFIX}fn")
    text = "\n".join(lines) + "\n"
    namespace: dict[str, Any] = {}
    exec(compile(text, f"<ember replacement of {code.co_qualname}>", "exec"), {}, namespace)
    template = namespace[f"{PREFIX}make"]().__code__
    if template.co_freevars != freevars:
        raise AssertionError(f"free variables {template.co_freevars} != {freevars}")
    new_code = template.replace(
        co_name=code.co_name,
        co_qualname=code.co_qualname,
        co_filename=code.co_filename,
        co_firstlineno=code.co_firstlineno,
    )
    defaults = (
        compiled,
        _eval_frame.call_unhooked,
        function.__globals__,
        tuple(constants),
        builtins,
    )
    fn = types.FunctionType(
        new_code, function.__globals__, code.co_name, defaults, function.__closure__
    )
    return Replacement(fn, text)
