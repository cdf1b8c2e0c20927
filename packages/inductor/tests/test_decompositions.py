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


LAYER_NORM_CASES = {
    "float32": (lambda: torch.randn(2, 5, 8), [8]),
    "two-dims": (lambda: torch.randn(3, 4, 6), [4, 6]),
    "bfloat16": (lambda: torch.randn(2, 5, 8).bfloat16(), [8]),
    "transposed": (lambda: torch.randn(8, 5, 2).transpose(0, 2), [8]),
}


@pytest.mark.parametrize("case", LAYER_NORM_CASES)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_matches_eager_outputs_dtypes_and_strides(case: str, affine: bool) -> None:
    make, shape = LAYER_NORM_CASES[case]
    x = make()
    w = torch.randn(shape, dtype=x.dtype) if affine else None
    b = torch.randn(shape, dtype=x.dtype) if affine else None
    want = aten.native_layer_norm(x, shape, w, b, 1e-5)

    def f(x, w, b):
        return aten.native_layer_norm(x, shape, w, b, 1e-5)

    for mode in ("real", "symbolic"):
        gm = make_fx(f, decomposition_table=decompositions(), tracing_mode=mode)(x, w, b)
        targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
        assert aten.native_layer_norm.default not in targets and aten.expand.default not in targets
        got = gm(x, w, b)
        for g, e in zip(got, want, strict=True):
            assert (g.shape, g.dtype, g.stride()) == (e.shape, e.dtype, e.stride())
            torch.testing.assert_close(g, e)


def test_layer_norm_traced_with_symbolic_sizes_serves_other_sizes() -> None:
    def f(x, w, b):
        return aten.native_layer_norm(x, [16], w, b, 1e-5)

    w, b = torch.randn(16), torch.randn(16)
    gm = make_fx(f, decomposition_table=decompositions(), tracing_mode="symbolic")(
        torch.randn(2, 3, 16), w, b
    )
    for size in [(5, 7, 16), (2, 1, 16), (3, 4, 16)]:
        x = torch.randn(size)
        for g, e in zip(gm(x, w, b), f(x, w, b), strict=True):
            torch.testing.assert_close(g, e)


def test_layer_norm_of_a_mismatched_shape_raises_eagers_error() -> None:
    def f(x):
        return aten.native_layer_norm(x, [5], None, None, 1e-5)

    with pytest.raises(RuntimeError) as eager:
        f(torch.randn(2, 4))
    with pytest.raises(RuntimeError) as traced:
        make_fx(f, decomposition_table=decompositions())(torch.randn(2, 4))
    assert str(eager.value).split("\n")[0] in str(traced.value)
