"""Symbolic traces leave the memory format out of ``tensor_meta`` (ember.aotgraph.symbolic.
make_fx): the same graph and the same ``val`` fakes as make_fx's full metadata, fewer
``SymNode`` operations, and torch's function back in place afterwards."""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses import FakeTensorMode
from torch.fx.experimental import proxy_tensor, sym_node
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from ember.aotgraph import nodemeta, symbolic


def _block(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = (x @ w).view(x.shape[0], x.shape[1], 2, -1).transpose(1, 2)
    return (h.softmax(-1) * 2).sum(1)


def _graph(make: Any) -> tuple[list[Any], int]:
    """The traced graph's nodes (target, sizes and strides of each ``val``) and the binary
    ``SymNode`` operations the trace made."""
    mode = FakeTensorMode(shape_env=ShapeEnv())
    x = mode.from_tensor(torch.randn(3, 5, 8))
    w = mode.from_tensor(torch.randn(8, 8), static_shapes=True)
    count = [0]
    mul = sym_node.SymNode._mul

    def counted(self: Any, other: Any) -> Any:
        count[0] += 1
        return mul(self, other)

    sym_node.SymNode._mul = counted  # type: ignore[method-assign]
    try:
        gm = make(_block, {}, "symbolic")(x, w)
    finally:
        sym_node.SymNode._mul = mul  # type: ignore[method-assign]
    nodes = []
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            layout = tuple(str(v) for v in (*val.shape, *val.stride()))
            nodes.append((n.op, str(n.target), layout, n.meta["tensor_meta"].memory_format))
    return nodes, count[0]


def test_the_same_graph_and_vals_without_the_memory_format() -> None:
    full, full_ops = _graph(nodemeta.make_fx)
    lean, lean_ops = _graph(symbolic.make_fx)
    assert [n[:2] for n in lean] == [n[:2] for n in full]
    # the fakes' sizes and strides are the same expressions (symbol names differ per env)
    assert [len(n[2]) for n in lean] == [len(n[2]) for n in full]
    assert any(n[3] is torch.contiguous_format for n in full)
    assert all(n[3] is None for n in lean)
    assert lean_ops < full_ops
    assert proxy_tensor._extract_tensor_metadata is symbolic._EXTRACT  # type: ignore[attr-defined]


def test_static_traces_keep_the_memory_format() -> None:
    gm = symbolic.make_fx(lambda t: t * 2, {}, "fake")(torch.ones(2, 3))
    (mul,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert mul.meta["tensor_meta"].memory_format is torch.contiguous_format


def test_overlapping_traces_put_torchs_function_back_once_the_last_ends() -> None:
    with symbolic._without_memory_format():
        with symbolic._without_memory_format():
            assert proxy_tensor._extract_tensor_metadata is symbolic._LEAN_EXTRACT  # type: ignore[attr-defined]
        assert proxy_tensor._extract_tensor_metadata is symbolic._LEAN_EXTRACT  # type: ignore[attr-defined]
    assert proxy_tensor._extract_tensor_metadata is symbolic._EXTRACT  # type: ignore[attr-defined]
