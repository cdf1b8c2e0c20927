"""``reshape`` and ``contiguous()`` answered from expressions in symbolic traces
(ember.aotgraph.symbolic_views): the graph computes eager's results over a size sweep,
records the views eager takes, and the trace makes fewer ``SymNode`` operations than
torch's composites; other layouts go to the composite."""

from __future__ import annotations

from typing import Any

import pytest
import sympy
import torch
from torch._subclasses import FakeTensorMode
from torch.fx.experimental import sym_node
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from ember.aotgraph import symbolic, symbolic_views


def _attention_out(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """transformers' head split and merge: a reshape to the tensor's own shape (a ``-1``
    for the heads), ``contiguous()`` of contiguous tensors, a reshape of a contiguous one."""
    b, s = x.shape[0], x.shape[1]
    h = (x @ w).view(b, s, 4, 2).transpose(1, 2)  # (b, 4, s, 2): not contiguous
    h = h.reshape(b, -1, s, 2)  # its own shape: a view
    merged = h.transpose(1, 2).contiguous()  # a copy: contiguous from here on
    out = merged.contiguous().reshape(b, s, -1)  # contiguous: the tensor, then a view
    return out.reshape(b * s, 8).sin()


def _trace(fn: Any, table: Any = None) -> tuple[torch.fx.GraphModule, int]:
    mode = FakeTensorMode(shape_env=ShapeEnv())
    x = mode.from_tensor(torch.randn(3, 5, 8))
    w = mode.from_tensor(torch.randn(8, 8), static_shapes=True)
    count = [0]
    methods = {m: getattr(sym_node.SymNode, m) for m in ("_mul", "_eq", "_ne", "_lt", "_ge")}

    def counting(method: Any) -> Any:
        def op(self: Any, other: Any) -> Any:
            count[0] += 1
            return method(self, other)

        return op

    for name, method in methods.items():
        setattr(sym_node.SymNode, name, counting(method))
    try:
        gm = symbolic.make_fx(fn, table or {}, "symbolic")(x, w)
    finally:
        for name, method in methods.items():
            setattr(sym_node.SymNode, name, method)
    return gm, count[0]


def test_results_match_eager_over_sizes_with_fewer_symnode_operations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gm, ops = _trace(_attention_out)
    w = torch.randn(8, 8)
    for b, s in [(3, 5), (2, 7), (5, 2), (4, 16)]:
        x = torch.randn(b, s, 8)
        torch.testing.assert_close(gm(x, w), _attention_out(x, w))
    views = [n for n in gm.graph.nodes if n.target is torch.ops.aten.view.default]
    assert len(views) >= 4  # every reshape of a viewable layout is a view, as eager's
    monkeypatch.setattr(symbolic_views, "RULES", {})  # torch's composites only
    plain, plain_ops = _trace(_attention_out)
    assert ops < plain_ops, (ops, plain_ops)
    x = torch.randn(2, 6, 8)
    torch.testing.assert_close(plain(x, w), gm(x, w))


def test_other_layouts_go_to_the_composite() -> None:
    def merge_transposed(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x.transpose(0, 1).reshape(-1, 8).contiguous() + w.sum()

    gm, _ = _trace(merge_transposed)
    x, w = torch.randn(4, 6, 8), torch.randn(8, 8)
    torch.testing.assert_close(gm(x, w), merge_transposed(x, w))
    assert any(n.target is torch.ops.aten.clone.default for n in gm.graph.nodes)  # a copy
    with symbolic_views.SymbolicViews() as views:
        torch.randn(2, 3).reshape(-1)  # real tensors: torch's own path
    assert views.taken == 0


def test_contiguous_of_a_layout_never_contiguous_is_its_clone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``contiguous()`` of the transposed head merge (``(b, s, 4, 2)`` of a ``(b, 4, s, 2)``,
    contiguous for no value of ``s``) records the ``clone`` the composite records, decided
    from the expressions; a layout whose answer depends on the sizes (a slice of a static
    dimension, its stride against a symbol) still takes the composite."""

    def merge(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, s = x.shape[0], x.shape[1]
        h = (x @ w).view(b, s, 4, 2).transpose(1, 2).contiguous()  # (b, 4, s, 2): a copy
        # x[:, :2] of (b, s, 8): its stride 8*s against 16 is equal at s == 2: the composite
        return h.transpose(1, 2).contiguous().view(b, s, 8), x[:, :2].contiguous()

    gm, ops = _trace(merge)
    w = torch.randn(8, 8)
    for b, s in [(3, 5), (2, 7), (5, 2)]:
        x = torch.randn(b, s, 8)
        torch.testing.assert_close(gm(x, w), merge(x, w))
    clones = [n for n in gm.graph.nodes if n.target is torch.ops.aten.clone.default]
    assert len(clones) == 3
    monkeypatch.setattr(symbolic_views, "RULES", {})  # torch's composites only
    plain, plain_ops = _trace(merge)
    assert ops < plain_ops, (ops, plain_ops)
    assert [
        str(n.kwargs) for n in plain.graph.nodes if n.target is torch.ops.aten.clone.default
    ] == [str(n.kwargs) for n in clones]
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    lower = {s0: 2, s1: 2}.get
    never = symbolic_views._never_contiguous
    assert never([s1, s0, 4, 2], [8 * s0, 2, 2 * s0, 1], lower)  # the transposed heads
    assert never([s0, 4], [1, s0], lower) and never([s0, 4], [0, 1], lower)  # .t(), expanded
    assert not never([s1, 2, 8], [8 * s0, 8, 1], lower)  # x[:, :2]: 8*s0 == 16 at s0 == 2
    assert never([s1, 2], [2 * s0, 1], lower)  # a slice of every other row
    assert not never([s1, 2], [2 * s0, 1], {s0: 1, s1: 2}.get)  # s0 may be 1: 2*s0 == 2


def test_indexing_with_nones_is_unsqueeze() -> None:
    def mask(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        m = x[:, :, None] * x[:, None, ...]  # (b, s, 1, 8) * (b, 1, s, 8): a pair mask
        return m.sum(-1) + x[..., None, :, None].sum((-1, -2)) + w[None, :1, 0]

    gm, _ = _trace(mask)
    for sizes in [(3, 5, 8), (2, 9, 8), (6, 2, 8)]:
        x, w = torch.randn(sizes), torch.randn(8, 8)
        torch.testing.assert_close(gm(x, w), mask(x, w))
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.unsqueeze.default in targets
    slices = [n for n in gm.graph.nodes if n.target is torch.ops.aten.slice.Tensor]
    assert len(slices) == 1  # w[None, :1, 0]'s partial slice only (w is static: torch's)


def test_linear_without_bias_records_what_matmul_does(monkeypatch: pytest.MonkeyPatch) -> None:
    def proj(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x, w, None)  # (b, s, 8) @ w.t(): folded into rows
        z = torch.nn.functional.linear(y.transpose(0, 1), w)  # not contiguous: torch's
        return z.transpose(0, 1) + torch.nn.functional.linear(x, w, w[0])  # a bias: torch's

    gm, ops = _trace(proj)
    w = torch.randn(8, 8)
    for b, s in [(3, 5), (2, 9), (6, 2)]:
        x = torch.randn(b, s, 8)
        torch.testing.assert_close(gm(x, w), proj(x, w))
    monkeypatch.setattr(symbolic_views, "RULES", {})
    plain, plain_ops = _trace(proj)
    assert ops < plain_ops, (ops, plain_ops)
    kinds = sorted(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    assert kinds.count("aten.mm.default") == sorted(
        str(n.target) for n in plain.graph.nodes if n.op == "call_function"
    ).count("aten.mm.default")
