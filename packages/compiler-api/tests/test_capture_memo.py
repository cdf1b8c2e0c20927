"""capture's fake-result memo (``ember.capture.fakememo``) inside a whole compile: a model
of repeated blocks compiled with ``dynamic=True`` makes the same graph, and the same
metadata on every node, with the memo and without it. (Its unit tests live with capture,
``packages/capture/tests/test_fakememo.py``; this one needs ``ember.compiler``.)"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ember.compiler
from ember.capture import fakememo


def _meta(t: torch.Tensor) -> tuple[Any, ...]:
    exprs = [getattr(n, "node", n) for n in (*t.shape, *t.stride())]
    return (tuple(str(getattr(e, "expr", e)) for e in exprs), t.dtype, t._is_view())


class _Layers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8))
            for _ in range(4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            h = block(x)
            x = x + (h @ h.transpose(-1, -2)).softmax(-1) @ h
        return x.reshape(x.shape[0], -1)


def _graphs(memo_on: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[Any]]:
    if not memo_on:
        monkeypatch.setattr(fakememo, "_key", lambda *a: None)
    built = fakememo._Result.build
    monkeypatch.setattr(
        fakememo._Result, "build", lambda r, mode: (REMADE.append(r), built(r, mode))[1]
    )
    ember.compiler.reset()
    torch.manual_seed(0)
    model = _Layers().eval()
    codes: list[str] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        metas = [n.meta.get("example_value") for n in gm.graph.nodes]
        codes.append(gm.code + "\n".join(str(_meta(m)) for m in metas if _is_tensor(m)))
        return gm.forward

    f = ember.compiler.compile(model, backend=backend, dynamic=True)
    results = []
    with torch.no_grad():
        for b, t in [(2, 5), (3, 7), (4, 9)]:
            x = torch.randn(b, t, 8)
            torch.testing.assert_close(f(x), model(x))
            results.append(f(x))
    monkeypatch.undo()
    return codes, results


REMADE: list[Any] = []  # results the memo remade


def _is_tensor(m: Any) -> bool:
    return isinstance(m, torch.Tensor)


def test_a_compile_makes_the_same_graph_with_and_without_the_memo(monkeypatch):
    REMADE.clear()
    with_memo, _ = _graphs(True, monkeypatch)
    assert len(REMADE) >= 12  # linear, gelu, layer_norm, matmul, ... of blocks 2-4
    REMADE.clear()
    without, _ = _graphs(False, monkeypatch)
    assert len(with_memo) == 1 and REMADE == []  # one graph serves every size
    assert with_memo == without
