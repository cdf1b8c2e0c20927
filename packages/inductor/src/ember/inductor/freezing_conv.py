"""Freezing's convolution pass: a constant weight packed once into oneDNN's own layout.

Each call of ``aten.convolution`` on the CPU hands oneDNN a plain (OIHW) weight, which
oneDNN reorders into its blocked layout before computing. Under freezing the weight is a
constant, so :func:`prepack_conv` reorders it once, at freeze time
(``mkldnn._reorder_convolution_weight``: an opaque ``torch._mkldnn`` tensor), and calls
``mkldnn._convolution_pointwise`` with it on every call; both are aten-level ops, the ones
torch inductor's freezing uses (``fx_passes/mkldnn_fusion.py``). On diffusers' tiny UNet
and VAE, with channels-last activations, the 25 and 20 convolutions took 22.9 ms a step
with plain weights and 20.9-21.4 ms packed (1 thread, interleaved, thread CPU time).

The packed weight depends on the input's size (oneDNN picks its blocking for it), so a
convolution is packed only when its input has static sizes. The rest of freezing treats
the packed weight as any folded constant: made by the fold graph, checked and remade when
the frozen weight changes.

>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> x, w, b = torch.randn(2, 8, 6, 6), torch.randn(4, 8, 3, 3), torch.randn(4)
>>> def conv(x, w, b):
...     return torch.nn.functional.conv2d(x, w, b, padding=1)
>>> gm = make_fx(conv, tracing_mode="fake")(x, w, b)
>>> placeholders = list(gm.graph.find_nodes(op="placeholder"))
>>> prepack_conv(gm.graph, set(placeholders[1:])) if AVAILABLE else 1
1
>>> _ = gm.recompile()
>>> torch.testing.assert_close(gm(x, w, b), conv(x, w, b), rtol=1e-4, atol=1e-5)
"""

from __future__ import annotations

import torch
import torch.fx

__all__ = ["AVAILABLE", "prepack_conv"]

aten = torch.ops.aten
mkldnn = torch.ops.mkldnn

# oneDNN is built in (torch.backends.mkldnn.enabled, the switch, is read when the pass runs)
_BUILT: bool = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
AVAILABLE: bool = _BUILT and hasattr(mkldnn, "_reorder_convolution_weight")
DTYPES = (torch.float32,)  # bfloat16 packs only where the CPU has the instructions
PACKED_CONV = mkldnn._convolution_pointwise.default if AVAILABLE else None


def _packable(node: torch.fx.Node, consts: set[torch.fx.Node]) -> bool:
    """A 2-d, non-transposed float32 CPU convolution with constant weight and bias."""
    if node.target is not aten.convolution.default or len(node.args) != 9 or node.kwargs:
        return False
    x, w, b, *_, transposed, _, _ = node.args
    if transposed or w not in consts or (b is not None and b not in consts):
        return False
    vals = [getattr(a, "meta", {}).get("val") for a in (x, w)]
    if isinstance(vals[1], torch.Tensor) and _nhwc_only(vals[1]):
        return False  # aten's output is NHWC for an NHWC weight; oneDNN's follows the input
    return all(
        isinstance(v, torch.Tensor)
        and v.ndim == 4
        and v.dtype in DTYPES
        and v.device.type == "cpu"
        and all(type(d) is int for d in v.shape)
        for v in vals
    )


def _nhwc_only(t: torch.Tensor) -> bool:
    return (
        t.ndim == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()
    )


def _eager_strides_out(graph: torch.fx.Graph, conv: torch.fx.Node, val: torch.Tensor) -> None:
    """A graph output that is the packed call's result gets aten's layout back (a copy);
    the ops that read it inside the graph take any layout."""
    outputs = [u for u in conv.users if u.op == "output"]
    if not outputs or val.is_contiguous(memory_format=torch.channels_last):
        return
    with graph.inserting_after(conv):
        back = graph.call_function(
            aten.clone.default, (conv,), {"memory_format": torch.contiguous_format}
        )
    back.meta = {**conv.meta, "val": val}
    for out in outputs:
        out.replace_input_with(conv, back)


def prepack_conv(graph: torch.fx.Graph, frozen: set[torch.fx.Node]) -> int:
    """Replace each packable convolution (see :func:`_packable`) with oneDNN's call on a
    weight packed once; returns how many. The packing node reads constants only, so
    freezing's split moves it into the fold graph."""
    from ember.inductor.freezing import constants  # (freezing imports this module)

    if PACKED_CONV is None or not torch.backends.mkldnn.enabled:
        return 0
    consts = constants(graph, frozen, set())
    packed = 0
    for node in list(graph.nodes):
        if not _packable(node, consts):
            continue
        x, w, b, stride, padding, dilation, _, _, groups = node.args
        x_val, w_val = x.meta["val"], w.meta["val"]
        with graph.inserting_before(node):
            weight = graph.call_function(
                mkldnn._reorder_convolution_weight.default,
                (w, list(padding), list(stride), list(dilation), groups, list(x_val.shape)),
            )
            conv = graph.call_function(
                PACKED_CONV,
                # no fused activation: its name ("none"), its scalars, its algorithm
                (x, weight, b, list(padding), list(stride), list(dilation), groups, "none", [], ""),
            )
        weight.meta["val"] = w_val  # the packed tensor has no strides: the plain one's fake
        val = node.meta["val"]  # oneDNN's output is NHWC, whatever the input's layout
        conv.meta = {**node.meta, "val": val.contiguous(memory_format=torch.channels_last)}
        node.replace_all_uses_with(conv)
        graph.erase_node(node)
        _eager_strides_out(graph, conv, val)
        packed += 1
    return packed
