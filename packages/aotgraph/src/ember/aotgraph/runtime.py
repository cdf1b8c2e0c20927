"""The runtime around compiled graphs: an ``autograd.Function``, write-backs and views.

:class:`Runtime` holds one compiled forward (or inference) graph, the compiled
backward graph when there is one, and what :func:`~ember.aotgraph.trace.analyze`
learned. Calling it:

1. runs the forward graph, through :class:`CompiledFunction` when it trains, so
   the saved values stay in the autograd context and the backward graph runs
   on ``backward()``;
2. copies the new values of mutated inputs back into the caller's tensors
   (BatchNorm running statistics, in-place ops on inputs);
3. rebuilds the output structure: graph outputs, inputs returned as they are,
   views of inputs made again from the caller's tensors, constants.

>>> import torch
>>> gm = torch.fx.symbolic_trace(lambda x: x * 2)
>>> from ember.aotgraph.trace import Lifted, analyze
>>> sig = analyze(Lifted.of(gm, [torch.ones(2)]), [torch.ones(2)], grad=False)
>>> Runtime(sig, (), lambda x: [x * 2])([torch.ones(2)])
tensor([2., 2.])
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

from ember.aotgraph.aliasing import (
    Merge,
    fresh_copy,
    lone_views,
    outputs_to_clone,
    restride,
    unviewed,
)
from ember.aotgraph.signature import Output, Signature
from ember.aotgraph.tangents import TangentUse, without_undefined
from ember.aotgraph.versions import Versions, version_of

if TYPE_CHECKING:  # sympy and symbolic_shapes: imported by graphs with symbolic sizes only
    from ember.aotgraph.symbolic import ShapeCheck

__all__ = ["CompiledFunction", "Runtime"]


@dataclass(frozen=True, slots=True)
class Runtime:
    """A compiled forward graph (and backward graph, when training) and how to call it."""

    signature: Signature
    mutated: tuple[int, ...]  # tensor inputs whose new values follow the graph outputs
    forward: Callable[..., Sequence[torch.Tensor]]
    backward: Callable[..., Sequence[torch.Tensor | None]] | None = None
    clone_saved: tuple[int, ...] = ()  # saved values that are inputs mutated by this call
    number_saved: tuple[int, ...] = ()  # saved values that are numbers, not tensors
    merge: Merge | None = None  # inputs sharing storage, passed to the graph as one base
    # undefined output gradients stay undefined (eager's None .grad); None: materialised
    tangent_use: TangentUse | None = None
    # the backward graph before compiling: pruned for undefined tangents (see backward_for)
    backward_graph: torch.fx.GraphModule | None = None
    # or how to make it when first needed (a portable pack reads it back only then: most
    # backward passes never prune, and making a GraphModule generates and compiles its code)
    read_backward_graph: Callable[[], torch.fx.GraphModule] | None = None
    # compiles a pruned backward graph as the backward was (the caller's backward compiler,
    # the backward's example inputs); None: pruned graphs run as aten ops
    compile_pruned: Callable[[torch.fx.GraphModule], Callable[..., Any]] | None = None
    # symbolic sizes: what the trace assumed of them, and how to read them from the inputs
    shapes: ShapeCheck | None = None
    # (input, how far eager moves its version counter) for each input written in place
    bumped: tuple[tuple[int, int], ...] = field(init=False)
    versions: Versions = field(init=False)  # reads and moves the counters of ``bumped``
    # graph outputs to copy (they share storage where eager's do not): found on the first call
    clone: list[tuple[int, ...]] = field(init=False)
    # graph outputs the forward hands out as plain tensors, not views: found on the first call
    unview: list[tuple[int, ...]] = field(init=False)
    plain: bool = field(init=False)  # nothing to replay on the inputs but write-backs
    pruned: dict[frozenset[int], Callable[..., Any]] = field(init=False)
    # some saved value serves only some output gradients: the backward checks versions itself
    own_checks: bool = field(init=False)
    num_forward_outputs: int = field(init=False)  # graph outputs + mutation values
    non_differentiable: tuple[int, ...] = field(init=False)  # tensor outputs without grad
    # the caller's output structure from (inputs, graph outputs): see ``assembler``
    assemble: Callable[[Sequence[torch.Tensor], Sequence[Any]], Any] = field(init=False)
    # ``self(inputs)`` as one function, once the first call shows it may be (``direct_call``)
    fast: Callable[[list[torch.Tensor]], Any] | None = field(init=False)

    def __post_init__(self) -> None:
        sig = self.signature
        n = len(sig.graph_outputs) + len(self.mutated)
        grad = set(sig.grad_outputs)
        numbers = {o.index for o in sig.outputs if o.kind == "graph" and o.meta is None}
        no_grad = tuple(j for j in range(n) if j not in grad | numbers)
        object.__setattr__(self, "num_forward_outputs", n)
        object.__setattr__(self, "non_differentiable", no_grad)
        object.__setattr__(self, "assemble", assembler(sig, self.shapes))
        object.__setattr__(self, "bumped", tuple((i, v) for i, v in enumerate(sig.versions) if v))
        object.__setattr__(self, "versions", Versions.of(self.bumped))
        object.__setattr__(self, "clone", [])
        object.__setattr__(self, "unview", [])
        object.__setattr__(self, "pruned", {})
        replay = sig.grad_set or self.bumped or sig.restrided or sig.replaced
        object.__setattr__(self, "plain", self.merge is None and not replay)
        use, every = self.tangent_use, frozenset(range(len(sig.grad_outputs)))
        partial = use is not None and any(r and r != every for r in use.saved)
        object.__setattr__(self, "own_checks", partial)
        object.__setattr__(self, "fast", None)

    def __call__(self, inputs: list[torch.Tensor]) -> Any:
        outs = self._run(inputs) if self.plain else self._run_replaying(inputs)
        clone = self.clone
        if not clone:  # once: how the compiled graph's outputs share storage
            found = outputs_to_clone(self.signature.out_storage, inputs, outs)
            if self.backward is not None:
                found = tuple(sorted({*found, *self._function_views(outs)}))
            clone.append(found)
            object.__setattr__(self, "fast", direct_call(self))
        if clone[0]:
            outs = list(outs)
            for j in clone[0]:
                outs[j] = fresh_copy(outs[j])
        return self.assemble(inputs, outs)

    def _function_views(self, outs: Sequence[Any]) -> list[int]:
        """Graph outputs that the compiled graph returned as views (of its intermediates:
        ``t_`` on a result). From the ``autograd.Function`` autograd marks them as one of
        several views and refuses an in-place change of them later, where eager's output
        allows it: the runtime returns a copy instead (rare; an ``aot_eager`` case). Not
        where eager's is one of several views too (``creation``): eager refuses as well."""
        sig = self.signature
        split = {o.index for o in sig.outputs if o.kind == "graph" and o.creation}
        return [
            j
            for j, o in enumerate(outs[: len(sig.graph_outputs)])
            if isinstance(o, torch.Tensor) and o.requires_grad and o._is_view() and j not in split
        ]

    def backward_for(self, missing: frozenset[int]) -> Callable[..., Sequence[Any]]:
        """The backward graph for a pass whose tangents ``missing`` are undefined: without
        the formulas only they reach (:func:`~ember.aotgraph.tangents.without_undefined`),
        compiled on the first such pass by ``compile_pruned`` (or run as aten ops where there
        is none). Common in real models: a seq2seq model returns its encoder's last state
        beside the logits, and a loss on the logits leaves that output's gradient undefined
        on every step (T5's training step ran its whole backward as aten calls before)."""
        assert self.backward is not None
        if not missing or (graph := self.backward_fx()) is None:
            return self.backward
        found = self.pruned.get(missing)
        if found is None:
            pruned = without_undefined(graph, len(self.signature.grad_outputs), missing)
            compile_pruned = self.compile_pruned
            found = pruned if compile_pruned is None else compile_pruned(pruned)
            self.pruned[missing] = found
        return found

    def backward_fx(self) -> torch.fx.GraphModule | None:
        """The backward graph before compiling (None where it is not kept), made by
        ``read_backward_graph`` on the first call that needs it.

        >>> gm = torch.fx.symbolic_trace(lambda x: x * 2)
        >>> from ember.aotgraph.trace import Lifted, analyze
        >>> sig = analyze(Lifted.of(gm, [torch.ones(2)]), [torch.ones(2)], grad=False)
        >>> rt = Runtime(sig, (), gm, read_backward_graph=lambda: gm)
        >>> rt.backward_graph is None, rt.backward_fx() is gm, rt.backward_graph is gm
        (True, True, True)
        """
        if self.backward_graph is None and self.read_backward_graph is not None:
            object.__setattr__(self, "backward_graph", self.read_backward_graph())
        return self.backward_graph

    def _run_replaying(self, inputs: list[torch.Tensor]) -> Sequence[Any]:
        """:meth:`_run`, and what else eager's in-place ops did to the inputs: the flags
        ``requires_grad_()`` set, the metadata ``t_`` changed, the version counters."""
        sig = self.signature
        for i in sig.grad_set:  # the function's requires_grad_() calls
            inputs[i].requires_grad_()
        versions = self.versions.read(inputs)
        outs = self._run(inputs if self.merge is None else self.merge.inputs(inputs))
        if sig.restrided or sig.replaced:  # replaced inputs' values: the last graph outputs
            n = len(sig.graph_outputs)
            restride(inputs, sig.restrided, sig.replaced, outs[n - len(sig.replaced) : n])
        versions.advance()
        return outs

    def _run(self, inputs: list[torch.Tensor]) -> Sequence[Any]:
        """Run the graphs on the graph's inputs; write the mutated ones back."""
        if self.backward is None:  # no output needs a gradient: record no autograd graph
            if torch.is_grad_enabled():  # (not torch.no_grad(): its Python layer costs 3 us)
                torch._C._set_grad_enabled(False)
                try:
                    outs = self.forward(*inputs)
                finally:
                    torch._C._set_grad_enabled(True)
            else:
                outs = self.forward(*inputs)
        elif self.own_checks:
            outs = _apply_unchecked(self, inputs)
        elif torch._C._are_functorch_transforms_active():
            outs = CompiledFunction.apply(self, *inputs)  # type: ignore[no-untyped-call]
        else:  # Function.apply's Python layer only matters under functorch transforms
            outs = _apply(self, *inputs)  # type: ignore[no-untyped-call]
        if self.mutated:
            n = len(self.signature.graph_outputs)
            write_back(inputs, self.mutated, outs[n : n + len(self.mutated)])
        return outs


def write_back(
    inputs: Sequence[torch.Tensor], mutated: Sequence[int], values: Sequence[torch.Tensor]
) -> None:
    """Copy each mutation's new value into the caller's tensor, as eager's in-place op did;
    skip the copy where the compiled graph wrote the value there already (it returned the
    input itself, or a tensor over the same memory: see :mod:`ember.aotgraph.hints`).

    >>> buf = torch.zeros(2)
    >>> write_back([buf], [0], [torch.ones(2)]); buf
    tensor([1., 1.])
    >>> write_back([buf], [0], [buf.add_(1)]); buf  # written in place: nothing to copy
    tensor([2., 2.])
    """
    with torch.no_grad():
        for i, value in zip(mutated, values, strict=True):
            t = inputs[i]
            if value is not t and not _same_memory(value, t):
                t.copy_(value)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` are the same elements of the same memory (an ``autograd.Function``
    returns an input as a new tensor over it): copying one into the other changes nothing."""
    return (
        a.data_ptr() == b.data_ptr()
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.device == b.device
    )


def direct_call(rt: Runtime) -> Callable[[list[torch.Tensor]], Any] | None:
    """``rt(inputs)`` as one function, where a call is the forward graph alone and the
    caller gets its outputs as they are (one tensor, a flat tuple or list): no backward, no
    mutation or replay, no output to copy (known after the first call), static sizes, and a
    forward offering ``direct()``: the callable it runs itself (``ember.inductor``'s
    compiled graph: its wrapper, once built). None otherwise.

    A plain inference call went through four Python frames between ``AOTCompiled`` and
    the wrapper (this runtime's call and run, the compiled graph's call, the assembler):
    0.9-1.3 us warm, several more after a large kernel has evicted them from the caches,
    what a cheap op over 1M elements loses to eager.
    """
    if rt.backward is not None or not rt.plain or rt.mutated or rt.shapes is not None:
        return None
    if not rt.clone or rt.clone[0]:
        return None
    direct = getattr(rt.forward, "direct", None)
    call = direct() if direct is not None else None
    shape = plain_shape(rt.signature)
    if call is None or shape is None:
        return None
    grad_on, set_grad = torch.is_grad_enabled, torch._C._set_grad_enabled
    picks: dict[str, Callable[[Any], Any]] = {
        "one": operator.itemgetter(0),
        "tuple": tuple,
        "list": list,
    }
    pick = picks[shape]

    def fast(inputs: list[torch.Tensor]) -> Any:
        if grad_on():  # as ``Runtime._run``: record no autograd graph
            set_grad(False)
            try:
                return pick(call(*inputs))
            finally:
                set_grad(True)
        return pick(call(*inputs))

    return fast


def plain_shape(sig: Signature) -> str | None:
    """How the caller's output is made where it is the graph outputs in order: ``"one"``
    tensor, a flat ``"tuple"`` or ``"list"``; None for any other structure.

    >>> gm = torch.fx.symbolic_trace(lambda x: (x * 2, x + 1))
    >>> from ember.aotgraph.trace import Lifted, analyze
    >>> plain_shape(analyze(Lifted.of(gm, [torch.ones(2)]), [torch.ones(2)], grad=False))
    'tuple'
    """
    if any(o.kind != "graph" or o.index != k for k, o in enumerate(sig.outputs)):
        return None
    spec = sig.out_spec
    if spec.is_leaf():
        return "one"
    if all(spec.child(k).is_leaf() for k in range(spec.num_children)):
        return {tuple: "tuple", list: "list"}.get(spec.type)
    return None


def assembler(
    sig: Signature, shapes: ShapeCheck | None = None
) -> Callable[[Sequence[torch.Tensor], Sequence[Any]], Any]:
    """``assemble`` for ``sig``, with fast paths for the usual output structures.

    Most compiled functions return their graph outputs in order, as one tensor or a
    flat tuple or list: those skip :func:`assemble`'s per-output dispatch and pytree.

    >>> gm = torch.fx.symbolic_trace(lambda x: (x * 2, x + 1))
    >>> from ember.aotgraph.trace import Lifted, analyze
    >>> sig = analyze(Lifted.of(gm, [torch.ones(2)]), [torch.ones(2)], grad=False)
    >>> assembler(sig)([torch.ones(2)], [torch.zeros(1), torch.ones(1)])
    (tensor([0.]), tensor([1.]))
    """
    spec, n = sig.out_spec, len(sig.outputs)
    if shapes is not None and any(o.kind in ("alias", "view") for o in sig.outputs):
        return _symbolic_assembler(sig, shapes)
    if any(o.kind != "graph" or o.index != k for k, o in enumerate(sig.outputs)):
        return lambda inputs, outs: assemble(sig, inputs, outs)
    shape = plain_shape(sig)
    if shape == "one":
        return lambda inputs, outs: outs[0]
    if shape == "tuple":
        return lambda inputs, outs: tuple(outs[:n])
    if shape == "list":
        return lambda inputs, outs: list(outs[:n])
    return lambda inputs, outs: pytree.tree_unflatten(list(outs[:n]), spec)


def _symbolic_assembler(
    sig: Signature, shapes: ShapeCheck
) -> Callable[[Sequence[torch.Tensor], Sequence[Any]], Any]:
    """``assemble`` where views of inputs or outputs have symbolic layouts: resolved with
    each call's sizes, remembered per sizes (sympy takes about 10 us a view)."""
    from ember.aotgraph.symbolic import MAX_REMEMBERED, resolve  # made by a symbolic trace

    known: dict[tuple[int, ...], Signature] = {}

    def run(inputs: Sequence[torch.Tensor], outs: Sequence[Any]) -> Any:
        sizes = shapes.bind(inputs)
        key = tuple(sizes.values())
        now = known.get(key)
        if now is None:
            if len(known) >= MAX_REMEMBERED:
                known.clear()
            views = ("alias", "view")
            resolved = tuple(
                replace(o, meta=resolve(o.meta, sizes)) if o.kind in views else o
                for o in sig.outputs
            )
            now = known[key] = replace(sig, outputs=resolved)
        return assemble(now, inputs, outs)

    return run


def assemble(sig: Signature, inputs: Sequence[torch.Tensor], outs: Sequence[Any]) -> Any:
    """The caller's output structure from graph outputs, inputs, views of inputs, constants."""
    leaves: list[Any] = []
    for o in sig.outputs:
        if o.kind == "graph":
            leaves.append(outs[o.index])
        elif o.kind == "input":
            leaves.append(inputs[o.index])
        elif o.kind in ("alias", "view"):
            assert o.meta is not None
            leaves.append(_view(o, inputs[o.index] if o.kind == "alias" else outs[o.index]))
        elif o.kind == "same":  # one object, returned twice
            leaves.append(leaves[o.index])
        else:
            leaves.append(o.value)
    return pytree.tree_unflatten(leaves, sig.out_spec)


_MULTI_OUTPUT = torch._C._autograd.CreationMeta.MULTI_OUTPUT_NODE


def _view(o: Output, base: torch.Tensor) -> torch.Tensor:
    """Output ``o``, a view of ``base`` as eager made it: with autograd history or not, and
    refused in-place writes where eager's is (one of several views; made under no_grad)."""
    assert o.meta is not None
    offset = base.storage_offset() + o.meta.offset  # relative: see Output
    if o.creation == "NO_GRAD_MODE":  # no history, yet a write with grad on must raise
        with torch.no_grad():
            return base.as_strided(o.meta.size, o.meta.stride, offset)
    if base.requires_grad and not o.requires_grad:  # x.detach(): no autograd history
        base = base.detach()
    view = base.as_strided(o.meta.size, o.meta.stride, offset)
    if o.creation == "MULTI_OUTPUT_NODE" and view.requires_grad:  # eager refuses writes
        torch._C._autograd._set_creation_meta(view, _MULTI_OUTPUT)
    return view


class CompiledFunction(torch.autograd.Function):
    """Runs a :class:`Runtime`'s forward graph; its ``backward`` runs the backward graph.

    ``apply(runtime, *inputs)`` returns the graph outputs followed by the mutation
    values. The saved values go through ``ctx.save_for_backward``, so a second
    ``backward()`` without ``retain_graph=True`` fails as in eager. The backward
    graph is not differentiable itself: under ``create_graph=True`` the gradients
    carry a node that raises a clear error if a second backward reaches it.

    >>> import torch
    >>> from ember.aotgraph import aot_compile
    >>> f = aot_compile(torch.fx.symbolic_trace(lambda x: x.sin()), [torch.zeros(1)],
    ...                 fw_compiler=lambda gm, ex: gm)
    >>> y = f(torch.ones(2, requires_grad=True))
    >>> y.grad_fn.name()
    'CompiledFunctionBackward'
    """

    @staticmethod
    def forward(ctx: Any, rt: Runtime, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = rt.forward(*inputs)
        k = rt.num_forward_outputs
        saved = list(outs[k:])
        for i in rt.clone_saved:
            saved[i] = saved[i].clone()
        if rt.number_saved:  # save_for_backward takes tensors only
            ctx.numbers = [saved[i] for i in rt.number_saved]
            saved = [v for i, v in enumerate(saved) if i not in rt.number_saved]
        # A saved view may be a view of an output (amax's backward saves ``amax.view``):
        # saved as it is, node -> view -> its base, the output -> node would be a cycle in
        # C++ that Python's collector cannot break, leaking every forward without a backward.
        # ``detach`` keeps the data and the version counter and drops the link to the base.
        ctx.save_for_backward(*(t.detach() if t._is_view() else t for t in saved))
        if rt.own_checks:  # see _apply_unchecked
            ctx.versions = [version_of(t) for t in saved]
        ctx.runtime = rt
        if rt.tangent_use is not None:  # an undefined gradient is None in backward, not zeros
            ctx.set_materialize_grads(False)
            if rt.shapes is not None:  # its zeros, if the backward graph needs them: this size
                ctx.sizes = rt.shapes.bind(inputs)
        result = tuple(outs[:k])
        unview = rt.unview
        if not unview:  # once: as with ``clone``, the graph's sharing is the same every call
            unview.append(lone_views(rt.signature, inputs, outs))
        if unview[0]:
            result = tuple(unviewed(t) if j in unview[0] else t for j, t in enumerate(result))
        if rt.non_differentiable:
            ctx.mark_non_differentiable(*(result[j] for j in rt.non_differentiable))
        return result

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        rt: Runtime = ctx.runtime
        result: list[torch.Tensor | None] = [None] * len(ctx.needs_input_grad)
        if all(grads[j] is None for j in rt.signature.grad_outputs):
            return tuple(result)  # no output gradient reaches this node: eager's None grads
        if torch.is_grad_enabled():  # create_graph=True: compute without a graph, then guard
            with torch.no_grad():
                computed = no_double_backward(_run_backward(ctx, rt, grads))
        else:  # the engine already turned grad mode off
            computed = _run_backward(ctx, rt, grads)
        for i, g in zip(rt.signature.grad_inputs, computed, strict=True):
            result[1 + i] = g
        return tuple(result)


def _run_backward(ctx: Any, rt: Runtime, grads: Sequence[torch.Tensor]) -> list[Any]:
    assert rt.backward is not None
    tangents: list[Any] = [grads[j] for j in rt.signature.grad_outputs]
    missing: frozenset[int] = frozenset()
    if rt.tangent_use is not None and any(t is None for t in tangents):
        tangents, missing = rt.tangent_use.fill(tangents, getattr(ctx, "sizes", None))
    tangents = [t.contiguous() for t in tangents]
    saved = ctx.saved_tensors
    if rt.own_checks:
        assert rt.tangent_use is not None
        check_versions(rt, saved, ctx.versions, rt.tangent_use.needed(missing))
    if rt.number_saved:
        saved = list(saved)
        for i, number in zip(rt.number_saved, ctx.numbers, strict=True):
            saved.insert(i, number)
    backward = rt.backward_for(missing)
    boxed = getattr(backward, "call_boxed", None)
    if boxed is None:
        computed = list(backward(*saved, *tangents))
    else:  # the callee empties the list and drops each value after its last use
        args = [*saved, *tangents]
        del saved, tangents
        ctx.maybe_clear_saved_tensors()  # (kept under retain_graph=True)
        computed = list(boxed(args))
    if missing:  # an input reached only through undefined gradients: None, as in eager
        assert rt.tangent_use is not None
        computed = rt.tangent_use.mask(computed, missing)
    return computed


def _apply_unchecked(rt: Runtime, inputs: Sequence[torch.Tensor]) -> Sequence[Any]:
    """Apply with autograd's check of saved tensors off for this node (saved-tensor hooks
    turn it off): one node holds what eager keeps in many, and eager checks only those of
    the formulas a backward pass runs. ``b.abs()`` returned unused, then ``b`` written: eager
    never runs abs's formula; this node would raise for its saved ``b``.
    :func:`check_versions` checks the saved values the defined gradients need instead."""
    try:
        torch._C._autograd._push_saved_tensors_default_hooks(_pack, _same)
    except RuntimeError:  # saved-tensor hooks disabled: autograd checks every saved value
        return CompiledFunction.apply(rt, *inputs)  # type: ignore[no-untyped-call,no-any-return]
    try:
        return CompiledFunction.apply(rt, *inputs)  # type: ignore[no-untyped-call,no-any-return]
    finally:
        torch._C._autograd._pop_saved_tensors_default_hooks()


def _pack(t: torch.Tensor) -> torch.Tensor:
    # a saved output comes with its autograd node: kept as it is, node -> output -> node
    # would be a cycle (see CompiledFunction.forward); detach keeps data and version counter
    return t.detach()


def _same(t: Any) -> Any:
    return t


def check_versions(
    rt: Runtime, saved: Sequence[torch.Tensor], versions: Sequence[int], needed: Sequence[int]
) -> None:
    """Raise autograd's error if a saved value in ``needed`` (positions among all saved
    values, numbers included) was written in place after the forward pass.

    >>> class R: number_saved = ()
    >>> x = torch.zeros(2); v = x._version; _ = x.add_(1)
    >>> check_versions(R(), [x], [v], [0])  # type: ignore[arg-type]
    Traceback (most recent call last):
    RuntimeError: one of the variables needed for gradient computation has been modified ...
    """
    numbers = set(rt.number_saved)
    positions = [k for k in range(len(saved) + len(numbers)) if k not in numbers]
    wanted = set(needed)
    for t, k, before in zip(saved, positions, versions, strict=True):
        if k in wanted and version_of(t) != before:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by "
                f"an inplace operation: [{t.type()} {list(t.shape)}], saved by a compiled "
                f"graph, is at version {version_of(t)}; expected version {before} instead"
            )


# ``CompiledFunction.apply`` without the Python layer of ``Function.apply`` (default-argument
# binding and functorch's dead-wrapper unwrapping, about 3 us a call): the C entry point.
_apply = super(torch.autograd.Function, CompiledFunction).apply


DOUBLE_BACKWARD = (
    b"double backward through an aot_compile.d function is not supported: its backward graph "
    b"is compiled and not differentiable; run the function eagerly to differentiate twice"
)


def no_double_backward(grads: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Gradients that raise a clear error if a second backward pass reaches them.

    >>> (g,) = no_double_backward([torch.ones(3)])
    >>> g.sum().backward()
    Traceback (most recent call last):
    RuntimeError: double backward through an aot_compile.d function is not supported: ...
    """
    present = [g for g in grads if g is not None]
    if not present:
        return grads
    delayed = torch._C._functions.DelayedError(DOUBLE_BACKWARD, len(present))
    out = delayed(*(g.detach().requires_grad_() for g in present))
    wrapped = iter((out,) if isinstance(out, torch.Tensor) else out)
    return [next(wrapped) if g is not None else None for g in grads]
