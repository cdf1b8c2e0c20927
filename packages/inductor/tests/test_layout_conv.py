"""Channels-last convolutions (ember.inductor.layout_conv): the layout a CPU graph's 2-d
convolutions run on, what follows them, and the outputs, which keep eager's strides."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph
from ember.inductor.layout_conv import MAX_RESTORED, channels_last_convolutions

aten = torch.ops.aten
CL = torch.channels_last

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="oneDNN is what computes in NHWC"
)


def traced(fn: Callable[..., Any], *inputs: torch.Tensor) -> torch.fx.GraphModule:
    with torch.no_grad():
        return make_fx(fn, tracing_mode="fake")(*inputs)


def convs(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.target is aten.convolution.default]


def resnet_block(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, g: torch.Tensor) -> Any:
    """diffusers' ResnetBlock2D in small: group norm, SiLU, conv, twice, and the residual."""
    h = F.conv2d(F.silu(F.group_norm(x, 4, g, g)), w1, padding=1)
    h = F.conv2d(F.silu(F.group_norm(h, 4, g, g)), w2, padding=1)
    return (x + h) / 2


def block_inputs() -> list[torch.Tensor]:
    return [
        torch.randn(2, 16, 8, 8),
        torch.randn(16, 16, 3, 3) / 12,
        torch.randn(16, 16, 3, 3) / 12,
        torch.rand(16) + 0.5,
    ]


def test_convolutions_run_on_nhwc_and_the_output_keeps_eager_strides() -> None:
    inputs = block_inputs()
    gm = channels_last_convolutions(traced(resnet_block, *inputs))
    for conv in convs(gm):
        assert conv.args[0].meta["val"].is_contiguous(memory_format=CL)
        assert conv.meta["val"].is_contiguous(memory_format=CL)
    first, second = convs(gm)
    assert first.args[0].target is aten.clone.default  # the input's SiLU, written NHWC
    assert second.args[0].target is aten.silu.default  # follows the first's layout: no copy
    compiled = compile_graph(traced(resnet_block, *inputs), inputs)
    out, want = compiled(*inputs), resnet_block(*inputs)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    assert out.stride() == want.stride()


def test_the_setting_keeps_eager_layout() -> None:
    inputs = block_inputs()
    compiled = compile_graph(
        traced(resnet_block, *inputs), inputs, options={"conv_channels_last": False}
    )
    torch.testing.assert_close(compiled(*inputs), resnet_block(*inputs), rtol=1e-4, atol=1e-4)
    assert compiled.gm is not None
    assert not any(
        c.args[0].meta["val"].is_contiguous(memory_format=CL) for c in convs(compiled.gm)
    )


def attention_norm(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """diffusers' attention block: group norm over a (N, C, H*W) view of the activation."""
    h = F.conv2d(x, w, padding=1)
    n, c, hh, ww = h.shape
    flat = h.view(n, c, hh * ww)
    return F.group_norm(flat, 4, g, g).view(n, c, hh, ww) + h


def test_group_norm_gets_a_dense_input_after_a_view_of_nhwc() -> None:
    # the (N, C, H*W) view of an NHWC activation has strides (H*W*C, 1, C): aten's group
    # norm kernel rejects that layout (its fake implementation does not), so it reads a copy
    inputs = [torch.randn(2, 16, 8, 8), torch.randn(16, 16, 3, 3) / 12, torch.rand(16) + 0.5]
    gm = channels_last_convolutions(traced(attention_norm, *inputs))
    (norm,) = [n for n in gm.graph.nodes if n.target is aten.native_group_norm.default]
    assert norm.args[0].meta["val"].is_contiguous()
    compiled = compile_graph(traced(attention_norm, *inputs), inputs)
    torch.testing.assert_close(compiled(*inputs), attention_norm(*inputs), rtol=1e-4, atol=1e-4)


def merged_channels(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = F.conv2d(x, w, padding=1)
    return h.view(h.shape[0], h.shape[1] * h.shape[2], h.shape[3]).softmax(-1)


def test_a_view_the_new_strides_forbid_reads_a_contiguous_copy() -> None:
    inputs = [torch.randn(2, 8, 6, 6), torch.randn(8, 8, 3, 3)]
    gm = channels_last_convolutions(traced(merged_channels, *inputs))
    assert aten.view.default not in [n.target for n in gm.graph.nodes]  # (C, H) don't merge
    torch.testing.assert_close(gm(*inputs), merged_channels(*inputs))
    compiled = compile_graph(traced(merged_channels, *inputs), inputs)
    torch.testing.assert_close(compiled(*inputs), merged_channels(*inputs), rtol=1e-4, atol=1e-5)


def skip_cat(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """diffusers' up block: the activation and a skip connection, concatenated on channels."""
    skip = F.conv2d(x, w1, padding=1)
    h = F.conv2d(torch.relu(skip), w2, padding=1)
    return F.conv2d(torch.cat([h + 1, skip], dim=1), w2.repeat(1, 2, 1, 1), padding=1)


def test_a_channel_cat_of_nhwc_tensors_runs_as_aten_copy() -> None:
    inputs = [torch.randn(2, 8, 6, 6), torch.randn(8, 8, 3, 3), torch.randn(8, 8, 3, 3)]
    gm = channels_last_convolutions(traced(skip_cat, *inputs))
    targets = [n.target for n in gm.graph.nodes]
    assert aten.concat.default in targets and aten.cat.default not in targets
    compiled = compile_graph(traced(skip_cat, *inputs), inputs)
    torch.testing.assert_close(compiled(*inputs), skip_cat(*inputs), rtol=1e-4, atol=1e-4)


def test_a_graph_returning_its_activations_is_left_alone() -> None:
    # a training forward returns what its backward reads: copying each back does not pay
    def activations(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = [x]
        for _ in range(MAX_RESTORED + 1):
            outs.append(F.conv2d(torch.relu(outs[-1]), w, padding=1))
        return tuple(outs[1:])

    inputs = [torch.randn(2, 8, 6, 6), torch.randn(8, 8, 3, 3)]
    gm = traced(activations, *inputs)
    assert channels_last_convolutions(gm) is gm


def test_graphs_without_2d_convolutions_or_with_a_backward_are_left_alone() -> None:
    x, w = torch.randn(2, 4, 10), torch.randn(4, 4, 3)
    gm = traced(lambda x, w: F.conv1d(x, w), x, w)
    assert channels_last_convolutions(gm) is gm
    x, w = torch.randn(2, 4, 6, 6, requires_grad=True), torch.randn(4, 4, 3, 3)

    def grad(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, w)
        (g,) = torch.autograd.grad(y.sum(), x)
        return g

    gm = make_fx(grad, tracing_mode="fake")(x, w)
    assert aten.convolution_backward.default in [n.target for n in gm.graph.nodes]
    assert channels_last_convolutions(gm) is gm


def test_a_graph_traced_on_real_tensors_mixes_fake_modes() -> None:
    """``make_fx`` on real tensors gives each value a fake mode of its own: the rewrite
    recomputes values in one mode (it failed with "Mixing fake modes" on a decomposed graph)."""
    from ember.inductor import decompositions

    inputs = block_inputs()
    with torch.no_grad():
        gm = make_fx(resnet_block, decomposition_table=decompositions())(*inputs)
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "call_function"]
    modes = {id(v.fake_mode) for v in vals if isinstance(v, torch.Tensor)}
    assert len(modes) > 1
    new = channels_last_convolutions(gm)
    assert new is not gm and all(
        n.args[0].meta["val"].is_contiguous(memory_format=CL) for n in convs(new)
    )
    torch.testing.assert_close(compile_graph(gm, inputs)(*inputs), resnet_block(*inputs))


def conv_norm_pool(x: torch.Tensor, w: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    """torchvision's ResNet stem in small, in eval mode: conv, batch norm, ReLU, pooling
    (the batch norm as ember's symbolic trace of ``F.batch_norm(training=False)`` records it)."""
    h = F.conv2d(x, w, padding=1)
    h = aten._native_batch_norm_legit_no_training(h, stats, stats, stats, stats + 1, 0.1, 1e-5)[0]
    return F.adaptive_avg_pool2d(torch.relu(h), 1).flatten(1)


def symbolic_trace(fn: Callable[..., Any], *inputs: torch.Tensor) -> tuple[Any, Any]:
    """``fn`` traced with the first input's sizes symbolic and the others static (as
    ``dynamic=True`` traces a module: parameters keep their sizes), and its ShapeEnv."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    from ember.inductor import decompositions

    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    dims = [DimDynamic.DYNAMIC] * inputs[0].ndim
    fakes = [
        mode.from_tensor(inputs[0], symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims)),
        *(mode.from_tensor(t, static_shapes=True) for t in inputs[1:]),
    ]
    with torch.no_grad(), mode:
        gm = make_fx(fn, decomposition_table=decompositions())(*fakes)
    return gm, env


def test_symbolic_sizes_run_on_nhwc_without_a_guard() -> None:
    """A graph of symbolic sizes (``dynamic=True``) gets the static graph's layouts: its
    convolutions ran NCHW, and its eval batch norm as aten's kernel, 1.5x the static graph's
    time on the ResNet workload. The rewrite must not specialise a size: ``float(H * W)``
    (the pooling's divisor) is carried over, not recomputed on fake values, which guarded
    ``H * W == 64``."""
    inputs = [torch.randn(2, 3, 8, 8), torch.randn(8, 3, 3, 3), torch.rand(8) + 0.5]
    gm, env = symbolic_trace(conv_norm_pool, *inputs)
    targets = {n.target for n in gm.graph.nodes}
    assert aten._native_batch_norm_legit_no_training.default not in targets  # decomposed
    assert torch.sym_float in targets
    guards = len(env.guards)
    new = channels_last_convolutions(gm)
    assert len(env.guards) == guards, env.guards[guards:]
    assert new is not gm and all(
        n.args[0].meta["val"].is_contiguous(memory_format=CL) for n in convs(new)
    )
    compiled = compile_graph(gm, inputs, {"graph_cache": False})
    assert len(env.guards) == guards, env.guards[guards:]
    for n, hw in [(2, 8), (3, 5), (1, 11), (4, 6)]:
        x = torch.randn(n, 3, hw, hw + 1)
        want = conv_norm_pool(x, *inputs[1:])
        torch.testing.assert_close(compiled(x, *inputs[1:]), want, rtol=1e-4, atol=1e-4)
