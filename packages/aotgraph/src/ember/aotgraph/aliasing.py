"""Inputs that share storage, and graph outputs that share it where eager's do not.

Functionalization treats every graph input as memory of its own: a graph traced for
``f(base, base[0])`` that writes ``base[0]`` and then reads ``base`` reads the old
values. When inputs share a storage and the fake run saw one of them written,
:class:`Merge` hands the graph one *base* per storage instead (a flat view of the
storage from offset 0 to the end of its last input) and rebuilds each input inside
the graph with ``as_strided``: functionalization then follows every write through
the base to every other input, and the runtime writes the base back once.

>>> import torch
>>> x = torch.arange(6.0).reshape(3, 2)
>>> merge = Merge.of([x, x[0], torch.zeros(1)], versions=(1, 1, 0), grad=False)
>>> [tuple(t.shape) for t in merge.inputs([x, x[0], torch.zeros(1)])]
[(6,), (1,)]
>>> [tuple(t.shape) for t in merge.wrap(lambda *ts: ts)(torch.arange(6.0), torch.zeros(1))]
[(3, 2), (2,), (1,)]

:func:`outputs_to_clone` finds the graph outputs a compiled graph returned in one
storage (``x % 3`` and ``torch.remainder(x, 3)``, merged as one computation) or in
an input's storage where eager returns new tensors: the runtime clones those.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ember.aotgraph.eager_checks import EagerOnly, Unsupported

__all__ = [
    "Group",
    "Merge",
    "fresh_copy",
    "outputs_to_clone",
    "own_views",
    "restride",
    "viewed_input",
]


@dataclass(frozen=True, slots=True)
class Group:
    """Inputs sharing one storage: ``members`` are ``(input, size, stride, offset)``; the
    graph gets ``length`` elements of the storage from offset 0 in place of the first."""

    leader: int
    length: int
    members: tuple[tuple[int, tuple[int, ...], tuple[int, ...], int], ...]


@dataclass(frozen=True, slots=True)
class Merge:
    """Which inputs the graph receives merged, one base per shared storage."""

    groups: tuple[Group, ...]
    kept: tuple[int, ...]  # for each graph input, the input it is (a group's leader: its base)
    count: int  # inputs before merging

    @staticmethod
    def of(inputs: Sequence[Any], versions: Sequence[int], *, grad: bool) -> Merge | None:
        """The merge for ``inputs`` (None: nothing to merge). ``versions`` (from the fake run)
        says which inputs are written. Shared storages that cannot be merged (members of
        other dtypes, or needing gradients) and are written
        raise :class:`~ember.aotgraph.eager_checks.Unsupported`."""
        by_storage: dict[int, list[int]] = {}
        for i, t in enumerate(inputs):
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                by_storage.setdefault(t.untyped_storage()._cdata, []).append(i)
        groups = []
        for members in by_storage.values():
            written = any(k < len(versions) and versions[k] > 0 for k in members)
            if len(members) < 2 or not written:
                continue
            _check_mergeable([inputs[k] for k in members], members, grad)
            groups.append(_group(inputs, members))
        if not groups:
            return None
        dropped = {k for g in groups for k, *_ in g.members if k != g.leader}
        kept = tuple(i for i in range(len(inputs)) if i not in dropped)
        return Merge(tuple(groups), kept, len(inputs))

    def inputs(self, inputs: Sequence[Any]) -> list[Any]:
        """The graph's inputs for a call with ``inputs``: views of the caller's storages."""
        out = list(inputs)
        for g in self.groups:
            out[g.leader] = inputs[g.leader].as_strided((g.length,), (1,), 0)
        return [out[i] for i in self.kept]

    def graph_index(self, i: int) -> int:
        """The graph input that input ``i`` (not a merged one) became."""
        return self.kept.index(i)

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` as a function of the graph's inputs: each merged input rebuilt as a view."""

        def merged(*graph_inputs: Any) -> Any:
            args: list[Any] = [None] * self.count
            for pos, i in enumerate(self.kept):
                args[i] = graph_inputs[pos]
            for g in self.groups:
                base = args[g.leader]
                for k, size, stride, offset in g.members:
                    args[k] = base.as_strided(size, stride, offset)
            return fn(*args)

        return merged


def _check_mergeable(tensors: list[torch.Tensor], members: list[int], grad: bool) -> None:
    first = tensors[0]
    same = all(t.dtype == first.dtype and t.device == first.device for t in tensors)
    if not same:
        raise Unsupported(
            f"aot_compile: inputs {members} share storage with different dtypes or devices "
            "and one is written in place; run this function eagerly"
        )
    if grad and any(t.requires_grad for t in tensors):
        raise Unsupported(
            f"aot_compile: inputs {members} share storage, one requires grad and one is "
            "written in place; run this function eagerly"
        )


def _group(inputs: Sequence[Any], members: list[int]) -> Group:
    specs = []
    end = 0
    for k in members:
        t = inputs[k]
        offset = int(t.storage_offset())
        end = max(end, _extent(t.shape, t.stride(), offset))
        specs.append((k, tuple(t.shape), tuple(t.stride()), offset))
    return Group(members[0], end, tuple(specs))


def own_views(
    fn: Callable[..., Any],
    restrided: Sequence[tuple[int, Any]],
    written: Sequence[int],
    inputs: Sequence[Any],
    grad: bool,
) -> tuple[Callable[..., Any], tuple[int, ...]]:
    """``fn`` with each input whose metadata it changes in place (``t_``, ``unsqueeze_``,
    ``resize_``) replaced by a view of it: the metadata change stays on the view, where the
    graph can follow it, while writes still reach the input (functionalization copies them
    back); :func:`restride` gives the caller's tensor its new metadata after the call.

    Some inputs are *replaced* by a copy instead, whose final value ``fn`` then also
    returns, after its own outputs: one resized past its storage (``resize_``, an ``out=``
    argument), and each of ``written`` (inputs that require grad and are written: the copy
    keeps the value before the write for the gradient). The second result lists them.

    >>> f, replaced = own_views(lambda x: x.t_(), [(0, None)], [], [torch.zeros(2, 3)], False)
    >>> x = torch.zeros(2, 3)
    >>> f(x).shape, x.shape, replaced
    (torch.Size([3, 2]), torch.Size([2, 3]), ())
    """
    for i, _ in restrided:
        if grad and inputs[i].requires_grad:
            raise Unsupported(
                f"aot_compile: input {i} requires grad and its metadata is changed in place "
                "(t_, resize_, ...); run this function eagerly"
            )
    grown = [i for i, meta in restrided if meta is not None and _grows(inputs[i], meta)]
    replaced = (*grown, *written)
    views = [i for i, _ in restrided if i not in grown]

    def run(*args: Any) -> Any:
        args_ = list(args)
        for i in views:
            t = args_[i]
            args_[i] = t.as_strided(t.size(), t.stride(), t.storage_offset())
        for i in replaced:
            args_[i] = args_[i].clone()
        out = fn(*args_)
        return (out, tuple(args_[i] for i in replaced)) if replaced else out

    return run, replaced


def restride(
    inputs: Sequence[torch.Tensor],
    restrided: Sequence[tuple[int, Any]],
    replaced: Sequence[int] = (),
    values: Sequence[torch.Tensor] = (),
) -> None:
    """Give each input the size, stride and offset eager's in-place ops left it with, and
    each ``replaced`` one its value from ``values`` (first the storage it needs). A value
    that requires grad is copied under grad mode: the input's history moves onto it.

    >>> from ember.aotgraph.trace import TensorMeta
    >>> x = torch.zeros(2, 3)
    >>> restride([x], [(0, TensorMeta.of(torch.zeros(2, 3).t()))]); x.shape
    torch.Size([3, 2])
    >>> y = torch.zeros(0)
    >>> restride([y], [(0, TensorMeta.of(torch.zeros(2)))], [0], [torch.ones(2)]); y
    tensor([1., 1.])
    """
    new = dict(zip(replaced, values, strict=True))
    for i, meta in restrided:
        t = inputs[i]
        if i in new:
            need = _extent(meta.size, meta.stride, meta.offset) * t.element_size()
            if t.untyped_storage().nbytes() < need:
                t.untyped_storage().resize_(need)
        t.as_strided_(meta.size, meta.stride, meta.offset)
    for i, value in new.items():
        with torch.set_grad_enabled(torch.is_grad_enabled() and value.requires_grad):
            inputs[i].copy_(value)


def _grows(t: torch.Tensor, meta: Any) -> bool:
    """Whether the layout ``meta`` reaches past ``t``'s storage."""
    capacity = t.untyped_storage().nbytes() // t.element_size()
    return _extent(meta.size, meta.stride, meta.offset) > capacity


def _extent(size: Sequence[int], stride: Sequence[int], offset: int) -> int:
    """Elements of storage a tensor of this layout reaches, from the storage's start."""
    if any(n == 0 for n in size):
        return offset
    return offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) + 1


def storage_groups(values: Sequence[Any]) -> tuple[int, ...]:
    """For each value, the first of ``values`` sharing its storage (itself for a number).

    >>> x = torch.zeros(4)
    >>> storage_groups([x, torch.zeros(1), x[1:], 2.0])
    (0, 1, 0, 3)
    """
    first: dict[int, int] = {}
    out = []
    for k, v in enumerate(values):
        key = v.untyped_storage()._cdata if isinstance(v, torch.Tensor) else -k - 1
        out.append(first.setdefault(key, k))
    return tuple(out)


def lone_views(sig: Any, inputs: Sequence[Any], outs: Sequence[Any]) -> tuple[int, ...]:
    """Graph outputs that are views of a base no other output (saved values included) nor
    input shares, where eager's output is no view: a compiled graph returns ``mm(...).view``
    where eager's ``_unsafe_view`` made a plain tensor. Returned from an
    ``autograd.Function`` as views, autograd would take them for one of several views and the
    runtime would copy each (hf-llama's logits, 0.03 ms a step); :func:`unviewed` hands out
    the same memory as a plain tensor instead.

    >>> from ember.aotgraph.signature import Output
    >>> sig = type("Sig", (), {"outputs": (Output("graph", 0), Output("graph", 1, view=True))})
    >>> a, b = torch.ones(4), torch.ones(4)
    >>> lone_views(sig, [], [a.view(2, 2), b.view(2, 2)])  # the second is a view in eager
    (0,)
    >>> lone_views(sig, [], [a.view(2, 2), b.view(2, 2), a])  # the first's base is saved
    ()
    """
    eager = {o.index: o for o in sig.outputs if o.kind == "graph"}
    storages = [t.untyped_storage()._cdata for t in (*inputs, *outs) if isinstance(t, torch.Tensor)]
    lone = []
    for j, t in enumerate(outs):
        o = eager.get(j)
        if o is None or o.view or o.creation or type(t) is not torch.Tensor:
            continue  # (a subclass keeps its type and its view)
        if t._is_view() and storages.count(t.untyped_storage()._cdata) == 1:
            lone.append(j)
    return tuple(lone)


def unviewed(t: torch.Tensor) -> torch.Tensor:
    """``t``'s memory as a tensor that is no view (no ``_base``), with its size, strides and
    offset: for a view whose base nothing else can reach (:func:`lone_views`).

    >>> v = torch.arange(4.0).view(2, 2)
    >>> u = unviewed(v)
    >>> u._is_view(), u.data_ptr() == v.data_ptr(), u.tolist()
    (False, True, [[0.0, 1.0], [2.0, 3.0]])
    """
    out = torch.empty((0,), dtype=t.dtype, device=t.device)
    return out.set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())


def fresh_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in new memory, with its strides and offset, and a view (of a hidden
    base) where ``t`` is one, as eager's output of the same expression would be.

    >>> y = torch.arange(6.0).reshape(2, 3).t()
    >>> c = fresh_copy(y)
    >>> c.stride(), c._is_view(), c.untyped_storage().data_ptr() != y.untyped_storage().data_ptr()
    ((1, 3), True, True)
    """
    if not t._is_view():
        return t.clone()
    base = t.new_empty(_extent(t.shape, t.stride(), int(t.storage_offset())))
    view = base.as_strided(t.shape, t.stride(), t.storage_offset())
    view.copy_(t)
    return view


def outputs_to_clone(
    expected: Sequence[int], inputs: Sequence[Any], outs: Sequence[Any]
) -> tuple[int, ...]:
    """The graph outputs to copy so that they share storage no more than eager's do:
    ``expected`` is :func:`storage_groups` of eager's (fake) graph outputs.

    >>> y = torch.ones(2)
    >>> outputs_to_clone((0, 1), [], [y, y]), outputs_to_clone((0, 0), [], [y, y])
    ((1,), ())
    >>> x = torch.ones(2)
    >>> outputs_to_clone((0,), [x], [x])  # a new tensor in eager, the input itself here
    (0,)
    """
    if not expected:
        return ()
    got = storage_groups(outs[: len(expected)])
    taken = {t.untyped_storage()._cdata for t in inputs if isinstance(t, torch.Tensor)}
    clone = []
    for j, want in enumerate(expected):
        out = outs[j]
        if not isinstance(out, torch.Tensor) or want != j:
            continue
        if got[j] != j or out.untyped_storage()._cdata in taken:
            clone.append(j)
    return tuple(clone)


def viewed_input(leaf: torch.Tensor, fakes: list[Any], sharing: list[int], grad: bool) -> int:
    """Which of the inputs ``sharing`` the output's storage it is a view of.

    The runtime rebuilds the output with ``as_strided`` on that input, and autograd sends
    the output's gradient to it: only within that input's own elements. With two
    overlapping inputs (``base[:-1]``, ``base[1:]``) the first is not always right, so
    follow the output's autograd history back through its view nodes to an input's.
    Without gradients any of them gives the values."""
    if len(sharing) == 1 or not (grad and leaf.requires_grad):
        return sharing[0]
    nodes: dict[int, int] = {}
    for i in sharing:  # one input passed twice: the first
        nodes.setdefault(id(_grad_node(fakes[i])), i)
    node, steps = leaf.grad_fn, 0
    while node is not None and steps < _HISTORY_STEPS:
        if id(node) in nodes:
            return nodes[id(node)]
        edges = [n for n, _ in node.next_functions if n is not None]
        node, steps = (edges[0] if len(edges) == 1 else None), steps + 1
    raise EagerOnly(
        f"an output is a view of one of inputs {sharing}, which share its storage, and "
        "its history does not say which"
    )


_HISTORY_STEPS = 64  # view nodes followed back from an output to an input


def _grad_node(t: torch.Tensor) -> Any:
    """The autograd node a view of ``t`` records as its parent."""
    if t.grad_fn is not None or not t.requires_grad:
        return t.grad_fn
    with torch.enable_grad():  # a leaf: its gradient accumulator, the parent of its views
        view = t.view_as(t).grad_fn
    return None if view is None else view.next_functions[0][0]


def unwritten_sharing(values: Sequence[Any], versions: Sequence[int]) -> frozenset[int]:
    """The unwritten tensors among ``values`` that share a storage with another one (none
    when ``versions`` is not one per value: inputs were merged, see :class:`Merge`).

    >>> x = torch.zeros(2, 3)
    >>> sorted(unwritten_sharing([x, torch.zeros(3), x[1]], versions=(0, 1, 0)))
    [0, 2]
    """
    if len(versions) != len(values):
        return frozenset()
    storages = [v.untyped_storage()._cdata if isinstance(v, torch.Tensor) else None for v in values]
    return frozenset(
        i
        for i, s in enumerate(storages)
        if s is not None and storages.count(s) > 1 and not versions[i]
    )
