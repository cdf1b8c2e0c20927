"""``aot_compile``: the pipeline from a captured graph to a compiled, differentiable callable.

The pipeline, one pass per line (:meth:`AOTCompiled.build`):

    signature = analyze(lifted, inputs)         # outputs: need grad? alias an input?
    fn        = own_views(lifted)               # inputs restrided (t_) or written needing grad
    fn        = Merge.of(inputs).wrap(fn)       # inputs sharing a written storage: one base
    joint     = trace_joint(fn, inputs)         # functional aten joint forward+backward
    part      = partition(joint)                # forward graph, backward graph, saved values
    forward   = fw_compiler(part.forward)       # the caller's compilers, once each
    backward  = bw_compiler(part.backward)
    Runtime(signature, forward, backward)       # autograd.Function + write-backs + views
                                                # + metadata, versions, requires_grad_ replayed

The first three passes are what the disk cache (:mod:`ember.aotgraph.store`) keeps:
a graph traced before, in this process or another, with the same inputs' metadata and
settings, goes straight to the compilers with the graphs read back from disk.

When no input requires grad, or grad mode is off, the forward-only graph goes to
``inference_compiler`` instead. The callable picks the path on every call, and
builds the other one the first time it is needed.

``Compiler`` is the type of a compiler, the ``torch.compile`` backend contract;
``PARTITIONERS`` maps the names ``partition=`` accepts to partitioners:

>>> sorted(PARTITIONERS)
['default', 'min_cut']
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from ember.aotgraph import check, hints, log, store, symbolic_store
from ember.aotgraph.aliasing import Merge, own_views
from ember.aotgraph.compiler_hook import CALLED_BOXED, hooked
from ember.aotgraph.decompositions import DECOMPOSITIONS, default_decompositions
from ember.aotgraph.eager_checks import Unsupported
from ember.aotgraph.hints import mark_forward, mark_state_inputs, state_inputs_of
from ember.aotgraph.mincut import min_cut_partition
from ember.aotgraph.onepass import trace_inference
from ember.aotgraph.partition import Partition, Partitioner, default_partition
from ember.aotgraph.runtime import Runtime
from ember.aotgraph.store import Traced
from ember.aotgraph.symbolic import (
    SYMBOLIC_LIMITS,
    GraphSymbols,
    ShapeCheck,
    fresh_fakes,
    shape_guards,
)
from ember.aotgraph.tangents import TangentUse
from ember.aotgraph.timing import TIMES
from ember.aotgraph.trace import (
    JointGraph,
    Lifted,
    Signature,
    Specialized,
    analyze,
    trace_forward,
    trace_joint,
)

__all__ = ["PARTITIONERS", "AOTCompiled", "Compiler", "aot_compile"]

Compiler = Callable[[torch.fx.GraphModule, list[Any]], Callable[..., Any]]
Table = dict[Any, Callable[..., Any]]
Decompositions = Table | Callable[[], Table] | None

# How many other sets of values of the non-tensor inputs one AOTCompiled keeps compiled.
MAX_VARIANTS = 8

# The partitioners aot_compile knows by name.
PARTITIONERS: dict[str, Partitioner] = {
    "default": default_partition,
    "min_cut": min_cut_partition,
}


@dataclass(frozen=True, slots=True)
class Settings:
    """The compilers, partitioner and decompositions one ``aot_compile`` call was given."""

    fw_compiler: Compiler
    bw_compiler: Compiler
    inference_compiler: Compiler
    partition: Partitioner
    decompositions: Decompositions  # as given: None, a table, or a function returning one
    cache_key: str | None = None  # the settings' part of a disk-cache key; None: no cache
    _table: Table = field(default_factory=dict)  # the table traced with, made on first use

    def table(self) -> Table:
        """The decomposition table to trace with: the one given (a function given is called
        now, on the first trace, so a cache hit never builds it) plus ember's own entries."""
        if not self._table:
            given = self.decompositions
            if given is None:
                given = default_decompositions()
            self._table.update(given() if callable(given) else given)
            self._table.update(DECOMPOSITIONS)
        return self._table


_REQUIRES_GRAD = operator.attrgetter("requires_grad")


@dataclass
class AOTCompiled:
    """What :func:`aot_compile` returns: call it with the graph module's inputs.

    It also keeps what it built, for inspection: ``joint`` and ``partition`` for
    training calls (``partition.saved_bytes`` is the memory the forward graph keeps
    alive for the backward graph), ``inference_graph`` for forward-only calls.
    ``cache_hit`` says whether the last path built came from the disk cache (``None``:
    the graph is not cacheable); after a hit ``joint`` is None (it is not stored).

    >>> f = aot_compile(torch.fx.symbolic_trace(lambda x: x.cos()), [torch.zeros(2)],
    ...                 fw_compiler=lambda gm, ex: gm)
    >>> f.inference is not None, f.training is None  # no input requires grad
    (True, True)
    >>> x = torch.zeros(2, requires_grad=True)
    >>> f(x).sum().backward()  # the training path is built on this first call
    >>> f.training is not None, f.partition.saved
    (True, ('primals_1',))
    """

    lifted: Lifted
    settings: Settings
    training: Runtime | None = None
    inference: Runtime | None = None
    joint: JointGraph | None = None
    partition: Partition | None = None
    inference_graph: torch.fx.GraphModule | None = None
    cache_hit: bool | None = None
    # numbers are compiled in as constants: one AOTCompiled per other set of values
    variants: dict[tuple[Any, ...], AOTCompiled] = field(default_factory=dict)
    # set when tracing needed a float input's value: the version with floats as constants
    fallback: AOTCompiled | None = None
    _check: bool = field(default_factory=check.enabled)
    # the function calls requires_grad_() on an input: under grad mode, always train
    _sets_grad: bool = False
    _tensor_slots: list[int] | None = field(default=None, repr=False)

    def __call__(self, *args: Any) -> Any:
        if self.fallback is not None:
            return self.fallback(*args)
        if self.lifted.constant_positions and not self.lifted.constants_match(args):
            return self.variant(args)(*args)
        inputs = self.lifted.flat_inputs(args)
        if self._tensor_slots is None:  # which inputs are tensors (the rest are floats)
            self._tensor_slots = [k for k, t in enumerate(inputs) if isinstance(t, torch.Tensor)]
        slots = self._tensor_slots
        tensors = inputs if len(slots) == len(inputs) else [inputs[k] for k in slots]
        # (map over an attrgetter: no generator frame a call, 0.3 us warm, more after a big op)
        grad = torch.is_grad_enabled() and (self._sets_grad or any(map(_REQUIRES_GRAD, tensors)))
        runtime = (self.training if grad else self.inference) or self.build(inputs, grad=grad)
        if runtime is None:
            assert self.fallback is not None
            return self.fallback(*args)
        if runtime.shapes is not None and not runtime.shapes.ok(inputs):
            return self.lifted(*inputs)  # sizes the graphs were not traced for: run eagerly
        fast = runtime.fast
        return runtime(inputs) if fast is None else fast(inputs)

    def variant(self, args: Sequence[Any]) -> AOTCompiled:
        """The compiled function for other values of the constant inputs (built on demand).

        Floats are graph inputs; ints (sizes, indices, in ember's capture) are constants.

        >>> f = aot_compile(torch.fx.symbolic_trace(lambda x, k: x * k), [torch.ones(2), 2],
        ...                 fw_compiler=lambda gm, ex: gm)
        >>> f(torch.ones(2), 2), f(torch.ones(2), 3), len(f.variants)
        (tensor([2., 2.]), tensor([3., 3.]), 1)
        """
        key = tuple(args[i] for i in self.lifted.constant_positions)
        found = self.variants.get(key)
        if found is None:
            lifted = Lifted.of(self.lifted.module, args, floats=self.lifted.floats)
            found = AOTCompiled(lifted, self.settings)
            if len(self.variants) >= MAX_VARIANTS:
                del self.variants[next(iter(self.variants))]  # the oldest
            self.variants[key] = found
        return found

    def build(self, inputs: list[torch.Tensor], *, grad: bool) -> Runtime | None:
        """Trace, partition and compile the training (``grad``) or inference path; ``None``
        if tracing needed a float input's value (``fallback`` is then set)."""
        try:
            runtime = self._build(inputs, grad=grad)
            if not grad and runtime.signature.grad_set and torch.is_grad_enabled():
                self._sets_grad = True  # the outputs need gradients after all
                runtime = self._build(inputs, grad=True)
            return runtime
        except Specialized:
            self.fallback = AOTCompiled(self.lifted.specialized(), self.settings)
            return None

    def _build(self, inputs: list[torch.Tensor], *, grad: bool) -> Runtime:
        if self.lifted.symbols is not None:
            return self._build_symbolic(self.lifted.symbols, inputs, grad=grad)
        key = store.record_key(self.lifted, inputs, grad, self.settings.cache_key)
        traced = store.cached(key, lambda: self._trace(inputs, grad=grad))  # disk cache
        self.cache_hit = traced.from_cache if key is not None else None
        merge = Merge.of(inputs, traced.signature.versions, grad=grad)  # as _trace made it
        runtime = self._compile(traced, inputs, merge)
        if traced.signature.training or grad:
            self.training = runtime
        else:
            self.inference = runtime
        return runtime

    def _build_symbolic(
        self, found: GraphSymbols, inputs: list[torch.Tensor], *, grad: bool
    ) -> Runtime:
        """:meth:`_build` for a graph with symbolic sizes: traced with the graph's fake mode
        (fake inputs with its symbols), checked per call against the guards the trace added
        to its ShapeEnv; cached on disk by :mod:`ember.aotgraph.symbolic_store`."""
        key = symbolic_store.record_key(self.lifted, found, inputs, grad, self.settings.cache_key)
        try:
            traced = symbolic_store.cached(
                key, found, lambda: self._trace(fresh_fakes(found, inputs), grad=grad)
            )
        except SYMBOLIC_LIMITS as e:
            raise Unsupported(f"aot_compile: symbolic sizes: {type(e).__name__}: {e}") from e
        written = key is not None and traced.partition is None  # inference graphs only
        self.cache_hit = traced.from_cache if written else None
        runtime = self._compile(traced, _with_symints(found, inputs), None)
        # after the compilers: a guard one adds (int() of a size it specialises) is checked too
        shapes = ShapeCheck.of(found.values, *shape_guards(found))
        runtime = dataclasses.replace(runtime, shapes=shapes)
        if traced.signature.training or grad:
            self.training = runtime
        else:
            self.inference = runtime
        return runtime

    def _trace(self, inputs: list[torch.Tensor], *, grad: bool) -> Traced:
        if not grad:  # analyze and trace_forward in one make_fx run, where that serves
            with TIMES.timed("aot trace"):
                once = trace_inference(self.lifted, inputs, self.settings.table())
            if once is not None:
                if self._check:
                    check.check_joint(once[1])
                return Traced(once[0], once[1].mutated, once[1].gm)
        signature = analyze(self.lifted, inputs, grad=grad)
        fn: Callable[..., Any] = self.lifted
        written = _written_with_grad(signature, inputs, grad)
        if self.lifted.symbols is not None and (signature.restrided or written):
            raise Unsupported(
                "aot_compile: symbolic sizes with an input restrided (t_, resize_) or written "
                "while requiring grad; run this function eagerly"
            )
        if signature.restrided or written:  # t_, resize_ on inputs: on views inside the graph
            fn, replaced = own_views(fn, signature.restrided, written, inputs, grad)
            signature = _with_replaced(signature, replaced, grad and bool(written))
        merge = Merge.of(inputs, signature.versions, grad=grad)  # inputs sharing storage
        if signature.grad_set and (merge is not None or signature.restrided or written):
            raise Unsupported(
                "aot_compile: requires_grad_() on an input that shares storage, is written or "
                "is restrided in place; run this function eagerly"
            )
        if merge is not None and (signature.replaced or signature.restrided):
            raise Unsupported(
                "aot_compile: inputs that share storage, one with its metadata changed in place "
                "(t_, resize_, ...) or written while requiring grad; run this function eagerly"
            )
        if merge is not None:
            fn, inputs = merge.wrap(fn), merge.inputs(inputs)
            grad_inputs = tuple(map(merge.graph_index, signature.grad_inputs))
            signature = dataclasses.replace(signature, grad_inputs=grad_inputs)
        if signature.training:
            return self._trace_training(fn, inputs, signature)
        with TIMES.timed("aot trace"):
            graph = trace_forward(fn, inputs, signature, self.settings.table())
        if self._check:
            check.check_joint(graph)
        return Traced(signature, graph.mutated, graph.gm)

    def _trace_training(
        self, fn: Callable[..., Any], inputs: list[torch.Tensor], signature: Signature
    ) -> Traced:
        with TIMES.timed("aot trace"):
            joint = trace_joint(fn, inputs, signature, self.settings.table())
        if self._check:
            check.check_joint(joint)
        for i in joint.mutated:
            if inputs[i].requires_grad:
                raise Unsupported(
                    f"aot_compile: input {i} requires grad and is mutated in place; "
                    "run this function eagerly"
                )
        with TIMES.timed("partition"):
            part = self.settings.partition(joint)
        if self._check:
            check.check_partition(joint, part)
        self.joint = joint
        # inputs the call writes or restrides: saved as they are, the write would show
        touched = {*joint.mutated, *_bumped_graph_inputs(signature, len(inputs))}
        mutated_saved = {f"primals_{i + 1}" for i in touched}
        clone = tuple(k for k, name in enumerate(part.saved) if name in mutated_saved)
        saved_values = [n.meta.get("val") for n in bw_inputs_nodes(part)[: len(part.saved)]]
        numbers = tuple(k for k, v in enumerate(saved_values) if not isinstance(v, torch.Tensor))
        return Traced(signature, joint.mutated, part.forward, part, clone, numbers)

    def _compile(
        self,
        traced: Traced,
        inputs: list[torch.Tensor],
        merge: Merge | None,
        shapes: ShapeCheck | None = None,
    ) -> Runtime:
        """Run the caller's compilers on traced (or cached) graphs; wrap them in a Runtime."""
        sig, part = traced.signature, traced.partition
        graph_inputs = list(inputs) if merge is None else merge.inputs(inputs)
        fw_graph = traced.forward if part is None else part.forward
        mark_forward(fw_graph, len(sig.graph_outputs), traced.mutated, part, merge is None)
        if part is None:
            self.inference_graph = traced.forward
            lifted = self.lifted
            state = state_inputs_of(lifted.module, lifted.input_positions, len(lifted.names))
            if state is not None:  # for freezing
                kept = range(len(inputs)) if merge is None else merge.kept
                mark_state_inputs(traced.forward, (j for j, i in enumerate(kept) if i in state))
            _log_graph("inference", traced.forward)
            with log.graph(1, 1, "inference"):
                compiled = self.settings.inference_compiler(traced.forward, graph_inputs)
            return Runtime(sig, traced.mutated, compiled, merge=merge, shapes=shapes)
        self.partition = part
        _log_graph("forward", part.forward)
        _log_graph("backward", part.backward)
        with log.graph(1, 2, "forward"):
            fw = self.settings.fw_compiler(part.forward, graph_inputs)
        bw_inputs = [n.meta.get("val") for n in bw_inputs_nodes(part)]
        with log.graph(2, 2, "backward"):
            bw = _compile_boxed(self.settings.bw_compiler, part.backward, bw_inputs)
        saved = traced.clone_saved, traced.number_saved
        use = TangentUse.of(part.backward, bw_inputs[len(bw_inputs) - len(sig.grad_outputs) :])
        graph = part.backward if use is not None else None
        bw_compiler = self.settings.bw_compiler

        def compile_pruned(pruned: torch.fx.GraphModule) -> Callable[..., Any]:
            _log_graph("backward (undefined gradients pruned)", pruned)
            with log.graph(2, 2, "backward, pruned"):
                return _compile_boxed(bw_compiler, pruned, bw_inputs)

        return Runtime(
            sig,
            traced.mutated,
            fw,
            bw,
            *saved,
            merge=merge,
            tangent_use=use,
            backward_graph=graph,
            compile_pruned=compile_pruned,
            shapes=shapes,
        )


def _with_symints(found: GraphSymbols, inputs: list[Any]) -> list[Any]:
    """The compilers' example inputs: the call's tensors, and the graph's SymInt for each int
    placeholder (its value in this call would read as a constant)."""
    values = found.values
    return [
        values[i] if i < len(values) and isinstance(values[i], torch.SymInt) else t
        for i, t in enumerate(inputs)
    ]


def _log_graph(what: str, gm: torch.fx.GraphModule) -> None:
    """The aot_graphs artifact: one graph handed to the caller's compilers, as code."""
    log.artifact("aot_graphs", lambda: f"{what} graph:\n{gm.print_readable(print_output=False)}")


def _bumped_graph_inputs(sig: Signature, n: int) -> list[int]:
    """The graph inputs whose version counter the call moves: a saved one must be a copy
    (the backward pass checks versions). With inputs merged the indices moved: then every
    graph input counts (a rare case, a few copies more)."""
    if not any(sig.versions):
        return []
    if len(sig.versions) != n:  # merged: indices moved, so be safe and copy every written one
        return list(range(n))
    return [i for i, v in enumerate(sig.versions) if v]


def _written_with_grad(sig: Signature, inputs: Sequence[Any], grad: bool) -> tuple[int, ...]:
    """Inputs that require grad and that the call writes in place. Not leaves: eager raises
    for a leaf written under grad mode, so a graph writes one only under no_grad (an
    optimizer's step), and its new value is copied back as any other write, under no_grad."""
    if not grad:
        return ()
    restrided = {i for i, _ in sig.restrided}
    return tuple(
        i
        for i, v in enumerate(sig.versions)
        if v and inputs[i].requires_grad and not inputs[i].is_leaf and i not in restrided
    )


def _with_replaced(sig: Signature, replaced: tuple[int, ...], differentiable: bool) -> Signature:
    """``sig`` with the final values of the ``replaced`` inputs as its last graph outputs;
    those of inputs that require grad take a gradient (``differentiable``: some do)."""
    leaves, n = len(sig.outputs), len(sig.graph_outputs)
    new = tuple(range(n, n + len(replaced)))
    grad_outputs = sig.grad_outputs
    if differentiable:
        grad_outputs += tuple(j for j, i in zip(new, replaced, strict=True) if i in sig.grad_inputs)
    return dataclasses.replace(
        sig,
        graph_outputs=sig.graph_outputs + tuple(range(leaves, leaves + len(replaced))),
        out_storage=sig.out_storage + new,
        replaced=replaced,
        grad_outputs=grad_outputs,
        training=bool(grad_outputs) and bool(sig.grad_inputs),
    )


def bw_inputs_nodes(part: Partition) -> list[torch.fx.Node]:
    return list(part.backward.graph.find_nodes(op="placeholder"))


def _settings_key(settings: Settings) -> str | None:
    """The settings' part of the cache key: the partitioner by name (one not in
    PARTITIONERS is not cached) and the table (a function: by its name, not called)."""
    names = [name for name, fn in PARTITIONERS.items() if fn is settings.partition]
    given = settings.decompositions
    table = given if callable(given) else settings.table()
    return store.settings_key(names[0], table) if names else None


def _partitioner(partition: str | Partitioner) -> Partitioner:
    if callable(partition):
        return partition
    if partition not in PARTITIONERS:
        raise ValueError(f"unknown partition {partition!r}; known: {', '.join(PARTITIONERS)}")
    return PARTITIONERS[partition]


def aot_compile(
    gm: torch.fx.GraphModule | Callable[..., Any],
    example_inputs: Sequence[Any],
    *,
    fw_compiler: Compiler,
    bw_compiler: Compiler | None = None,
    inference_compiler: Compiler | None = None,
    partition: str | Partitioner = "min_cut",
    decompositions: Decompositions = None,
    cache: bool = True,
) -> AOTCompiled:
    """Compile ``gm`` ahead of time into a forward graph and a backward graph.

    ``gm`` takes flat inputs (parameters lifted to inputs, as ember's capture
    makes them, or kept as attributes, as ``symbolic_trace`` does) and returns a
    tensor, or a tuple or list of them. Each compiler has the backend contract
    ``(gm, example_inputs) -> callable`` and receives a functional aten graph
    that returns a list: the forward graph's example inputs are the real flat
    inputs (parameters last), the backward graph's are fake tensors (shapes,
    strides and dtypes only). ``bw_compiler`` and ``inference_compiler`` default
    to ``fw_compiler``. ``partition`` is ``"min_cut"``, ``"default"`` or a
    function ``JointGraph -> Partition``. ``decompositions`` replaces
    :func:`default_decompositions` (ember's own entries, which fix semantics,
    are always added), or is a function returning a table, called only to trace (a
    disk-cache hit never builds it; see docs/aotgraph-cache.md). ``cache=False`` or
    ``EMBER_AOT_CACHE=0``: no disk cache of traced graphs (:mod:`ember.aotgraph.store`).

    >>> import torch
    >>> seen = []
    >>> def show(gm, example_inputs):
    ...     seen.append(sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function"}))
    ...     return gm
    >>> f = aot_compile(torch.fx.symbolic_trace(torch.nn.Linear(3, 2)), [torch.randn(4, 3)],
    ...                 fw_compiler=show)
    >>> f(torch.randn(4, 3)).sum().backward()
    >>> for ops in seen:
    ...     print(ops)
    ['aten.addmm.default', 'aten.t.default']
    ['aten.mm.default', 'aten.sum.dim_IntList', 'aten.t.default', 'aten.view.default']
    """
    settings = Settings(  # a caller may watch what each compiler is handed (the minifier)
        hooked(fw_compiler, "forward"),
        hooked(bw_compiler or fw_compiler, "backward"),
        hooked(inference_compiler or fw_compiler, "inference"),
        _partitioner(partition),
        decompositions,
    )
    if store.enabled(cache):
        settings = dataclasses.replace(settings, cache_key=_settings_key(settings))
    compiled = AOTCompiled(Lifted.of(gm, example_inputs), settings)
    inputs = compiled.lifted.flat_inputs(example_inputs)
    grad = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in inputs
    )
    if compiled.build(inputs, grad=grad) is None:
        assert compiled.fallback is not None
        compiled = compiled.fallback
        compiled.build(compiled.lifted.flat_inputs(example_inputs), grad=grad)
    return compiled


def _compile_boxed(
    compiler: Any, gm: torch.fx.GraphModule, inputs: list[Any]
) -> Callable[..., Any]:
    """``compiler(gm, inputs)`` for a backward graph, which the runtime calls boxed where the
    result allows (``compiler_hook.CALLED_BOXED``)."""
    hints.mark_owned_inputs(gm)
    token = CALLED_BOXED.set(True)
    try:
        compiled: Callable[..., Any] = compiler(gm, inputs)
        return compiled
    finally:
        CALLED_BOXED.reset(token)
