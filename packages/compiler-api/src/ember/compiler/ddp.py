"""DistributedDataParallel: a captured graph split at DDP's gradient buckets.

DDP all-reduces gradients in buckets of about ``bucket_bytes_cap`` bytes, filled in the
reverse order of the parameters (the order backward produces their gradients), and starts
a bucket's all-reduce as soon as its last gradient is accumulated. A compiled graph's
backward is one call that produces every gradient at its end, so every all-reduce would
wait for all of backward. :func:`split_backend` wraps a backend: when DDP's forward is
running (``DistributedDataParallel._get_active_ddp_module()``), it cuts the graph into
pieces whose parameters fill one bucket each, walking the graph backwards as backward does,
compiles each piece alone (its own forward and backward), and runs them in order: the last
piece's backward ends first, and its bucket's all-reduce overlaps the backward of the
pieces before it. torch's DDPOptimizer does the same for torch.compile. The setting
``debug.optimize_ddp=False`` (``EMBER_OPTIMIZE_DDP=0``) keeps each graph whole.

>>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
>>> split_backend(lambda gm, inputs: gm)(gm, [torch.ones(1, 4)]) is gm  # no DDP running
True
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

from ember.compiler.settings import section

LOG = logging.getLogger("ember.compiler")

__all__ = ["buckets", "split_backend", "split_graph"]


def _active_bucket_caps() -> tuple[int, ...] | None:
    """The bucket sizes of the DDP module whose forward is running, in the order its buckets
    fill (backward's order; the last repeats), or None. DDP's first bucket is smaller when
    the user left the size at its default (``first_bucket_bytes_cap``), and a
    ``bucket_cap_mb_list`` gives each bucket its own size."""
    if not torch.distributed.is_available():
        return None
    ddp = torch.nn.parallel.DistributedDataParallel._get_active_ddp_module()  # type: ignore[no-untyped-call]
    if ddp is None:
        return None
    config = getattr(ddp, "_bucket_config", None)  # torch >= 2.11; older ones have one size
    if config is None:
        return (int(ddp.bucket_bytes_cap),)
    if config.per_bucket_bytes_caps:
        return tuple(int(c) for c in config.per_bucket_bytes_caps)
    return (int(config.first_bucket_bytes_cap), int(config.bucket_bytes_cap))


def buckets(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], cap: int | Sequence[int]
) -> dict[str, int]:
    """Each op node's piece, by name: walking the graph backwards, a node joins the current
    piece, whose parameters (placeholders whose example is an ``nn.Parameter``) grow by
    those it reads first; a new piece starts once the current one holds ``cap`` bytes
    (``cap[k]`` for the k-th piece walked, the last size repeating, as DDP sizes its
    buckets). Pieces are numbered in forward order.

    >>> gm = torch.fx.symbolic_trace(lambda x, w1, w2: (x @ w1).relu() @ w2)
    >>> w1, w2 = (torch.nn.Parameter(torch.ones(4, 4)) for _ in range(2))  # 64 bytes each
    >>> buckets(gm, [torch.ones(1, 4), w1, w2], cap=64)
    {'matmul': 0, 'relu': 1, 'matmul_1': 1}
    >>> buckets(gm, [torch.ones(1, 4), w1, w2], cap=(128, 64))  # a first bucket of 128 bytes
    {'matmul': 0, 'relu': 0, 'matmul_1': 0}
    """
    caps = (cap,) if isinstance(cap, int) else tuple(cap)
    params = {
        node: t.numel() * t.element_size()
        for node, t in zip(gm.graph.find_nodes(op="placeholder"), example_inputs, strict=False)
        if isinstance(t, torch.nn.Parameter)
    }
    counted: set[torch.fx.Node] = set()
    order: list[list[torch.fx.Node]] = [[]]
    size = 0
    for node in reversed(gm.graph.nodes):
        if node.op in ("placeholder", "output"):
            continue
        new = [a for a in node.all_input_nodes if a in params and a not in counted]
        if new and size >= caps[min(len(order), len(caps)) - 1] and order[-1]:
            order.append([])
            size = 0
        counted.update(new)
        size += sum(params[a] for a in new)
        order[-1].append(node)
    last = len(order) - 1
    piece_of = {n: last - k for k, piece in enumerate(order) for n in piece}
    return {n.name: piece_of[n] for n in gm.graph.nodes if n in piece_of}


class _Piece(torch.nn.Module):
    """A compiled piece, in the split graph's place of its submodule."""

    def __init__(self, compiled: Callable[..., Any]) -> None:
        super().__init__()
        self.compiled = compiled

    def forward(self, *args: Any) -> Any:
        return self.compiled(*args)


def split_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    cap: int | Sequence[int],
    compile_piece: Callable[[torch.fx.GraphModule, list[Any]], Callable[..., Any]],
) -> torch.fx.GraphModule | None:
    """``gm`` cut at :func:`buckets` and each piece compiled by ``compile_piece`` (its example
    inputs: the values the pieces before it make from ``example_inputs``, computed on fake
    tensors); None when it is one piece.

    >>> gm = torch.fx.symbolic_trace(lambda x, w1, w2: (x @ w1).relu() @ w2)
    >>> w1, w2 = (torch.nn.Parameter(torch.ones(4, 4)) for _ in range(2))
    >>> split = split_graph(gm, [torch.ones(1, 4), w1, w2], 64, lambda piece, inputs: piece)
    >>> [name for name, _ in split.named_children()], split(torch.ones(1, 4), w1, w2)
    (['submod_0', 'submod_1'], tensor([[16., 16., 16., 16.]], grad_fn=<MmBackward0>))
    """
    piece_of = buckets(gm, example_inputs, cap)
    if len(set(piece_of.values())) < 2:
        return None
    split = split_module(gm, gm, lambda node: piece_of[node.name], keep_original_order=True)
    inputs = _piece_inputs(split, example_inputs)
    for name, piece_inputs in inputs.items():
        piece = getattr(split, name)
        compiled = compile_piece(piece, piece_inputs)
        delattr(split, name)
        split.add_submodule(name, _Piece(compiled))
    return split


def _piece_inputs(
    split: torch.fx.GraphModule, example_inputs: Sequence[Any]
) -> dict[str, list[Any]]:
    """The inputs each piece is called with, from one run of ``split`` on fake copies of
    ``example_inputs`` (nothing runs for real: no buffer is updated twice). Parameters stay
    the real ones (the backend sees which inputs are parameters); values made by earlier
    pieces become zero tensors of their layout, needing grad as the fake values did."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    seen: dict[str, list[Any]] = {}

    class Recorder(torch.fx.Interpreter):
        def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
            seen[str(target)] = list(args)
            return super().call_module(target, args, kwargs)

    fakes = [
        t if isinstance(t, torch.nn.Parameter) or not isinstance(t, torch.Tensor)
        else mode.from_tensor(t)
        for t in example_inputs
    ]  # fmt: skip
    with mode:
        Recorder(split).run(*fakes)
    own = {id(t): t for t in example_inputs if isinstance(t, torch.Tensor)}
    fake_to_real = {
        id(f): own[id(t)] for f, t in zip(fakes, example_inputs, strict=True) if id(t) in own
    }
    return {name: [_concrete(a, fake_to_real) for a in args] for name, args in seen.items()}


def _concrete(value: Any, originals: dict[int, Any]) -> Any:
    if not isinstance(value, torch.Tensor) or isinstance(value, torch.nn.Parameter):
        return value
    if id(value) in originals:  # an input of the whole graph: the caller's tensor
        return originals[id(value)]
    out = (
        torch.zeros(1, dtype=value.dtype, device=value.device)
        .new_empty_strided(tuple(value.shape), value.stride())
        .zero_()
    )
    return out.requires_grad_(value.requires_grad) if value.is_floating_point() else out


def split_backend(backend: Callable[..., Any]) -> Callable[..., Any]:
    """``backend``, splitting the graphs captured inside DDP's forward at its buckets.

    >>> compile_graph = split_backend(lambda gm, inputs: gm.forward)
    >>> compile_graph(torch.fx.symbolic_trace(lambda x: x + 1), [torch.ones(1)])(torch.ones(1))
    tensor([2.])
    """

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        cap = _active_bucket_caps() if section.get().optimize_ddp else None
        if cap is None:
            return backend(gm, example_inputs, **kwargs)

        def piece(sub: torch.fx.GraphModule, inputs: list[Any]) -> Any:
            return backend(sub, inputs, **kwargs)

        split = split_graph(gm, example_inputs, cap, piece)
        if split is None:
            return backend(gm, example_inputs, **kwargs)
        pieces = len(list(split.children()))
        LOG.info("DDP: the graph runs as %d pieces, one per gradient bucket", pieces)
        return split

    return compile_graph
