"""Float graph inputs: Python number functions in a graph, rewritten to symbolic ones.

ember's capture passes floats it reads at run time (``loss.item()``, ``x.tolist()``)
as graph inputs, and keeps arithmetic on them in the graph, including calls such
as ``max(xs)`` or ``math.sqrt(s)``. aotgraph traces those inputs as symbolic
floats; a builtin like ``max`` would compare them and so fix their values, so
:func:`symbolic_numbers` swaps each call for its ``torch.sym_*`` twin from
:data:`NUMBER_RULES`, which traces to a node instead. (``+``, ``*``, ``/``,
``abs``, ``-x`` are symbolic already.) A call with no rule still works: tracing
notices the fixed value and the function is compiled with its floats as
constants (:class:`~ember.aotgraph.trace.Specialized`).

>>> import math
>>> import torch
>>> graph = torch.fx.Graph()
>>> a, b = graph.placeholder("a"), graph.placeholder("b")
>>> _ = graph.output(graph.call_function(math.sqrt, (graph.call_function(max, (a, b)),)))
>>> gm = symbolic_numbers(torch.fx.GraphModule(torch.nn.Module(), graph))
>>> [n.target.__name__ for n in gm.graph.nodes if n.op == "call_function"]
['sym_max', 'sym_sqrt']
>>> gm(4.0, 9.0)
3.0
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

__all__ = ["NUMBER_RULES", "PLAIN_RULES", "plain_numbers", "symbolic_numbers"]


def sym_max(*args: Any) -> Any:
    """``max`` of numbers that may be symbolic.

    >>> sym_max(1.0, 3.0, 2.0)
    3.0
    """
    return functools.reduce(torch.sym_max, args[0] if len(args) == 1 else args)


def sym_min(*args: Any) -> Any:
    """``min`` of numbers that may be symbolic.

    >>> sym_min([1.0, 3.0, -2.0])
    -2.0
    """
    return functools.reduce(torch.sym_min, args[0] if len(args) == 1 else args)


def sym_sqrt(x: Any) -> Any:
    """``math.sqrt`` of a number that may be symbolic.

    >>> sym_sqrt(4.0)
    2.0
    """
    return torch.sym_sqrt(x) if isinstance(x, torch.SymFloat | torch.SymInt) else math.sqrt(x)


# Python function on numbers -> the same function on numbers that may be symbolic.
NUMBER_RULES: dict[Callable[..., Any], Callable[..., Any]] = {
    max: sym_max,
    min: sym_min,
    math.sqrt: sym_sqrt,
    float: torch.sym_float,
}


def plain_max(a: Any, b: Any) -> Any:
    """``torch.sym_max`` of plain numbers, without its dispatch checks (a traced graph runs
    with real floats; a chain of 63 ``sym_max`` calls took 0.3 ms per call).

    >>> plain_max(1, 2.5), plain_max(3, 2)
    (2.5, 3)
    """
    m = max(a, b)
    return float(m) if type(a) is float or type(b) is float else m


def plain_min(a: Any, b: Any) -> Any:
    """``torch.sym_min`` of plain numbers.

    >>> plain_min(1, 2.5), plain_min(3, 2)
    (1.0, 2)
    """
    m = min(a, b)
    return float(m) if type(a) is float or type(b) is float else m


# torch.sym_* function a traced graph calls -> its plain-number twin, for running it.
PLAIN_RULES: dict[Callable[..., Any], Callable[..., Any]] = {
    torch.sym_max: plain_max,
    torch.sym_min: plain_min,
    torch.sym_float: float,
}


def plain_numbers(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` with the ``torch.sym_*`` calls tracing left replaced by plain ones (in place)."""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in PLAIN_RULES:
            node.target = PLAIN_RULES[node.target]
            changed = True
    if changed:
        gm.recompile()
    return gm


def symbolic_numbers(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` itself, or a copy (sharing its parameters and submodules) whose number
    functions are the symbolic ones of :data:`NUMBER_RULES`."""
    targets = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in NUMBER_RULES]
    if not targets:
        return gm
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
        if node in targets:
            env[node].target = NUMBER_RULES[node.target]
    return torch.fx.GraphModule(gm, graph)
