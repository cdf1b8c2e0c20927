"""What a trace learned about a function, as plain data: :class:`Signature`, :class:`Output`
and :class:`TensorMeta`.

:func:`~ember.aotgraph.trace.analyze` makes them; the runtime
(:class:`~ember.aotgraph.runtime.Runtime`), aotgraph's disk cache and portable packs read
them. They live apart from the tracer so that running compiled graphs (a pack's warm start)
imports neither the tracer nor sympy nor ``symbolic_shapes``: this module needs torch alone.

>>> out = Output("alias", 0, meta=TensorMeta.of(torch.zeros(4, 2)[1:]))
>>> out.kind, out.meta.size, out.meta.offset
('alias', (3, 2), 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["Output", "Signature", "TensorMeta"]


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """Size, stride, storage offset, dtype and device of a traced tensor.

    >>> TensorMeta.of(torch.zeros(2, 3).t())
    TensorMeta(size=(3, 2), stride=(1, 3), offset=0, dtype=torch.float32, device=device(type='cpu'))
    """

    size: tuple[int, ...]  # SymInts too, in a graph with symbolic sizes (as stride, offset)
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype
    device: torch.device

    @staticmethod
    def of(t: torch.Tensor) -> TensorMeta:
        # sizes, strides and offset stay SymInts where they are: int() would fix them
        return TensorMeta(tuple(t.shape), tuple(t.stride()), _offset(t), t.dtype, t.device)

    def key(self) -> tuple[Any, ...]:
        """The fields with sympy expressions for SymInts: compared without adding guards."""
        layout = tuple(map(_expr, (*self.size, *self.stride, self.offset)))
        return (len(self.size), layout, self.dtype, self.device)


@dataclass(frozen=True, slots=True)
class Output:
    """Where one flat output of the compiled function comes from.

    ``kind`` is ``"graph"`` (output ``index`` of the compiled graph), ``"input"``
    (tensor input ``index`` itself), ``"alias"`` (a view of tensor input ``index``
    with ``meta``'s size and stride, at ``meta.offset`` elements past the input's own
    storage offset), ``"view"`` (the same, of graph output ``index``), ``"same"`` (the
    very object of flat output ``index``: eager returned one tensor twice, as
    ``x.double()`` of a float64 ``x`` does) or ``"constant"`` (``value``).
    ``creation``: how eager's view was made, where autograd refuses to write it in
    place: ``"MULTI_OUTPUT_NODE"`` (one of several views one op made: ``chunk``,
    ``split``, ``unbind``) or ``"NO_GRAD_MODE"`` (made under ``no_grad`` from a tensor
    that requires grad); ``""`` otherwise. ``view``: eager's output (a graph output) is a
    view of a base it does not return; where it is not, the runtime hands out a compiled
    view of an intermediate nothing else holds as a plain tensor of the same memory.

    >>> Output("constant", value=None)  # doctest: +NORMALIZE_WHITESPACE
    Output(kind='constant', index=-1, requires_grad=False, meta=None, value=None,
           creation='', view=False)
    """

    kind: str
    index: int = -1
    requires_grad: bool = False
    meta: TensorMeta | None = None
    value: Any = None
    creation: str = ""
    view: bool = False


@dataclass(frozen=True, slots=True)
class Signature:
    """What :func:`~ember.aotgraph.trace.analyze` learned about a function from one fake run.

    >>> from ember.aotgraph.trace import Lifted, analyze
    >>> x = torch.randn(2, requires_grad=True)
    >>> sig = analyze(Lifted.of(torch.fx.symbolic_trace(lambda x: (x * 2, x)), [x]), [x], grad=True)
    >>> sig.graph_outputs, sig.grad_outputs, sig.grad_inputs, sig.training
    ((0,), (0,), (0,), True)
    """

    outputs: tuple[Output, ...]  # one per flat output leaf, in order
    out_spec: pytree.TreeSpec  # how the flat outputs nest (tuple, list, single tensor)
    graph_outputs: tuple[int, ...]  # for each graph output, its position among the leaves
    grad_outputs: tuple[int, ...]  # graph outputs that take a tangent (they require grad)
    grad_inputs: tuple[int, ...]  # tensor inputs that get a gradient (graph input indices)
    training: bool  # traced with autograd (joint graph) rather than forward only
    # per input: how far eager's in-place ops move its version counter (0 for floats)
    versions: tuple[int, ...] = ()
    # per graph output: the first graph output sharing its storage in eager (itself if none)
    out_storage: tuple[int, ...] = ()
    # (input, its size, stride and offset after the call) for inputs whose metadata eager's
    # in-place ops change (t_, unsqueeze_, resize_, as_strided_)
    restrided: tuple[tuple[int, TensorMeta], ...] = ()
    # inputs the graph gets a copy of (grown past their storage, or written while requiring
    # grad): their final values are the last graph outputs, copied back by the runtime
    replaced: tuple[int, ...] = ()
    # inputs the function calls requires_grad_() on: the runtime sets the flag before the
    # graph runs (the gradient formulas traced only count what follows the call)
    grad_set: tuple[int, ...] = ()


def _expr(value: Any) -> Any:
    return value.node.expr if isinstance(value, torch.SymInt) else value


def _offset(t: torch.Tensor) -> Any:
    """A storage offset: an int, or a SymInt left symbolic (``int()`` would add a guard)."""
    offset = t.storage_offset()
    return offset if isinstance(offset, torch.SymInt) else int(offset)
