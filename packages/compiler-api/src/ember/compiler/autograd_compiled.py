"""Compiled autograd: ``backward()`` captured into one FX graph and compiled by a backend.

Inside ``with compiled_autograd(compiler=...)``, each ``backward()`` on this thread
(``Tensor.backward`` and ``torch.autograd.backward``):

1. walks the autograd graph from the roots into a node list and a structure key
   (:mod:`ember.compiler.autograd_graph`): node types, edges, saved sizes and
   numbers, hook code objects, which saved tensors share data;
2. on a new key, runs the real backward once while recording its aten ops
   (:mod:`ember.compiler.autograd_record`): saved tensors and root gradients are
   graph *inputs*, outputs are the gradients reaching each leaf and each
   ``retain_grad()`` tensor; the graph goes to the backend, and the compiled
   callable is checked once against the recorded values;
3. on a known key, gathers the saved tensors by walking the same structure and runs
   the compiled callable: no recording, no recompile for new values;
4. accumulates as eager's engine does: ``.grad`` None is set, else added in place;
   a retained non-leaf's ``.grad`` is set, else summed.

What cannot be compiled runs in the eager engine, and the reason is counted in
:attr:`compiled_autograd.stats` (never a wrong gradient): ``create_graph=True``,
``inputs=``, non-CPU tensors, sparse gradients, post-accumulate-grad hooks, a tensor
hook that returns None (a side effect), a Python hook registered on a C++ node (the
key cannot see it), a backward that reads tensors the graph does not save. ember's own
AOT backward nodes are traced: ``aot_eager``'s backward is an FX graph, and for
``inductor`` the recording runs the aten FX graph its kernels were compiled from.

>>> import torch
>>> from ember.compiler.testing import CompileCounter
>>> counter = CompileCounter()
>>> lin = torch.nn.Linear(3, 2)
>>> for step in range(3):
...     with compiled_autograd(compiler=counter) as ca:
...         lin(torch.randn(4, 3)).square().sum().backward()
>>> counter.frame_count, ca.stats.hits, lin.weight.grad.shape
(1, 1, torch.Size([2, 3]))
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ember.compiler.autograd_graph import Walk, observe, walk
from ember.compiler.autograd_record import Recording, Source, record
from ember.compiler.backends import Backend, lookup_backend

__all__ = ["CompiledAutogradStats", "compiled_autograd", "reset"]

FREED = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward."
)


@dataclass(slots=True)
class CompiledAutogradStats:
    """What the ``backward()`` calls inside one :class:`compiled_autograd` did.

    >>> CompiledAutogradStats()
    CompiledAutogradStats(compiles=0, hits=0, eager=0, reasons=[])
    """

    compiles: int = 0  # new structures recorded and compiled
    hits: int = 0  # backward passes run by an already compiled graph
    eager: int = 0  # backward passes run by the eager engine
    reasons: list[str] = field(default_factory=list)  # why, for each eager pass


@dataclass(frozen=True, slots=True)
class _Entry:
    """One compiled structure: the callable and how to feed and read it."""

    fn: Callable[..., Any]
    inputs: tuple[Source, ...]
    outputs: tuple[int, ...]


_CACHE: dict[tuple[Any, Any], _Entry | str] = {}  # (compiler, key) -> entry, or why eager
# nodes whose saved values a hit used up: (name, sequence number, thread of the backward)
_CONSUMED: dict[tuple[str, int, int], None] = {}
_UNHASHABLE: dict[int, Any] = {}  # backends the cache names by id: kept alive, ids unique
_local = threading.local()
_patch_lock = threading.Lock()
_active = [0]  # contexts entered in any thread: torch.autograd.backward is wrapped while > 0
_original_backward = torch.autograd.backward
# hooks registered from now on are seen (a hook registered before would be skipped by a hit);
# ember.compiler's import already did this
observe()


def reset() -> None:
    """Forget every compiled backward graph (``ember.compiler.reset()`` calls this).

    >>> reset()
    """
    _CACHE.clear()
    _CONSUMED.clear()
    _UNHASHABLE.clear()


class compiled_autograd:  # a context manager, named like torch.no_grad
    """Capture each ``backward()`` in the ``with`` block into a graph compiled by ``compiler``
    (a backend name or a ``(gm, example_inputs) -> callable``); see the module docstring.

    Compiled graphs are shared by every context with the same compiler, keyed by the
    autograd graph's structure: a second step with new values reuses the graph.

    >>> x = torch.ones(3, requires_grad=True)
    >>> with compiled_autograd(compiler="eager") as ca:
    ...     (x * x).sum().backward(inputs=[x])
    >>> ca.stats.eager, ca.stats.reasons
    (1, ['backward(inputs=...)'])
    """

    def __init__(self, compiler: str | Backend = "inductor") -> None:
        self.backend: Backend = lookup_backend(compiler)
        try:  # the cache's name for the backend: itself, or its id while it stays alive
            hash(self.backend)
            self.compiler: Any = self.backend
        except TypeError:
            _UNHASHABLE.setdefault(id(self.backend), self.backend)
            self.compiler = ("id", id(self.backend))
        self.stats = CompiledAutogradStats()

    def __enter__(self) -> compiled_autograd:
        observe()
        stack = _stack()
        stack.append(self)
        with _patch_lock:
            _active[0] += 1
            torch.autograd.backward = _backward
        return self

    def __exit__(self, *exc: object) -> None:
        _stack().remove(self)
        with _patch_lock:
            _active[0] -= 1
            if _active[0] == 0:
                torch.autograd.backward = _original_backward

    def run(
        self,
        roots: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor | None] | None,
        retain_graph: bool,
    ) -> None:
        """One ``backward()`` of ``roots``: compiled, or eager with a reason."""
        filled = _unsupported(roots) or _root_grads(roots, grads)
        if isinstance(filled, str):
            return self._eager(filled, roots, grads, retain_graph)
        w = walk(roots)
        _check_not_consumed(w)
        if w.reason is not None:
            return self._eager(w.reason, roots, grads, retain_graph)
        entry = _CACHE.get((self.compiler, w.key))
        if isinstance(entry, str):
            return self._eager(entry, roots, grads, retain_graph)
        if entry is None:
            return self._compile(w, filled, retain_graph)
        self.stats.hits += 1
        values = _run_entry(entry, w, filled)
        if not retain_graph:
            _consume(w)
        accumulate(w, values, (*filled, *w.saved))

    def _eager(
        self,
        reason: str,
        roots: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor | None] | None,
        retain_graph: bool,
    ) -> None:
        self.stats.eager += 1
        self.stats.reasons.append(reason)
        _original_backward(roots, grads, retain_graph=retain_graph)

    def _compile(self, w: Walk, grads: list[torch.Tensor], retain_graph: bool) -> None:
        rec = record(w, grads, retain_graph)
        # this step's gradients: the recorded pass computed them
        accumulate(w, rec.values, (*grads, *w.saved))
        key = (self.compiler, w.key)
        if rec.graph is None:
            assert rec.refusal is not None
            _CACHE[key] = rec.refusal
            self.stats.eager += 1
            self.stats.reasons.append(rec.refusal)
            return
        self.stats.compiles += 1
        entry = _build(self.backend, rec)
        _CACHE[key] = entry
        if isinstance(entry, str):
            self.stats.reasons.append(entry)


def _stack() -> list[compiled_autograd]:
    stack: list[compiled_autograd] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _backward(
    tensors: Any,
    grad_tensors: Any = None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    grad_variables: Any = None,
    inputs: Any = None,
) -> None:
    """``torch.autograd.backward`` while a :class:`compiled_autograd` is active."""
    stack = _stack()
    odd = [
        why
        for why, on in (
            ("create_graph=True (double backward)", create_graph),
            ("backward(inputs=...)", inputs is not None),
            ("grad_variables= (deprecated)", grad_variables is not None),
        )
        if on
    ]
    if not stack or odd:
        if stack:
            stack[-1].stats.eager += 1
            stack[-1].stats.reasons.append(odd[0])
        return _original_backward(
            tensors, grad_tensors, retain_graph, create_graph, grad_variables, inputs=inputs
        )
    roots = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
    if isinstance(grad_tensors, torch.Tensor):
        grad_tensors = (grad_tensors,)
    stack[-1].run(roots, grad_tensors, bool(retain_graph))


def _unsupported(roots: Sequence[Any]) -> str | None:
    """Why these roots go to the eager engine (which raises eager's errors for bad input)."""
    if not roots or not all(isinstance(r, torch.Tensor) for r in roots):
        return "the roots are not tensors (gradient edges)"
    if any(r.grad_fn is None for r in roots):
        return "a root has no grad_fn"
    if any(r.device.type != "cpu" for r in roots):
        return "a root is not on the CPU (the engine runs device work on other threads)"
    return None


def _root_grads(
    roots: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None] | None
) -> list[torch.Tensor] | str:
    """Each root's gradient, as ``torch.autograd.backward`` makes it (ones for a scalar)."""
    given = list(grads) if grads is not None else [None] * len(roots)
    if len(given) != len(roots):
        return "grad_tensors and tensors differ in length"
    out: list[torch.Tensor] = []
    for r, g in zip(roots, given, strict=True):
        if g is None:
            if r.numel() != 1:
                return "a non-scalar root without a gradient"
            g = torch.ones_like(r, memory_format=torch.preserve_format)
        if not isinstance(g, torch.Tensor) or g.shape != r.shape or g.device != r.device:
            return "a root gradient that does not match its root"
        out.append(g)
    return out


def _build(backend: Backend, rec: Recording) -> _Entry | str:
    """The compiled entry, checked once against the recorded pass; or why it fails."""
    assert rec.graph is not None
    try:
        fn = backend(rec.graph, list(rec.examples))
        with torch.no_grad():
            got = fn(*rec.examples)
    except Exception as e:  # a backend failure: this structure runs in the eager engine
        return (
            f"the compiler failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        )
    got = [got] if isinstance(got, torch.Tensor) else list(got)
    want = [v for v in rec.values if v is not None]
    if len(got) != len(want) or not all(_close(g, v) for g, v in zip(got, want, strict=True)):
        return "the compiled graph disagrees with the recorded backward (an op it cannot see)"
    return _Entry(fn, rec.inputs, rec.outputs)


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal up to a backend's rounding (inductor reorders sums), scaled to the values."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    scale = 1.0 + float(want.detach().abs().max()) if want.numel() else 1.0
    return torch.allclose(got, want, rtol=1e-3, atol=1e-5 * scale, equal_nan=True)


def _run_entry(entry: _Entry, w: Walk, grads: Sequence[torch.Tensor]) -> list[Any]:
    """The compiled graph's gradients for ``w``'s leaves and retained tensors."""
    args = [grads[s.index] if s.kind == "grad" else w.saved[s.index] for s in entry.inputs]
    with torch.no_grad():
        outs = entry.fn(*args)
    outs = [outs] if isinstance(outs, torch.Tensor) else list(outs)
    return [outs[j] if j >= 0 else None for j in entry.outputs]


def accumulate(
    w: Walk, values: Sequence[torch.Tensor | None], owned: Sequence[torch.Tensor] = ()
) -> None:
    """Eager's accumulation: each leaf's ``.grad`` set (in the leaf's layout) or added to in
    place; a retained non-leaf's ``.grad`` set or replaced by the sum. A gradient is taken
    as it is only if no other ``.grad`` and nothing in ``owned`` (root gradients, saved
    tensors) shares its storage, as eager steals a gradient only when nothing else holds it:
    later in-place accumulation must not reach another tensor.

    >>> x = torch.ones(2, requires_grad=True)
    >>> w = walk([x.sum()])
    >>> accumulate(w, [torch.ones(2)]); accumulate(w, [torch.ones(2)]); x.grad
    tensor([2., 2.])
    """
    taken = {t.untyped_storage().data_ptr() for t in owned}
    n = len(w.leaves)
    with torch.no_grad():
        for leaf, g in zip(w.leaves, values[:n], strict=True):
            if g is None:
                continue
            if leaf.grad is None:
                leaf.grad = _layout(leaf, _own(g.detach(), taken))
            else:
                leaf.grad += g
        for t, g in zip(w.retained, values[n:], strict=True):
            if g is not None:
                t.grad = _own(g.detach(), taken) if t.grad is None else t.grad + g


def _own(g: torch.Tensor, taken: set[int]) -> torch.Tensor:
    """``g``, or a copy where its storage is already someone's (recorded in ``taken``)."""
    ptr = g.untyped_storage().data_ptr()
    if ptr in taken or g._is_view():
        g = g.clone()
        ptr = g.untyped_storage().data_ptr()
    taken.add(ptr)
    return g


def _layout(leaf: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``g`` with the leaf's strides, as AccumulateGrad's layout contract asks."""
    if g.stride() == leaf.stride() or g.numel() <= 1:
        return g
    if leaf.is_contiguous():
        return g.contiguous()
    return torch.empty_strided(leaf.shape, leaf.stride(), dtype=g.dtype).copy_(g)


def _consume(w: Walk) -> None:
    """Mark these nodes' saved values used up, as eager frees them without ``retain_graph``:
    a prehook on each raises eager's error if the engine reaches it again (a backward
    outside compiled autograd), and :func:`_check_not_consumed` raises for one inside it.
    The values themselves are freed with the graph (autograd cannot release them from
    Python)."""
    if len(_CONSUMED) > 65536:
        _CONSUMED.clear()
    thread = threading.get_ident()
    for i in w.holders:
        n = w.nodes[i]
        _CONSUMED[(n.name(), n._sequence_nr(), thread)] = None
        n.register_prehook(_freed)


def _freed(grad_outputs: Any) -> None:
    raise RuntimeError(FREED)


def _check_not_consumed(w: Walk) -> None:
    if not _CONSUMED:
        return
    thread = threading.get_ident()
    if any((n.name(), n._sequence_nr(), thread) in _CONSUMED for n in w.nodes):
        raise RuntimeError(FREED)
