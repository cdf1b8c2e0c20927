"""A backend's compiled result in a pack: ember.aotgraph's runtimes, ready to run.

For ``aot_eager`` and ``inductor`` the backend returns an ``AOTCompiled``; its built paths
(training: forward + backward in an ``autograd.Function``; inference) are ``Runtime``
objects of plain data (the signature, what the call mutates, which saved values to clone)
around compiled graphs: an aten ``GraphModule`` (``aot_eager``) or an inductor
``CompiledGraph``, packed as its graph-cache record (wrapper source, kernel arguments,
library key, constants) with its kernel library among the pack's files. In the new
process :class:`PackedAOT` rebuilds those runtimes on its first call, from the record and
the library, without tracing, lowering or building anything; a call they do not serve
(another grad mode, other constant inputs) gives the captured graph to the backend, as a
first compile would.

>>> pack_compiled(lambda x: x)
Traceback (most recent call last):
ember.compiler.artifacts_codec.Unpackable: the backend returned a function, not an AOTCompiled
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from ember.compiler.artifacts_codec import (
    Unpackable,
    decode,
    decode_graph,
    encode,
    encode_graph,
    set_attribute,
)
from ember.compiler.wrap import _CountedOutputs

if TYPE_CHECKING:
    from ember.aotgraph.runtime import Runtime

# aotgraph's tracer and inductor's compiler are imported where a pack is saved, and the light
# modules that run compiled graphs (aotgraph.runtime, inductor.compiled) where one is read
# back, not here: ``import ember.compiler`` imports this module.

__all__ = ["PackedAOT", "pack_compiled"]

JSON = Any


def _graph_fn(fn: Any) -> JSON:
    """One compiled graph of a runtime."""
    from ember.inductor import graph_cache
    from ember.inductor.compiled import CompiledGraph

    if isinstance(fn, CompiledGraph):
        if fn._kernels is not None or fn.record is None:
            raise Unpackable("an inductor graph without a graph-cache record (Triton, or off)")
        paths = {v["attr"] for v in fn.record["consts"].values() if "attr" in v}
        attrs = {p: encode(graph_cache._fetch(fn.gm, p)) for p in sorted(paths)}
        return {"inductor": fn.record, "attrs": attrs}
    if isinstance(getattr(fn, "__self__", None), torch.fx.GraphModule):
        fn = fn.__self__  # gm.forward: the graph module itself
    if isinstance(fn, torch.fx.GraphModule):
        return {"graph": encode_graph(fn)}
    raise Unpackable(f"a compiled graph of type {type(fn).__name__}")


def _runtime(rt: Runtime | None) -> JSON:
    if rt is None:
        return None
    if rt.merge is not None or rt.shapes is not None:
        raise Unpackable("a runtime for inputs sharing storage or for symbolic sizes")
    graph = rt.backward_fx()
    return {
        "signature": encode(rt.signature),
        "mutated": list(rt.mutated),
        "forward": _graph_fn(rt.forward),
        "backward": None if rt.backward is None else _graph_fn(rt.backward),
        "clone_saved": list(rt.clone_saved),
        "number_saved": list(rt.number_saved),
        "tangent_use": encode(rt.tangent_use),
        "backward_graph": None if graph is None else encode_graph(graph),
    }


def pack_compiled(compiled: Any) -> JSON:
    """What a backend returned for a captured graph, if it is an ``AOTCompiled`` whose
    built paths can be packed; else :class:`Unpackable`."""
    from ember.aotgraph.api import AOTCompiled
    from ember.compiler.reporting import _Counted

    inner = compiled
    while isinstance(inner, _CountedOutputs | _Counted):  # the report's call counter (count_calls)
        inner = inner.compiled if isinstance(inner, _CountedOutputs) else inner.fn
    if not isinstance(inner, AOTCompiled):
        raise Unpackable(f"the backend returned a {type(inner).__name__}, not an AOTCompiled")
    lifted = inner.lifted
    if inner.fallback is not None or inner.variants or lifted.symbols is not None:
        raise Unpackable("an aot graph with variants, a fallback or symbolic sizes")
    if lifted.owners:
        raise Unpackable("an aot graph with lifted parameters")
    return {
        "positions": list(lifted.input_positions),
        "constants": [[i, encode(lifted.template[i])] for i in lifted.constant_positions],
        "count": len(lifted.template),
        "sets_grad": inner._sets_grad,
        "training": _runtime(inner.training),
        "inference": _runtime(inner.inference),
    }


def _load_fn(data: JSON) -> Callable[..., Any]:
    if "graph" in data:
        return decode_graph(data["graph"])
    from ember.inductor.compiled import _Run, from_record

    holder = torch.nn.Module()  # the constants the wrapper reads from its graph
    for path, value in data["attrs"].items():
        set_attribute(holder, path, decode(value))
    found = from_record(holder, data["inductor"], _Run(trace=False))  # type: ignore[arg-type]
    if found is None:
        raise ValueError("its kernel library is missing or corrupt")
    return found


def _load_runtime(data: JSON) -> Runtime | None:
    if data is None:
        return None
    from ember.aotgraph.runtime import Runtime

    graph = data["backward_graph"]  # read back only if a backward pass prunes it
    return Runtime(
        decode(data["signature"]),
        tuple(data["mutated"]),
        _load_fn(data["forward"]),
        None if data["backward"] is None else _load_fn(data["backward"]),
        tuple(data["clone_saved"]),
        tuple(data["number_saved"]),
        tangent_use=decode(data["tangent_use"]),
        read_backward_graph=None if graph is None else lambda: decode_graph(graph),
    )


class PackedAOT:
    """A packed ``AOTCompiled``: each runtime (training, inference) is read back by the first
    call that needs it; a call they do not serve compiles the captured graph with ``build``
    (the backend) from then on."""

    __slots__ = ("build", "constants", "data", "delegate", "graph", "runtimes")

    def __init__(self, data: JSON, graph: JSON, build: Callable[..., Any]) -> None:
        self.data, self.graph, self.build = data, graph, build
        # "training" / "inference" -> its runtime, read back by the first call that needs it
        self.runtimes: dict[str, Runtime | None] = {}
        self.delegate: Callable[..., Any] | None = None
        # the inputs compiled in as constants: (position, value) (checked on every call)
        self.constants = [(i, decode(value)) for i, value in data["constants"]]

    def _serves(self, args: Sequence[Any]) -> bool:
        if len(args) != self.data["count"]:
            return False
        for i, b in self.constants:
            a = args[i]
            if not (a is b or (type(a) is type(b) and a == b)):
                return False
        return True

    def __call__(self, *args: Any) -> Any:
        if self.delegate is not None:
            return self.delegate(*args)
        inputs = [args[i] for i in self.data["positions"]]
        grad = torch.is_grad_enabled() and (
            self.data["sets_grad"]
            or any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)
        )
        path = "training" if grad else "inference"
        if path not in self.runtimes:
            try:
                self.runtimes[path] = _load_runtime(self.data[path])
            except Exception:  # a library gone or corrupt since the load: compile
                self.runtimes[path] = None
        runtime = self.runtimes[path]
        if runtime is None or not self._serves(args):
            self.delegate = self.build(decode_graph(self.graph), list(args))
            return self.delegate(*args)
        return runtime(inputs)
