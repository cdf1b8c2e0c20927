"""Record one real backward pass as an FX graph of aten ops, for compiled autograd.

:func:`record` runs ``torch.autograd.grad`` over a :class:`~.autograd_graph.Walk`
under a ``TorchDispatchMode``. The engine runs CPU work on the calling thread,
which keeps the mode, so every aten op of the backward formulas, of ember's AOT
backward graphs (``aot_eager``) and of Python hooks reaches the mode, runs for
real, and becomes a node. A tensor an op reads that the recording did not make
is a graph input when it is a saved tensor or a root gradient (found by object,
else by storage: a saved output unpacks to a new object over the same data);
anything else (a hook's closure, a kernel the mode cannot see) refuses the
recording with a reason. The pass's values are the real gradients either way.

>>> from ember.compiler.autograd_graph import walk
>>> x = torch.ones(2, requires_grad=True)
>>> y = (x.exp() * 3).sum()
>>> rec = record(walk([y]), [torch.ones(())], retain_graph=False)
>>> rec.refusal, [s.kind for s in rec.inputs], rec.values[0]
(None, ['grad', 'saved'], tensor([8.1548, 8.1548]))
"""

from __future__ import annotations

import operator
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.autograd.function import BackwardCFunction
from torch.autograd.graph import _engine_run_backward
from torch.utils._python_dispatch import TorchDispatchMode

from ember.compiler.autograd_graph import REGISTRY, Walk, storage_key

__all__ = ["Recording", "Source", "record"]


@dataclass(frozen=True, slots=True)
class Source:
    """Where a graph input comes from on each backward: root gradient or saved tensor."""

    kind: str  # "grad" (index into the root gradients) or "saved" (into Walk.saved)
    index: int


@dataclass(frozen=True, slots=True)
class Recording:
    """One recorded backward: its real results, and the graph when one could be made."""

    values: tuple[torch.Tensor | None, ...]  # gradients of Walk.leaves + Walk.retained
    graph: torch.fx.GraphModule | None
    inputs: tuple[Source, ...]  # the graph's placeholders, in order
    examples: tuple[torch.Tensor, ...]  # this pass's values of those inputs
    outputs: tuple[int, ...]  # per value: its position among the graph outputs, -1 for None
    refusal: str | None  # why no graph: the eager engine runs this structure


aten = torch.ops.aten
# ops whose result (a Python number, or an output size) depends on tensor data: what follows
# them is recorded with this pass's value baked in
DATA_DEPENDENT = frozenset(
    {
        aten._local_scalar_dense,
        aten.equal,
        aten.is_nonzero,
        aten.nonzero,
        aten.masked_select,
        aten._unique2,
        aten.unique_dim,
        aten.unique_consecutive,
    }
)


class Refused(Exception):
    """The recording cannot become a graph (the message says why)."""


class Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Runs each aten op and appends it to ``graph``, reading tensors as graph values."""

    def __init__(self, by_object: dict[int, Source], by_storage: dict[Any, Source]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.graph = torch.fx.Graph()
        self.by_object, self.by_storage = by_object, by_storage
        self.env: dict[int, torch.fx.Node] = {}  # id(tensor) -> node making its value
        self.keep: list[Any] = []  # keeps those tensors alive, so an id names one tensor
        self.placeholders: dict[Source, torch.fx.Node] = {}
        self.examples: list[torch.Tensor] = []
        self.refusal: str | None = None

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.refusal is None:
            try:
                self._record(func, args, kwargs, out)
            except Refused as e:
                self.refusal = str(e)
        return out

    def refuse(self, reason: str) -> None:
        self.refusal = self.refusal or reason

    def _record(self, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        if func.overloadpacket in DATA_DEPENDENT:
            raise Refused(
                f"{func} makes a value or a size from a tensor's data (a hook's .item()?): "
                "the recorded graph would keep this pass's value"
            )
        schema = func._schema
        for k, arg in enumerate(schema.arguments):
            value = args[k] if k < len(args) else kwargs.get(arg.name)
            written = arg.alias_info is not None and arg.alias_info.is_write
            made = self.env.get(id(value)) if isinstance(value, torch.Tensor) else None
            if written and value is not None and (made is None or made.op == "placeholder"):
                raise Refused(f"{func} writes in place into a tensor the backward did not make")
        node_args, node_kwargs = pytree.tree_map(self._read, (args, kwargs))
        node = self.graph.call_function(func, tuple(node_args), node_kwargs)
        if isinstance(out, torch.Tensor):
            self._bind(out, node)
        elif isinstance(out, tuple | list):
            for k, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    self._bind(o, self.graph.call_function(operator.getitem, (node, k)))

    def _bind(self, t: torch.Tensor, node: torch.fx.Node) -> None:
        self.env[id(t)] = node
        self.keep.append(t)

    def _read(self, v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            return v
        node = self.env.get(id(v))
        if node is not None:
            return node
        source = self.by_object.get(id(v)) or self.by_storage.get(storage_key(v))
        if source is None:
            raise Refused(
                f"the backward reads a tensor of shape {list(v.shape)} that is neither saved "
                "by the autograd graph nor made by the backward (a hook's closure, or a "
                "kernel the recorder cannot see)"
            )
        found = self.placeholders.get(source)
        if found is None:  # placeholders first: inserted before the first op
            name = f"{source.kind}_{source.index}"
            first = next((n for n in self.graph.nodes if n.op != "placeholder"), None)
            if first is None:
                found = self.graph.placeholder(name)
            else:
                with self.graph.inserting_before(first):
                    found = self.graph.placeholder(name)
            self.placeholders[source] = found
            self.examples.append(v)
        self._bind(v, found)
        return found


class _Watch:
    """A tensor hook during the recording: a hook that returns None runs for a side effect
    (logging, storing the gradient), which replaying its ops would not repeat."""

    def __init__(self, fn: Callable[..., Any], rec: Recorder) -> None:
        self.fn, self.rec = fn, rec

    def __call__(self, *args: Any) -> Any:
        out = self.fn(*args)
        if out is None:
            name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
            self.rec.refuse(
                f"tensor hook {name} returned None: it runs for a side effect, which a "
                "compiled graph would not repeat"
            )
        return out


class _Traced:
    """Stands for a Runtime's compiled backward during a recording: runs its FX graph."""

    def __init__(self, graph: torch.fx.GraphModule, compiled: Callable[..., Any]) -> None:
        self.graph, self.compiled = graph, compiled

    def __call__(self, *args: Any) -> Any:
        return self.graph(*args)


# torch's own Python that the engine reaches (the Python dispatcher, hook wrappers) and ember's
_LIBRARIES = tuple(
    os.path.dirname(m.__file__ or "") + os.sep for m in (torch, sys.modules["ember.compiler"])
)


class _Unseen:
    """A profile function for the recording: the engine calls Python only for hooks and
    Python nodes; one the key does not know (a hook registered straight on a C++ node, or
    before ``ember.compiler`` was imported) refuses the recording: a hit would skip it."""

    ENGINE = _engine_run_backward.__code__

    def __init__(self, w: Walk, rec: Recorder) -> None:
        known: set[Any] = {_Watch.__call__.__code__, BackwardCFunction.apply.__code__}
        for n in w.nodes:
            if isinstance(n, BackwardCFunction):
                known.update(getattr(h, "__code__", None) for h in REGISTRY.node_hooks.get(n, ()))
        self.known, self.rec, self.outer = known, rec, sys.getprofile()
        self.inside = False  # in the engine's C++ run_backward: its Python calls are hooks

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if self.outer is not None:
            self.outer(frame, event, arg)  # type: ignore[arg-type]
        if event.startswith("c_"):
            if frame.f_code is self.ENGINE and getattr(arg, "__name__", "") == "run_backward":
                self.inside = event == "c_call"
            return
        back = frame.f_back
        if event == "call" and self.inside and back is not None and back.f_code is self.ENGINE:
            code = frame.f_code
            if code not in self.known and not code.co_filename.startswith(_LIBRARIES):
                self.rec.refuse(
                    f"the engine called {frame.f_code.co_name} ({frame.f_code.co_filename}), a "
                    "hook ember did not see registered (on a C++ node, or before import)"
                )


def record(w: Walk, grads: Sequence[torch.Tensor], retain_graph: bool) -> Recording:
    """Run the backward of ``w`` for real (roots' gradients ``grads``) while recording it."""
    by_object: dict[int, Source] = {}
    by_storage: dict[Any, Source] = {}
    for kind, tensors in (("grad", grads), ("saved", w.saved)):
        for i, t in enumerate(tensors):
            by_object.setdefault(id(t), Source(kind, i))
            by_storage.setdefault(storage_key(t), Source(kind, i))
    rec = Recorder(by_object, by_storage)
    wanted = (*w.leaves, *w.retained)
    for d in w.hooks:
        for k, fn in d.items():
            d[k] = _Watch(fn, rec)
    for rt, graph in w.aot:  # ember's compiled backward: its aten graph runs, recorded
        object.__setattr__(rt, "backward", _Traced(graph, rt.backward))
    old_grads = [t.grad for t in w.retained]
    for t in w.retained:  # retain_grad's own hook sets .grad: the caller accumulates instead
        t.grad = None
    unseen = _Unseen(w, rec)
    sys.setprofile(unseen)
    try:
        with rec:
            values = torch.autograd.grad(
                w.roots, wanted, grads, retain_graph=retain_graph, allow_unused=True
            )
    finally:
        sys.setprofile(unseen.outer)
        for rt, _ in w.aot:
            object.__setattr__(rt, "backward", rt.backward.compiled)
        for d in w.hooks:  # (a hook may have removed itself meanwhile)
            for k, fn in d.items():
                if isinstance(fn, _Watch):
                    d[k] = fn.fn
        for t, g in zip(w.retained, old_grads, strict=True):
            t.grad = g
    return _finish(rec, tuple(values))


def _finish(rec: Recorder, values: tuple[torch.Tensor | None, ...]) -> Recording:
    outputs: list[int] = []
    nodes: list[torch.fx.Node] = []
    for v in values:
        if v is None:
            outputs.append(-1)
            continue
        if rec.refusal is None and v.layout != torch.strided:
            rec.refuse("a gradient is sparse")
        node = rec.env.get(id(v)) if rec.refusal is None else None
        if node is None and rec.refusal is None:
            try:
                node = rec._read(v)
            except Refused as e:
                rec.refuse(str(e))
        outputs.append(len(nodes))
        if node is not None:
            nodes.append(node)
    if rec.refusal is None and not nodes:
        rec.refuse("no gradient reaches a leaf")
    if rec.refusal is not None:
        return Recording(values, None, (), (), tuple(outputs), rec.refusal)
    rec.graph.output(tuple(nodes))
    rec.graph.eliminate_dead_code()
    gm = torch.fx.GraphModule(torch.nn.Module(), rec.graph)
    inputs = tuple(rec.placeholders)
    return Recording(values, gm, inputs, tuple(rec.examples), tuple(outputs), None)
