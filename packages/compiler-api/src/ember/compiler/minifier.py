"""Delta debugging over an fx graph's nodes: the smallest graph that still fails the same way.

A candidate keeps some of the graph's operations; every value a kept operation reads from
an operation it dropped becomes a graph input, fed with the value the whole graph computed
there. A candidate *fails the same way* when eager runs it and the compiler under test
raises the same exception type (``Check("raises", error)``) or returns a result beyond
:data:`ember.compiler.testing.TOLERANCES` from eager's (``Check("accuracy")``).

>>> import torch
>>> def f(x):
...     return torch.relu(x.sin() * 2).cos()
>>> gm = torch.fx.symbolic_trace(f)
>>> def no_relu(gm, inputs):
...     if any(n.target is torch.relu for n in gm.graph.nodes):
...         raise RuntimeError("relu")
...     return gm
>>> small = minify(gm, [torch.randn(4)], Check("raises", RuntimeError), no_relu)
>>> [n.op for n in small.gm.graph.nodes], small.tests <= 12
(['placeholder', 'call_function', 'output'], True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from ember.compiler.testing import assert_same

Compiler = Callable[[torch.fx.GraphModule, list[Any]], Callable[..., Any]]

CALLS = frozenset({"call_function", "call_method", "call_module"})  # the nodes dropped or kept
MAX_TESTS = 400  # compiles one minification may try; it stops with what it has then


@dataclass(frozen=True, slots=True)
class Check:
    """How the graph fails: ``kind`` is ``"raises"`` (with the exception type) or
    ``"accuracy"`` (the compiled result differs from eager beyond tolerance).

    >>> Check("raises", KeyError).describe()
    'raises KeyError'
    """

    kind: str
    error: type[BaseException] | None = None

    def describe(self) -> str:
        if self.kind == "raises":
            return f"raises {getattr(self.error, '__name__', self.error)}"
        return "differs from eager beyond tolerance"


@dataclass(frozen=True, slots=True)
class Minified:
    """The smallest failing graph found, its inputs, and how many candidates were tried."""

    gm: torch.fx.GraphModule
    args: list[Any]
    tests: int
    fails: bool  # whether the graph fails (False: the failure did not reproduce at all)


class _Invalid(Exception):
    """A candidate that cannot be built (a dropped value that is no graph input)."""


def node_values(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> dict[str, Any]:
    """The value of every node when ``gm`` runs eagerly on ``inputs`` (by node name)."""
    values: dict[str, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            values[n.name] = out = super().run_node(n)
            return out

    Recorder(gm).run(*_clones(inputs))  # with grad: values keep their requires_grad
    return values


def subgraph(
    gm: torch.fx.GraphModule, keep: set[str], values: dict[str, Any]
) -> tuple[torch.fx.GraphModule, list[Any]]:
    """The graph of the ``keep`` operations (in order), its inputs, and their values.

    Outputs are the kept operations no kept operation reads. Constants (``get_attr``)
    become inputs too, so the graph needs no module attributes.
    """
    kept = [n for n in gm.graph.nodes if n.op in CALLS and n.name in keep]
    needed: dict[str, torch.fx.Node] = {}
    for n in kept:
        for arg in n.all_input_nodes:
            if arg.name not in keep:
                needed.setdefault(arg.name, arg)
    graph, env, args = torch.fx.Graph(), {}, []
    for name in needed:
        if not _is_input(value := values[name]):
            raise _Invalid(f"{name} is a {type(value).__name__}")
        env[name] = graph.placeholder(name)
        args.append(value)
    for n in kept:
        env[n.name] = graph.node_copy(n, lambda a: env[a.name])
    read = {a.name for n in kept for a in n.all_input_nodes}
    graph.output(tuple(env[n.name] for n in kept if n.name not in read))
    return torch.fx.GraphModule(gm, graph), args


def _is_input(value: Any) -> bool:
    return isinstance(value, torch.Tensor | int | float | bool) or value is None


def _clones(args: Sequence[Any]) -> list[Any]:
    """Fresh copies of tensor arguments (a graph may write to its inputs)."""
    return [
        a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
        for a in args
    ]


def _as_list(result: Any) -> list[Any]:
    return list(result) if isinstance(result, tuple | list) else [result]


def differs(got: Any, want: Any) -> str:
    """What makes ``got`` differ from ``want`` beyond tolerance, or ``""``.

    >>> differs([torch.ones(2)], [torch.ones(2) * 1.01])[:22]
    'Tensor-likes are not c'
    """
    try:
        assert_same(_as_list(got), _as_list(want))
    except AssertionError as e:
        return str(e).strip() or "results differ"
    return ""


def fails_as(check: Check, compiler: Compiler, gm: torch.fx.GraphModule, args: list[Any]) -> bool:
    """Whether ``compiler`` fails on ``gm`` with ``args`` the way ``check`` says (and eager
    runs it)."""
    with torch.random.fork_rng():
        try:
            torch.manual_seed(0)
            want = gm(*_clones(args))
        except Exception:
            return False  # a broken candidate, not a repro
        try:
            torch.manual_seed(0)
            got = compiler(gm, _clones(args))(*_clones(args))
        except Exception as e:
            return check.kind == "raises" and type(e) is check.error
    return check.kind == "accuracy" and bool(differs(got, want))


def ddmin(items: list[str], test: Callable[[list[str]], bool]) -> list[str]:
    """Zeller's delta debugging: a 1-minimal sublist of ``items`` (order kept) that
    passes ``test``, which ``items`` itself passes.

    >>> ddmin(list("abcdefgh"), lambda s: "c" in s and "f" in s)
    ['c', 'f']
    """
    n = 2
    while len(items) >= 2:
        size = -(-len(items) // n)
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        for chunk in chunks:
            if test(chunk):
                items, n = chunk, 2
                break
        else:
            for chunk in chunks:
                rest = [x for x in items if x not in chunk]
                if len(chunks) > 2 and test(rest):
                    items, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(items):
                    break
                n = min(2 * n, len(items))
    return items


def minify(
    gm: torch.fx.GraphModule,
    inputs: Sequence[Any],
    check: Check,
    compiler: Compiler,
    max_tests: int = MAX_TESTS,
) -> Minified:
    """Shrink ``gm`` to the fewest operations that still fail ``check`` under ``compiler``."""
    values = node_values(gm, inputs)
    tried: dict[tuple[str, ...], bool] = {}

    def test(keep: list[str]) -> bool:
        key = tuple(keep)
        if key not in tried:
            if len(tried) >= max_tests:
                return False
            try:
                sub, args = subgraph(gm, set(keep), values)
            except _Invalid:
                tried[key] = False
            else:
                tried[key] = fails_as(check, compiler, sub, args)
        return tried[key]

    names = [n.name for n in gm.graph.nodes if n.op in CALLS]
    fails = test(names)
    keep = ddmin(names, test) if fails else names
    sub, args = subgraph(gm, set(keep), values)
    return Minified(sub, args, len(tried), fails)
