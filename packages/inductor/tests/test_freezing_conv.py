"""Freezing packs constant convolution weights once into oneDNN's layout (freezing_conv.py);
an in-place update of a frozen weight packs it again."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph, freezing
from ember.inductor.freezing_conv import AVAILABLE, PACKED_CONV

aten = torch.ops.aten

pytestmark = pytest.mark.skipif(not AVAILABLE, reason="oneDNN is not built into this torch")


def frozen_param(*shape: int) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.randn(*shape) / 8, requires_grad=False)


def block(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> Any:
    h = F.silu(F.conv2d(x, w1, b1, padding=1))
    return F.conv2d(h, w2, None, stride=2, padding=1) + 1


def last_conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.conv2d(torch.relu(x), w, padding=1)


def inputs() -> list[torch.Tensor]:
    weights = [frozen_param(16, 8, 3, 3), frozen_param(16), frozen_param(4, 16, 3, 3)]
    return [torch.randn(2, 8, 10, 10), *weights]


def targets(gm: torch.fx.GraphModule) -> list[Any]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_weights_are_packed_once_and_the_result_matches_eager() -> None:
    ins = inputs()
    gm = make_fx(block)(*ins)
    f = freezing.freeze(gm, ins, lambda g, _: g)
    assert isinstance(f, freezing.FrozenGraph)
    assert f.plan.prepacked == 2
    assert targets(f.plan.graph).count(PACKED_CONV) == 2
    assert aten.convolution.default not in targets(f.plan.graph)
    packed = [c for c in f._consts if c.layout is not torch.strided]
    assert len(packed) == 2  # made by the fold graph, once
    with torch.no_grad():
        torch.testing.assert_close(f(*ins), block(*ins), rtol=1e-4, atol=1e-5)


def test_compiled_with_packed_weights_on_nhwc_activations() -> None:
    ins = inputs()
    gm = make_fx(block)(*ins)
    compiled = compile_graph(gm, ins, options={"freezing": True})
    with torch.no_grad():
        out, want = compiled(*ins), block(*ins)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    assert out.stride() == want.stride()
    inner = compiled.compiled.gm  # the graph compiled after freezing (layout pass applied)
    convs = [n for n in inner.graph.nodes if n.target is PACKED_CONV]
    assert convs and all(
        c.args[0].meta["val"].is_contiguous(memory_format=torch.channels_last) for c in convs
    )


def test_an_updated_weight_is_packed_again() -> None:
    ins = inputs()
    gm = make_fx(block)(*ins)
    compiled = compile_graph(gm, ins, options={"freezing": True})
    with torch.no_grad():
        compiled(*ins)
        ins[1].mul_(-2)  # moves the version counter: the fold graph packs the new weight
        torch.testing.assert_close(compiled(*ins), block(*ins), rtol=1e-4, atol=1e-5)
    assert compiled.refreezes == 1 and compiled.fallback is None


@pytest.mark.parametrize("nhwc", [True, False])
def test_a_packed_convolution_returned_keeps_eager_strides(nhwc: bool) -> None:
    x, w = torch.randn(2, 8, 6, 6), frozen_param(4, 8, 3, 3)
    gm = make_fx(last_conv)(x, w)
    options = {"freezing": True, "conv_channels_last": nhwc}
    compiled = compile_graph(gm, [x, w], options=options)
    with torch.no_grad():
        out, want = compiled(x, w), last_conv(x, w)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    assert out.stride() == want.stride()


def test_a_convolution_with_a_live_weight_is_not_packed() -> None:
    x, w = torch.randn(2, 8, 6, 6), torch.randn(8, 8, 3, 3)  # a plain tensor: data, not state
    b = frozen_param(8)
    gm = make_fx(lambda x, w, b: F.conv2d(x, w, b) * 2)(x, w, b)
    f = freezing.freeze(gm, [x, w, b], lambda g, _: g)
    graph = f.plan.graph if isinstance(f, freezing.FrozenGraph) else f
    assert PACKED_CONV not in targets(graph)
