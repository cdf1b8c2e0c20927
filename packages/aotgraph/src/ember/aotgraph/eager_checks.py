"""In-place ops that eager checks when they run and a functional graph would not.

Eager refuses to write into a tensor whose elements share memory (an ``expand``ed
input: "more than one element of the written-to tensor refers to a single memory
location"), to write a result whose dtype cannot be cast to the destination's
(``bool_tensor.mul_(2.5)``) and to read a source that partly overlaps the destination
(``b.mul_(b[0])``; where it cannot tell, it reads what it has already written). Fake
tensors skip these checks, and functionalization turns the op into an out-of-place
one that succeeds, so the compiled graph would
return an answer where eager raises (or, for the few ops that accept overlapping
destinations, a different answer). :func:`check_mutations` looks at the first,
unfunctionalized trace and raises :class:`EagerOnly` for such a node: the backend
fails, the frame runs eagerly (the reason recorded in its stats), and eager raises
its own error.

>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> gm = make_fx(lambda x: x.expand(3, 4).add_(1), tracing_mode="fake")(torch.ones(1, 4))
>>> try:
...     check_mutations(gm)
... except EagerOnly as e:
...     print(str(e).split(":")[0])
aten.add_.Tensor writes into a tensor whose elements share memory (an expanded tensor)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

__all__ = ["EagerOnly", "Unsupported", "check_mutations", "check_operand_dtypes"]

_OVERLAP_YES = 1  # torch._debug_has_internal_overlap: 0 no, 1 yes, 2 too hard to tell


class Unsupported(NotImplementedError):
    """A graph ``aot_compile`` does not compile yet, with the reason: the caller runs it
    eagerly and records why. Each raise site is a case ember could support later (the
    closing notes of issue 16 list them); it is a ``NotImplementedError`` for callers that
    catch that.

    >>> raise Unsupported("aot_compile: create_graph=True")
    Traceback (most recent call last):
    ember.aotgraph.eager_checks.Unsupported: aot_compile: create_graph=True
    """


class EagerOnly(Exception):
    """A graph whose meaning only eager can give: the caller runs it eagerly.

    >>> raise EagerOnly("aten.mul_.Tensor: a float result written into bool")
    Traceback (most recent call last):
    ember.aotgraph.eager_checks.EagerOnly: aten.mul_.Tensor: a float result written into bool
    """


def _written(node: torch.fx.Node) -> list[Any]:
    """The fake values of the arguments ``node``'s op writes into."""
    schema = node.target._schema  # type: ignore[union-attr]
    out: list[Any] = []
    for k, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = node.args[k] if k < len(node.args) else node.kwargs.get(arg.name)
        out.extend(
            v.meta.get("val") for v in pytree.tree_leaves(value) if isinstance(v, torch.fx.Node)
        )
    return [v for v in out if isinstance(v, torch.Tensor)]


def _overlapping(node: torch.fx.Node, twin: Any) -> str | None:
    if any(torch._debug_has_internal_overlap(t) == _OVERLAP_YES for t in _written(node)):
        return "writes into a tensor whose elements share memory (an expanded tensor)"
    return None


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The first and last storage element ``t`` can reach."""
    start = int(t.storage_offset())
    last = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride(), strict=True))
    return start, start + last


def _same_view(t: torch.Tensor, u: torch.Tensor) -> bool:
    return (t.shape, t.stride(), t.storage_offset()) == (u.shape, u.stride(), u.storage_offset())


def _read_overlap(node: torch.fx.Node, twin: Any) -> str | None:
    """A source sharing memory with the destination but not the same view: eager raises
    (both dense) or reads what it has already written, a functional graph the old values."""
    written = _written(node)
    reads = [
        v.meta.get("val")
        for v in pytree.tree_leaves((node.args, node.kwargs))
        if isinstance(v, torch.fx.Node)
    ]
    for w in written:
        if w.layout != torch.strided:
            continue
        storage = w.untyped_storage()._cdata
        lo, hi = _span(w)
        for r in reads:
            if not isinstance(r, torch.Tensor) or r is w or r.numel() == 0 or w.numel() == 0:
                continue
            if r.layout != torch.strided or r.untyped_storage()._cdata != storage:
                continue
            r_lo, r_hi = _span(r)
            if r_lo <= hi and lo <= r_hi and not _same_view(r, w):
                return "reads a tensor overlapping the one it writes"
    return None


def _uncastable(node: torch.fx.Node, twin: Any) -> str | None:
    """The out-of-place twin's result dtype, if it cannot be cast to the destination's."""
    if twin is None:
        return None
    fakes = pytree.tree_map_only(torch.fx.Node, lambda n: n.meta.get("val"), node.args)
    dest = fakes[0]
    try:
        value = twin(*fakes, **node.kwargs)
    except Exception:  # the twin disagrees with the op's arguments: nothing to compare
        return None
    if not (isinstance(dest, torch.Tensor) and isinstance(value, torch.Tensor)):
        return None
    if torch.can_cast(value.dtype, dest.dtype):
        return None
    return f"writes a {value.dtype} result into a {dest.dtype} tensor"


# Each rule returns why only eager can run the node, or None.
RULES: tuple[Callable[[torch.fx.Node, Any], str | None], ...] = (
    _overlapping,
    _read_overlap,
    _uncastable,
)


def check_mutations(gm: torch.fx.GraphModule) -> None:
    """Raise :class:`EagerOnly` if an in-place node of ``gm`` (an aten graph whose nodes
    carry fake values) is one that eager checks at run time and would refuse."""
    from ember.aotgraph.trace import _functional_twin

    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        if not target._schema.is_mutable:
            continue
        twin = _functional_twin(node)
        for rule in RULES:
            why = rule(node, twin)
            if why is not None:
                raise EagerOnly(f"{target} {why}: eager decides what happens (it usually raises)")


aten = torch.ops.aten

# Products whose CPU kernels refuse operands of two dtypes ("expected m1 and m2 to have the
# same dtype") but whose meta functions accept them: traced with fake tensors, an unused
# one would be dropped and nothing would raise.
SAME_DTYPE_OPS = frozenset(
    {
        aten.mm.default,
        aten.bmm.default,
        aten.mv.default,
        aten.dot.default,
        aten.vdot.default,
        aten.addmm.default,
        aten.addmv.default,
        aten.baddbmm.default,
        aten.addbmm.default,
    }
)


def check_operand_dtypes(gm: torch.fx.GraphModule) -> None:
    """Raise :class:`EagerOnly` if a product in ``gm`` (fake values in ``meta["val"]``)
    has tensor operands of two dtypes, which eager refuses when it runs the op.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> x = torch.ones(2, 2)
    >>> gm = make_fx(lambda a, b: a @ b, tracing_mode="fake")(x, x.double())
    >>> try:
    ...     check_operand_dtypes(gm)
    ... except EagerOnly as e:
    ...     print(str(e).split(":")[0])
    aten.mm.default has operands of two dtypes (torch.float32, torch.float64)
    """
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in SAME_DTYPE_OPS:
            continue
        vals = [a.meta.get("val") for a in node.args if isinstance(a, torch.fx.Node)]
        dtypes = sorted({v.dtype for v in vals if isinstance(v, torch.Tensor)}, key=str)
        if len(dtypes) > 1:
            listed = ", ".join(map(str, dtypes))
            raise EagerOnly(f"{node.target} has operands of two dtypes ({listed}): eager raises")
