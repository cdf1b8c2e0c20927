"""``eliminate_common_subexpressions``: equal pure calls merge; numbers that Python calls
equal but torch does not (``1``, ``1.0``, ``True``; ``0.0``, ``-0.0``) keep their calls."""

from __future__ import annotations

import torch

from ember.aotgraph.cleanup import eliminate_common_subexpressions


def _graph(*scalars: object) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    adds = [graph.call_function(torch.ops.aten.add.Tensor, (x, s)) for s in scalars]
    graph.output(tuple(adds))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _adds(gm: torch.fx.GraphModule) -> int:
    return sum(n.target is torch.ops.aten.add.Tensor for n in gm.graph.nodes)


def test_equal_calls_merge() -> None:
    gm = _graph(2.0, 2.0, 3, 3)
    eliminate_common_subexpressions(gm)
    assert _adds(gm) == 2


def test_numbers_equal_in_python_but_not_to_torch_keep_their_calls() -> None:
    gm = _graph(1, 1.0, True, 0.0, -0.0)
    eliminate_common_subexpressions(gm)
    assert _adds(gm) == 5
    x = torch.tensor([-0.0, 1.0, 2.0]).to(torch.int64)
    got, want = gm(x), tuple(x + s for s in (1, 1.0, True, 0.0, -0.0))
    assert (
        [t.dtype for t in got]
        == [t.dtype for t in want]
        == [torch.int64, torch.float32] * 2 + [torch.float32]
    )
    f = torch.tensor([-0.0, 0.0])
    signs = [torch.signbit(t).tolist() for t in gm(f)[3:]]
    assert signs == [[False, False], [True, False]]  # -0.0 + 0.0 = 0.0; -0.0 + -0.0 = -0.0
