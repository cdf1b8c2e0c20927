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
#   ("object", (cls, [(name, part)]))  an instance made inside the frame, attributes set
#   ("function", (code, globals, [defaults], [(k, kwdefault)], [cell content | None]))
#                          a function made inside the frame (a comprehension at a break),
#                          with new cells holding the contents its closure had
Part = tuple[str, Any]

_UNBOUND = object()  # an empty closure cell


def make_object(cls: type, attributes: dict[str, Any]) -> Any:
    """An instance of ``cls`` made in compiled code, with its attributes (no ``__init__``).

    >>> class P: pass
    >>> make_object(P, {"a": 1}).a
    1
    """
    obj: Any = object.__new__(cls)
    obj.__dict__.update(attributes)
    return obj


def make_namedtuple(cls: type[tuple[Any, ...]], *items: Any) -> tuple[Any, ...]:
    """``cls(*items)`` for a namedtuple class, without running its ``__new__`` in Python
    (which the hook would then compile as a frame of its own).

    >>> import collections
    >>> make_namedtuple(collections.namedtuple("P", "a b"), 1, 2)
    P(a=1, b=2)
    """
    return tuple.__new__(cls, items)


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


def source_expr(source: Any, names: dict[str, str] | None = None) -> str:
    """A Python expression that reaches ``source`` inside the generated function.

    The generated function's parameters are renamed (``names``): a frame's local may
    be named anything, e.g. pytest's assertion rewriting makes locals like "@py_assert1".
    """
    mapping = names if names is not None else {}
    return guarding.source_expression(
        source, globals_name=PREFIX + "G", local=lambda n: mapping.get(n, n)
    )


def _literal(value: Any) -> bool:
    if type(value) in (int, bool, str, type(None)):
        return True
    return type(value) is float and math.isfinite(value)


def _part_expr(part: Part, constants: list[Any], shared: set[int], names: dict[str, str]) -> str:
    """A Python expression that rebuilds ``part``.

    Constants that are not literals are appended to ``constants``; a "shared" part (a
    list or dict several names refer to) is built once, bound with ``:=``, and
    referred to by name afterwards (``shared`` holds the ones already built);
    ``names`` maps the frame's argument names to the generated parameters.
    """
    kind, payload = part

    def sub(p: Part) -> str:
        return _part_expr(p, constants, shared, names)

    if kind == "shared":
        ref, inner = payload
        name = f"{PREFIX}h{ref}"
        if ref in shared:
            return name
        shared.add(ref)
        return f"({name} := {sub(inner)})"
    if kind == "out":
        return f"{PREFIX}o[{payload}]"
    if kind == "const":
        if _literal(payload):
            return repr(payload)
        constants.append(payload)
        return f"{PREFIX}c[{len(constants) - 1}]"
    if kind == "source":
        return source_expr(payload, names)
    if kind in ("tuple", "list"):
        inner = ", ".join(sub(p) for p in payload)
        if kind == "tuple":
            return f"({inner},)" if len(payload) == 1 else f"({inner})"
        return f"[{inner}]"
    if kind == "dict":
        return "{" + ", ".join(f"{k!r}: {sub(p)}" for k, p in payload) + "}"
    if kind == "attr":  # a bound method: getattr(object, name)
        base, name = payload
        return f"{PREFIX}B.getattr({sub(base)}, {name!r})"
    if kind == "new":  # an object made again on every run: cls(*args)
        cls, args = payload
        constants.append(cls)
        return f"{PREFIX}c[{len(constants) - 1}]({', '.join(sub(p) for p in args)})"
    if kind == "object":
        cls, attributes = payload
        constants.extend([make_object, cls])
        k = len(constants) - 2
        items = ", ".join(f"{n!r}: {sub(p)}" for n, p in attributes)
        return f"{PREFIX}c[{k}]({PREFIX}c[{k + 1}], {{{items}}})"
    if kind == "function":
        code, globals_, defaults, kwdefaults, contents = payload
        constants.extend([make_function, code, globals_, _UNBOUND])
        k = len(constants) - 4
        cells = [f"{PREFIX}c[{k + 3}]" if p is None else sub(p) for p in contents]
        return (
            f"{PREFIX}c[{k}]({PREFIX}c[{k + 1}], {PREFIX}c[{k + 2}], "
            f"({''.join(sub(p) + ', ' for p in defaults)}), "
            f"{{{', '.join(f'{n!r}: {sub(p)}' for n, p in kwdefaults)}}}, "
            f"({''.join(c + ', ' for c in cells)}))"
        )
    if kind == "iter":  # an iterator over the remaining items of a static sequence
        return f"{PREFIX}B.iter([{', '.join(sub(p) for p in payload)}])"
    raise AssertionError(kind)


def _effect_lines(
    effects: list[tuple[Any, ...]], constants: list[Any], shared: set[int], names: dict[str, str]
) -> list[str]:
    """Statements replaying the frame's side effects, in program order."""

    def expr(part: Part) -> str:
        return _part_expr(part, constants, shared, names)

    lines = []
    for effect in effects:
        kind = effect[0]
        if kind == "setattr":
            _, source, name, value = effect
            lines.append(
                f"{PREFIX}B.setattr({source_expr(source, names)}, {name!r}, {expr(value)})"
            )
        elif kind == "global":
            lines.append(f"{PREFIX}G[{effect[1]!r}] = {expr(effect[2])}")
        elif kind == "cell":
            lines.append(f"{effect[1]} = {expr(effect[2])}")
        elif kind == "list":
            items = ", ".join(expr(p) for p in effect[2])
            lines.append(f"{source_expr(effect[1], names)}[:] = [{items}]")
        elif kind == "dict":
            target = source_expr(effect[1], names)
            items = ", ".join(f"{k!r}: {expr(p)}" for k, p in effect[2])
            lines.append(f"{PREFIX}d = {target}; {PREFIX}d.clear(); {PREFIX}d.update({{{items}}})")
        else:
            raise AssertionError(kind)
    return lines


def switches_grad_mode(graph: torch.fx.Graph) -> bool:
    """Whether a captured graph switches grad mode (so a raise inside it must restore it).

    >>> switches_grad_mode(torch.fx.symbolic_trace(lambda x: x + 1).graph)
    False
    """
    return any(node.target is torch._C._set_grad_enabled for node in graph.nodes)


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
    inputs = ", ".join(source_expr(s, names) for s in input_sources)
    replay = _effect_lines(effects or [], constants, shared, names)
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
    if restore_grad_mode:  # a graph that raises must not leave the mode switched
        lines.append(f"        {PREFIX}m = {PREFIX}B.__import__('torch').is_grad_enabled()")
        lines.append("        try:")
        lines.append(f"            {PREFIX}o = {call}")
        lines.append("        except BaseException:")
        lines.append(f"            {PREFIX}B.__import__('torch')._C._set_grad_enabled({PREFIX}m)")
        lines.append("            raise")
    else:
        lines.append(f"        {PREFIX}o = {call}")
    lines += [f"        {line}" for line in replay]
    lines.append(f"        return {result}")
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
