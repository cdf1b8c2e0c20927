"""The decomposition table the inductor backend hands to ember.aotgraph."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import decompositions
from ember.inductor.compile import PRIM_VIEWS

prims = torch.ops.prims
aten = torch.ops.aten

CASES = [
    (prims.broadcast_in_dim.default, (torch.randn(3, 1), [2, 3, 4], [1, 2])),
    (prims.broadcast_in_dim.default, (torch.randn(5), [5, 2], [0])),
    (prims.collapse_view.default, (torch.randn(2, 3, 4), 1, 2)),
    (prims.collapse_view.default, (torch.randn(2, 3, 4), 0, 1)),
    (prims.split_dim.default, (torch.randn(6, 4), 0, 2)),
    (prims.squeeze.default, (torch.randn(1, 3, 1), [0, 2])),
    (prims.transpose.default, (torch.randn(2, 3, 4), [2, 0, 1])),
    (prims.view_of.default, (torch.randn(2, 3),)),
]


# ids name the op and the case's place: the random values must not be part of them, or
# the test workers (pytest-xdist) would each collect different ids.
IDS = [f"{op}-{i}" for i, (op, _) in enumerate(CASES)]


@pytest.mark.parametrize(("op", "args"), CASES, ids=IDS)
def test_prim_views_match_the_prims(op: torch._ops.OpOverload, args: tuple) -> None:
    want = op(*args)
    got = PRIM_VIEWS[op](*args)
    assert got.shape == want.shape and got.stride() == want.stride()
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_functionalized_trace_of_reference_decompositions_has_no_prim_views() -> None:
    """mean's reference decomposition makes prims.broadcast_in_dim; functionalize rejects it."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.mean((2, 3), keepdim=True) * x

    x = torch.randn(2, 3, 4, 5)
    gm = make_fx(torch.func.functionalize(f), decomposition_table=decompositions())(x)
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert not any(str(op) in targets for op in PRIM_VIEWS)
    torch.testing.assert_close(gm(x), f(x))
