"""Undefined output gradients: which inputs' gradients stay ``None``, as in eager.

Eager autograd passes an *undefined* gradient along an edge that no output's gradient
reaches (``v = b * 0.5`` used by nothing that is differentiated), and a leaf reached only
through such edges keeps ``.grad is None``. An ``autograd.Function`` materialises those
gradients as zeros by default, so the compiled function's backward graph would turn them
into zero gradients for its inputs. The runtime turns materialising off and, with
:class:`TangentUse`, fills the tangents the backward graph needs with zeros, then drops
the input gradients that read none of the defined tangents.

>>> import torch
>>> gm = torch.fx.symbolic_trace(lambda s, t1, t2: [t1 * s, t2 * 2])
>>> use = TangentUse.of(gm, [torch.ones(2), torch.ones(3)])
>>> use.deps
(frozenset({0}), frozenset({1}))
>>> tangents, missing = use.fill([torch.ones(2), None])
>>> [t.shape for t in tangents], missing
([torch.Size([2]), torch.Size([3])], frozenset({1}))
>>> use.mask([torch.ones(2), torch.zeros(3)], missing)
[tensor([1., 1.]), None]
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

__all__ = ["TangentUse", "tangent_reads", "without_undefined"]


@dataclass(frozen=True, slots=True)
class TangentUse:
    """How a backward graph reads its tangents: each tangent's shape, and the tangents each
    gradient output depends on. Example: see the module docstring."""

    # one per tangent: shape (SymInts in a graph with symbolic sizes), dtype, device
    metas: tuple[tuple[tuple[Any, ...], torch.dtype, torch.device], ...]
    deps: tuple[frozenset[int], ...]  # per backward output: the tangents it reads
    # per saved value: the tangents of the gradient formulas that read it (empty: read by
    # none, or only by tangent-free nodes; then always needed)
    saved: tuple[frozenset[int], ...] = ()

    @staticmethod
    def of(backward: torch.fx.GraphModule, tangents: Sequence[Any]) -> TangentUse | None:
        """From the backward graph and its tangents' example values (the last placeholders);
        ``None`` when a tangent is not a tensor (then grads stay materialised). A shape may
        hold SymInts: :meth:`fill` is then given the symbols' values."""
        metas = []
        for t in tangents:
            if not isinstance(t, torch.Tensor):
                return None
            metas.append((tuple(t.shape), t.dtype, t.device))
        placeholders = list(backward.graph.find_nodes(op="placeholder"))
        first = len(placeholders) - len(tangents)
        reads = tangent_reads(backward.graph, len(tangents))
        (out,) = backward.graph.find_nodes(op="output")
        results = out.args[0]
        results = results if isinstance(results, list | tuple) else [results]
        deps = tuple(reads[r] if isinstance(r, torch.fx.Node) else frozenset() for r in results)
        saved = tuple(_formulas_reading(p, reads) for p in placeholders[:first])
        return TangentUse(tuple(metas), deps, saved)

    def needed(self, missing: frozenset[int]) -> list[int]:
        """The saved values a backward pass with the tangents ``missing`` undefined reads
        in a formula eager would run: eager checks those for in-place writes, no others.

        >>> gm = torch.fx.symbolic_trace(lambda s1, s2, t1, t2: [t1 * s1, t2 * s2.sign()])
        >>> use = TangentUse.of(gm, [torch.ones(2), torch.ones(2)])
        >>> use.saved, use.needed(frozenset({1}))
        ((frozenset({0}), frozenset({1})), [0])
        """
        return [k for k, reads in enumerate(self.saved) if not reads or reads - missing]

    def fill(
        self, tangents: Sequence[torch.Tensor | None], sizes: dict[Any, int] | None = None
    ) -> tuple[list[Any], frozenset[int]]:
        """The tangents with zeros for the undefined ones, and which those were; ``sizes``:
        the symbols' values in this call, where the shapes are symbolic."""
        missing = frozenset(k for k, t in enumerate(tangents) if t is None)
        full = [
            t if t is not None else _zeros(*self.metas[k], sizes) for k, t in enumerate(tangents)
        ]
        return full, missing

    def mask(self, grads: Sequence[Any], missing: frozenset[int]) -> list[Any]:
        """``None`` for each gradient that reads only undefined tangents (eager's undefined
        gradient); a gradient that reads no tangent at all is kept."""
        return [
            None if deps and deps <= missing else g
            for g, deps in zip(grads, self.deps, strict=True)
        ]


def tangent_reads(graph: torch.fx.Graph, n_tangents: int) -> dict[torch.fx.Node, frozenset[int]]:
    """For each node of a backward graph (tangents: the last placeholders), the tangents
    it depends on."""
    placeholders = list(graph.find_nodes(op="placeholder"))
    first = len(placeholders) - n_tangents
    reads: dict[torch.fx.Node, frozenset[int]] = {
        p: frozenset({k - first}) if k >= first else frozenset() for k, p in enumerate(placeholders)
    }
    for node in graph.nodes:
        if node.op != "placeholder":
            found: frozenset[int] = frozenset()
            for arg in node.all_input_nodes:
                found |= reads[arg]
            reads[node] = found
    return reads


def without_undefined(
    backward: torch.fx.GraphModule, n_tangents: int, missing: frozenset[int]
) -> torch.fx.GraphModule:
    """A copy of ``backward`` that skips what eager skips for the undefined tangents
    ``missing`` (still passed, as zeros): a gradient sum ``add(g, h)`` with ``h`` read
    only from undefined tangents is ``g``, as eager's engine adds only defined gradients.
    A zero tangent through a formula is not always zero: ``0 * (1 / x**2)`` is NaN where
    ``x`` is 0, and eager never ran that formula.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda s, t1, t2: [t1 + t2 / s])(*torch.ones(3, 1))
    >>> pruned = without_undefined(gm, 2, frozenset({1}))
    >>> pruned(torch.zeros(1), torch.ones(1), torch.zeros(1))
    [tensor([1.])]
    """
    gm = torch.fx.GraphModule(backward, copy.deepcopy(backward.graph))
    reads = tangent_reads(gm.graph, n_tangents)

    def dead(node: Any) -> bool:
        return isinstance(node, torch.fx.Node) and bool(reads[node]) and reads[node] <= missing

    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _SUMS or dead(node):
            continue
        x, y = node.args[:2]
        live = y if dead(x) else x if dead(y) else None
        if isinstance(live, torch.fx.Node) and _same_meta(live, node):
            node.replace_all_uses_with(live)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


_SUMS = (torch.ops.aten.add.Tensor,)


def _same_meta(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    va, vb = a.meta.get("val"), b.meta.get("val")
    if not isinstance(va, torch.Tensor) or not isinstance(vb, torch.Tensor):
        return False
    return va.shape == vb.shape and va.dtype == vb.dtype and va.stride() == vb.stride()


def _formulas_reading(
    saved: torch.fx.Node, reads: dict[torch.fx.Node, frozenset[int]]
) -> frozenset[int]:
    """The tangents read by the first tangent-reading nodes that use ``saved`` (directly or
    through tangent-free nodes such as ``sign(saved)``): the formulas that need it."""
    found: frozenset[int] = frozenset()
    todo, seen = [saved], {saved}
    while todo:
        for user in todo.pop().users:
            if user.op == "output" or user in seen:
                continue
            seen.add(user)
            if reads[user]:
                found |= reads[user]
            else:
                todo.append(user)
    return found


def _zeros(
    size: tuple[Any, ...],
    dtype: torch.dtype,
    device: torch.device,
    sizes: dict[Any, int] | None = None,
) -> torch.Tensor:
    if sizes is not None:  # symbolic: this call's sizes (sympy: imported by such graphs only)
        from ember.aotgraph.symbolic import evaluate

        size = tuple(evaluate(s, sizes) for s in size)
    return torch.zeros(size, dtype=dtype, device=device)
