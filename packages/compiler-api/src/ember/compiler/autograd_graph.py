"""The autograd graph as data, for compiled autograd: nodes, saved tensors, hooks, a key.

:func:`walk` goes from the roots of a ``backward()`` through ``grad_fn`` and
``next_functions`` into a deterministic node list and returns a :class:`Walk`:
the leaves (``AccumulateGrad`` variables), the non-leaves that asked for
``retain_grad()``, every saved tensor in node order, and a hashable ``key`` of
the graph's structure (node types, edges, saved sizes and numbers, hook code
objects, which saved tensors are one tensor). Two ``backward()`` calls with the
same key run the same aten ops on different values.

Autograd does not list a node's hooks in Python, so :func:`observe` wraps the
registration points (``Tensor.register_hook``, ``Tensor.retain_grad``, and
``register_hook``/``register_prehook`` of Python nodes, which module backward
hooks use) and remembers what was registered on which node.

>>> x = torch.ones(2, requires_grad=True)
>>> w = walk([(x * 3).sum()])  # the 3 is saved as a tensor: a graph input, not a constant
>>> [n.name() for n in w.nodes], len(w.leaves), len(w.saved), w.reason
(['SumBackward0', 'MulBackward0', 'torch::autograd::AccumulateGrad'], 1, 1, None)
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.function import BackwardCFunction

__all__ = ["Walk", "hook_code", "observe", "walk"]

Node = Any  # torch.autograd.graph.Node: C++ nodes are not Python classes mypy knows

# what a saved attribute may hold and still be a literal of the key (baked into the graph)
LITERALS = (
    int,
    float,
    bool,
    str,
    type(None),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)
# ctx attributes of ember's CompiledFunction that change every step and do not change the ops
VOLATILE_CTX = frozenset({"versions"})


class _Registry:
    """Hooks and retain_grad() requests per node, remembered at registration."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # C++ nodes cannot be weakly referenced: keyed by (name, sequence number); the values
        # are weak references (a hook dict dies with its node, a retained tensor with itself)
        self.tensor_hooks: dict[tuple[str, int], list[weakref.ref[Any]]] = {}
        self.retained: dict[tuple[str, int], list[weakref.ref[torch.Tensor]]] = {}
        self.node_hooks: weakref.WeakKeyDictionary[Any, list[Callable[..., Any]]] = (
            weakref.WeakKeyDictionary()
        )

    def add(self, table: dict[tuple[str, int], list[Any]], node: Node, ref: Any) -> None:
        key = (node.name(), node._sequence_nr())
        with self.lock:
            if len(table) > 4096:  # forget entries whose node (or tensor) died
                for k in [k for k, refs in table.items() if all(r() is None for r in refs)]:
                    del table[k]
            refs = table.setdefault(key, [])
            if not any(r() is ref() for r in refs):
                refs.append(ref)

    def hook_dicts(self, key: tuple[str, int]) -> list[dict[Any, Callable[..., Any]]]:
        refs = self.tensor_hooks.get(key, ()) if self.tensor_hooks else ()
        return [d for d in (r() for r in refs) if d]

    def retained_of(self, node: Node, key: tuple[str, int]) -> list[torch.Tensor]:
        refs = self.retained.get(key, ()) if self.retained else ()
        found = [t for t in (r() for r in refs) if t is not None]
        return [t for t in found if t.grad_fn is node and t.retains_grad]


REGISTRY = _Registry()
_observing: list[bool] = []  # observe() ran (ember.compiler imports this module and calls it)


def observe() -> None:
    """Start remembering hooks and ``retain_grad()`` calls (once per process; idempotent).

    >>> observe(); observe()
    """
    if _observing:
        return
    _observing.append(True)
    register_hook = torch.Tensor.register_hook
    retain_grad = torch.Tensor.retain_grad

    @functools.wraps(register_hook)
    def watched_register_hook(self: torch.Tensor, hook: Callable[..., Any]) -> Any:
        handle = register_hook(self, hook)  # type: ignore[no-untyped-call]
        if self.grad_fn is not None and self._backward_hooks is not None:
            REGISTRY.add(REGISTRY.tensor_hooks, self.grad_fn, weakref.ref(self._backward_hooks))
        return handle

    @functools.wraps(retain_grad)
    def watched_retain_grad(self: torch.Tensor) -> None:
        retain_grad(self)
        if self.grad_fn is not None:
            REGISTRY.add(REGISTRY.retained, self.grad_fn, weakref.ref(self))

    torch.Tensor.register_hook = watched_register_hook  # type: ignore[method-assign]
    torch.Tensor.retain_grad = watched_retain_grad  # type: ignore[method-assign,assignment]
    for name in ("register_hook", "register_prehook"):
        setattr(BackwardCFunction, name, _node_registration(getattr(BackwardCFunction, name)))


def _node_registration(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def register(self: Any, fn: Callable[..., Any]) -> Any:
        handle = original(self, fn)
        REGISTRY.node_hooks.setdefault(self, []).append(fn)
        return handle

    return register


def hook_code(fn: Any, depth: int = 0) -> Any:
    """What identifies a hook in the key: its code object, the numbers and strings its
    closure holds (baked into the recorded ops), the hooks its closure calls (a module's
    ``BackwardHook`` keeps them in ``user_hooks``): a new lambda each step is the same hook.

    >>> def scaled(s): return lambda g: g * s
    >>> hook_code(scaled(2)) == hook_code(scaled(2)), hook_code(scaled(2)) == hook_code(scaled(3))
    (True, False)
    """
    code = getattr(fn, "__code__", None)
    inner: list[Any] = []
    cells = getattr(fn, "__closure__", None) or () if depth < 4 else ()  # (self-reference)
    for cell in cells:
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        inner.append(_closure_value(value, depth + 1))
    return (code if code is not None else type(fn), tuple(inner))


def _closure_value(value: Any, depth: int) -> Any:
    if isinstance(value, LITERALS):
        return (type(value).__name__, value)
    if callable(value) and hasattr(value, "__code__"):
        return hook_code(value, depth)
    hooks = [
        hook_code(h, depth)
        for attr in ("user_hooks", "user_pre_hooks")  # torch.utils.hooks.BackwardHook
        for h in getattr(value, attr, None) or ()
    ]
    return (type(value).__name__, tuple(hooks))


@dataclass(frozen=True, slots=True)
class Walk:
    """One autograd graph, ready to key, record or feed a compiled graph."""

    nodes: tuple[Node, ...]  # depth-first from the roots, each node once
    roots: tuple[torch.Tensor, ...]
    leaves: tuple[torch.Tensor, ...]  # the AccumulateGrad variables, in node order
    retained: tuple[torch.Tensor, ...]  # non-leaves whose .grad retain_grad() asked for
    saved: tuple[torch.Tensor, ...]  # every saved tensor, in node order
    holders: tuple[int, ...]  # nodes that hold saved tensors (eager frees them after backward)
    # ember AOT nodes whose backward is compiled code: (Runtime, its aten FX backward graph)
    aot: tuple[tuple[Any, torch.fx.GraphModule], ...]
    hooks: tuple[dict[Any, Callable[..., Any]], ...]  # tensor hook dicts (to watch)
    key: tuple[Any, ...]
    reason: str | None  # why this graph is run by the eager engine; None: it can compile


def walk(roots: Sequence[torch.Tensor]) -> Walk:
    """The graph behind ``roots`` (tensors with a ``grad_fn``) as a :class:`Walk`."""
    nodes, nexts = _order(r.grad_fn for r in roots)
    index = {id(n): i for i, n in enumerate(nodes)}
    parts = _Parts()
    for n, following in zip(nodes, nexts, strict=True):
        parts.describe(n, following, index)
    root_key = tuple((index[id(r.grad_fn)], r.output_nr, tuple(r.shape), r.dtype) for r in roots)
    aliases = _aliasing(parts.saved)
    key = (root_key, tuple(parts.entries), aliases)
    return Walk(
        nodes=tuple(nodes),
        roots=tuple(roots),
        leaves=tuple(parts.leaves),
        retained=tuple(parts.retained),
        saved=tuple(parts.saved),
        holders=tuple(parts.holders),
        aot=tuple(parts.aot),
        hooks=tuple(parts.hooks),
        key=key,
        reason=parts.reason,
    )


def _order(starts: Iterable[Node]) -> tuple[list[Node], list[Any]]:
    """Depth-first preorder over ``next_functions`` (and each node's ``next_functions``,
    read once: each read builds new tuples); the list keeps every node object alive, so
    ``id`` is a stable name for the walk's duration."""
    order: list[Node] = []
    nexts: list[Any] = []
    seen: set[int] = set()
    stack = list(reversed([s for s in starts if s is not None]))
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        order.append(n)
        following = n.next_functions
        nexts.append(following)
        stack.extend(reversed([c for c, _ in following if c is not None]))
    return order, nexts


class _Parts:
    """What :func:`walk` collects node by node."""

    def __init__(self) -> None:
        self.entries: list[tuple[Any, ...]] = []
        self.leaves: list[torch.Tensor] = []
        self.retained: list[torch.Tensor] = []
        self.saved: list[torch.Tensor] = []
        self.holders: list[int] = []
        self.aot: list[tuple[Any, Any]] = []
        self.hooks: list[dict[Any, Callable[..., Any]]] = []
        self.reason: str | None = None

    def refuse(self, reason: str) -> None:
        self.reason = self.reason or reason

    def describe(self, n: Node, following: Any, index: dict[int, int]) -> None:
        edges = tuple((index[id(c)] if c is not None else -1, k) for c, k in following)
        name = n.name()
        if name == "torch::autograd::AccumulateGrad":
            self.entries.append((name, self._leaf(n.variable)))
            return
        key = (name, n._sequence_nr())
        dicts = REGISTRY.hook_dicts(key)
        self.hooks.extend(dicts)
        hooks = tuple(hook_code(h) for d in dicts for h in d.values())
        if isinstance(n, BackwardCFunction):  # Python nodes: weakly referenced, hooks seen
            hooks += tuple(hook_code(h) for h in REGISTRY.node_hooks.get(n, ()))
        retained = REGISTRY.retained_of(n, key)
        self.retained.extend(retained)
        kept = tuple(t.output_nr for t in retained)
        before = len(self.saved)
        try:
            body = self._python(n) if isinstance(n, BackwardCFunction) else self._cpp(n)
        except RuntimeError as e:  # saved values freed: the eager engine raises its error
            self.refuse(f"saved values of {name} are gone ({str(e).splitlines()[0]})")
            body = ()
        if len(self.saved) > before:
            self.holders.append(len(self.entries))
        self.entries.append((name, edges, hooks, kept, body))

    def _leaf(self, v: torch.Tensor) -> tuple[Any, ...]:
        self.leaves.append(v)
        if v._post_accumulate_grad_hooks:
            self.refuse("a leaf has a post-accumulate-grad hook (a side effect after .grad)")
        if v.is_sparse or v.layout != torch.strided:
            self.refuse("a leaf is not a strided tensor (sparse gradients)")
        hooks = v._backward_hooks or {}
        if hooks:
            self.hooks.append(hooks)
        codes = tuple(hook_code(h) for h in hooks.values())
        return (_meta(v), codes)

    def _cpp(self, n: Node) -> tuple[Any, ...]:
        return tuple((attr, self._value(getattr(n, attr))) for attr in _saved_attrs(type(n)))

    def _python(self, n: Node) -> tuple[Any, ...]:
        from ember.aotgraph.runtime import CompiledFunction  # where an AOT node is met

        cls = n._forward_cls
        ctx = {k: v for k, v in vars(n).items() if k not in VOLATILE_CTX}
        if "versions" in vars(n) and cls is CompiledFunction:  # its own in-place check
            now = [0 if t.is_inference() else t._version for t in n.saved_tensors]
            if now != list(n.versions):
                self.refuse("a tensor saved by an ember AOT node was written in place since")
        if cls is CompiledFunction:
            rt = ctx.pop("runtime")
            if not isinstance(rt.backward, torch.fx.GraphModule):
                graph = fx_backward(rt)
                if graph is None:
                    self.refuse(
                        "an ember AOT node's backward is compiled code without its FX graph: "
                        "its kernels do not run as aten ops the recorder can see"
                    )
                if graph is not None and all(r is not rt for r, _ in self.aot):
                    self.aot.append((rt, graph))
            ctx["runtime"] = id(rt)
        values = tuple((k, self._value(ctx[k])) for k in sorted(ctx))
        saved = tuple(self._value(t) for t in n.saved_tensors)
        return (cls, tuple(n.needs_input_grad), values, saved)

    def _value(self, v: Any) -> Any:
        """``v`` as a key entry; tensors are remembered as saved values (graph inputs)."""
        if type(v) in _PLAIN:  # the common case first: sizes, dims, flags
            return v
        if type(v) is tuple and all(type(x) is int for x in v):
            return v
        if isinstance(v, torch.Tensor):
            self.saved.append(v)
            if v.layout != torch.strided:
                self.refuse("a saved tensor is not strided (sparse)")
            return _meta(v)
        if isinstance(v, tuple | list):
            return (type(v).__name__, tuple(self._value(x) for x in v))
        if isinstance(v, dict):
            return ("dict", tuple((k, self._value(x)) for k, x in v.items()))
        if isinstance(v, LITERALS):
            return (type(v).__name__, v)
        if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
            return (type(v).__name__, str(v))
        self.refuse(f"a saved value is a {type(v).__name__}, not a tensor or number")
        return ("object", id(v))


def fx_backward(rt: Any) -> torch.fx.GraphModule | None:
    """The aten-level FX graph behind a Runtime's compiled backward (the inductor backend
    keeps it as ``.gm``; aotgraph keeps ``backward_graph`` for some), or None."""
    for graph in (getattr(rt.backward, "gm", None), rt.backward_fx()):
        if isinstance(graph, torch.fx.GraphModule):
            return graph
    return None


_PLAIN = frozenset({int, bool, str, type(None)})  # hash and compare without mixing up 1 and 1.0


def _meta(t: torch.Tensor) -> tuple[Any, ...]:
    return (tuple(t.shape), t.stride(), t.dtype, t.device.type, t.requires_grad)


_SAVED_ATTRS: dict[type, tuple[str, ...]] = {}


def _saved_attrs(cls: type) -> tuple[str, ...]:
    found = _SAVED_ATTRS.get(cls)
    if found is None:
        found = _SAVED_ATTRS[cls] = tuple(sorted(a for a in dir(cls) if a.startswith("_saved_")))
    return found


def storage_key(t: torch.Tensor) -> tuple[Any, ...]:
    """Where ``t``'s values live: equal for two tensor objects over the same data (a saved
    output unpacks to a new object each time).

    >>> x = torch.ones(3)
    >>> storage_key(x) == storage_key(x.detach()), storage_key(x) == storage_key(x[1:])
    (True, False)
    """
    return (
        t.untyped_storage().data_ptr(),
        t.storage_offset(),
        tuple(t.shape),
        t.stride(),
        t.dtype,
        t.device,
    )


def _aliasing(saved: Sequence[torch.Tensor]) -> tuple[int, ...]:
    """For each saved tensor, the first saved tensor over the same data: the graph reads one
    input where they coincide, so a later graph with other aliasing must not reuse it."""
    first: dict[tuple[Any, ...], int] = {}
    return tuple(first.setdefault(storage_key(t), i) for i, t in enumerate(saved))
