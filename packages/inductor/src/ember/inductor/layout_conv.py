"""Channels-last convolutions: a graph with 2-d convolutions on the CPU runs them on
channels-last activations, and what follows a convolution inherits that layout.

oneDNN (the kernel behind ``aten.convolution`` on the CPU) computes in a channels-last
(NHWC) layout: given a contiguous (NCHW) input it reorders the input in and the output
back on every call. On diffusers' tiny UNet the model's 25 convolutions took 19.5 ms a
step on NCHW activations and 18.0 ms on NHWC ones (1 thread, thread CPU time); torch
inductor makes the same choice for every CPU graph with a convolution
(``decide_layout_opt``). Group norm, SiLU and the other pointwise ops after a convolution
run on whatever layout their input has (the lowering follows each node's fake value), so
the layout travels from one convolution to the next without a copy.

:func:`channels_last_convolutions` rewrites an aten graph (fake values on its nodes, sizes
static or symbolic): each 2-d convolution's input is cloned into channels-last unless it
already is, every node's fake value is recomputed in order (a ``view`` that the new strides forbid
reads a contiguous copy, as :func:`ember.inductor.compile.decompose` does), and each
graph output whose layout changed is copied back to eager's strides: callers see what
eager returns. A cat of NHWC tensors along the channels runs as aten's kernel (copies of
contiguous runs) rather than ember's fused select chain, which along the innermost
dimension becomes a gather per element (10x slower on the UNet's skip connections). The
weights keep their layout (oneDNN reorders a weight on each call anyway;
:mod:`ember.inductor.freezing_conv` packs them once under freezing).

With symbolic sizes (``dynamic=True``) the rewrite is kept only if it added no guard to the
graph's ShapeEnv: capture has installed its guards already, so a layout decision that needed
one would go unchecked; sizes-only nodes (``float(H * W)``) are copied, not recomputed.
Where it does not pay, the graph is left alone: graphs with a convolution's backward (a
training graph's layouts follow the forward's saved tensors), and graphs where more than
:data:`MAX_RESTORED` outputs would need a copy back (a training forward returns the
activations its backward reads; each copy would cost a pass).

>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> def f(x, w, b):
...     return torch.relu(torch.nn.functional.conv2d(x, w, b, padding=1))
>>> x, w, b = torch.randn(2, 3, 8, 8), torch.randn(8, 3, 3, 3), torch.randn(8)
>>> new = channels_last_convolutions(make_fx(f, tracing_mode="fake")(x, w, b))
>>> [n.target.__name__ for n in new.graph.nodes if n.op == "call_function"]
['clone.default', 'convolution.default', 'relu.default', 'clone.default']
>>> out = new(x, w, b)
>>> torch.testing.assert_close(out, f(x, w, b)); out.is_contiguous()
True
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch._prims_common import infer_size
from torch._subclasses.fake_impls import _compute_stride
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils import _pytree as pytree

from ember.inductor import check, log
from ember.inductor.freezing import fake_mode_of
from ember.inductor.freezing_conv import PACKED_CONV

__all__ = ["MAX_RESTORED", "applies", "channels_last_convolutions"]

aten = torch.ops.aten

# Graph outputs whose layout may be copied back to eager's: an inference graph returns
# one image or two; a training forward returns every activation its backward reads.
MAX_RESTORED = 2
# What oneDNN's convolution computes in channels-last (others stay as they are).
DTYPES = (torch.float32, torch.bfloat16)
CL = torch.channels_last
# aten kernels that take their input contiguous in its suggested memory format only (their
# fake implementations accept any strides): the input of each at these positions is copied
# when the rewrite left it in another layout (group norm after a (N, C, H*W) view of an NHWC
# activation, in diffusers' attention block).
DENSE_INPUTS = {aten.native_group_norm.default: (0,)}


def _conv2d(node: torch.fx.Node) -> bool:
    """A 2-d, non-transposed convolution on CPU tensors of a type oneDNN takes (``aten``'s,
    or the call on a weight packed by freezing, :mod:`ember.inductor.freezing_conv`)."""
    packed = PACKED_CONV is not None and node.target is PACKED_CONV
    aten_conv = node.target is aten.convolution.default and len(node.args) >= 7
    if not (packed or (aten_conv and not node.args[6])):  # args[6]: transposed
        return False
    vals = [getattr(a, "meta", {}).get("val") for a in node.args[:2]]
    return all(
        isinstance(v, torch.Tensor) and v.ndim == 4 and v.dtype in DTYPES and v.device.type == "cpu"
        for v in vals
    )


def applies(gm: torch.fx.GraphModule) -> bool:
    """Whether the rewrite is tried on ``gm``: oneDNN on, a 2-d convolution, no convolution
    backward.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> applies(make_fx(torch.sin, tracing_mode="fake")(torch.randn(3)))
    False
    """
    if not (torch.backends.mkldnn.enabled and torch.backends.mkldnn.is_available()):  # type: ignore[no-untyped-call]
        return False
    nodes = list(gm.graph.nodes)
    if any(n.target is aten.convolution_backward.default for n in nodes):
        return False
    return any(_conv2d(n) for n in nodes)


def _layout_format(t: torch.Tensor) -> torch.memory_format | None:
    """The memory format whose clone gives ``t``'s strides, or None if neither does."""
    for fmt in (torch.contiguous_format, CL):
        if t.is_contiguous(memory_format=fmt):
            return fmt
    return None


class _Rewrite:
    """Copies ``gm``'s graph node by node, inserting layout changes, recomputing fake values."""

    def __init__(self, gm: torch.fx.GraphModule, mode: Any) -> None:
        self.gm, self.mode = gm, mode
        self.graph = torch.fx.Graph()
        self.env: dict[torch.fx.Node, torch.fx.Node] = {}
        self.cl_copies: dict[torch.fx.Node, torch.fx.Node] = {}  # node -> its NHWC clone
        self.restored = 0  # outputs copied back to eager's layout

    def call(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.fx.Node:
        node = self.graph.call_function(target, args, kwargs)
        node.meta["val"] = self.fake(node)
        return node

    def fake(self, node: torch.fx.Node) -> Any:
        args, kwargs = pytree.tree_map_only(torch.fx.Node, self.val, (node.args, node.kwargs))
        with self.mode:
            return node.target(*args, **kwargs)  # type: ignore[operator]

    def val(self, node: torch.fx.Node) -> Any:
        """``node``'s fake value in this rewrite's mode. A graph traced by ``make_fx`` on real
        tensors holds values of many fake modes (one per value), which one op cannot mix."""
        val = node.meta["val"]
        if isinstance(val, FakeTensor) and val.fake_mode is not self.mode:
            with self.mode:
                return torch.empty_strided(
                    val.shape, val.stride(), dtype=val.dtype, device=val.device
                )
        return val

    def clone(self, node: torch.fx.Node, fmt: torch.memory_format) -> torch.fx.Node:
        return self.call(aten.clone.default, (node,), {"memory_format": fmt})

    def channels_last(self, node: torch.fx.Node) -> torch.fx.Node:
        val = node.meta["val"]
        if val.is_contiguous(memory_format=CL):
            return node
        if node not in self.cl_copies:  # one copy for every convolution reading it
            self.cl_copies[node] = self.clone(node, CL)
        return self.cl_copies[node]

    def dense(self, node: torch.fx.Node) -> torch.fx.Node:
        """``node``, or a contiguous copy unless it is contiguous or a 4-d channels-last."""
        val = node.meta["val"]
        if val.is_contiguous() or (val.ndim == 4 and val.is_contiguous(memory_format=CL)):
            return node
        return self.clone(node, torch.contiguous_format)

    def copy(self, old: torch.fx.Node) -> None:
        if old.op == "output":
            self.output(old)
            return
        args, kwargs = pytree.tree_map_only(
            torch.fx.Node, self.env.__getitem__, (old.args, old.kwargs)
        )
        if old.op != "call_function" or _sizes_only(old):
            # a size computation (``float(s0 * s1)``) does not depend on layouts; recomputing
            # it on fake values would specialise its symbols (``float`` of a SymInt guards)
            new = self.graph.node_copy(old, self.env.__getitem__)
        elif _conv2d(old):
            args = (self.channels_last(args[0]), *args[1:])
            new = self.call(old.target, args, kwargs)
        elif old.target in DENSE_INPUTS:
            args = tuple(
                self.dense(a) if k in DENSE_INPUTS[old.target] else a for k, a in enumerate(args)
            )
            new = self.call(old.target, args, kwargs)
        elif old.target is aten.cat.default and _channel_cat(*args):
            # aten's kernel: ember's lowering (``aten.concat`` has none) fuses a cat as a
            # select per element, written for cats along outer dimensions; along NHWC's
            # channels, the innermost, that is a clamped gather in the vector loop: 0.45 ms
            # for the UNet's 4x(64+32)x32x32 cat, aten's copy of contiguous runs 0.045 ms
            new = self.call(aten.concat.default, args, kwargs)
        elif old.target is aten.view.default and not _views(args[0].meta["val"], old.args[1]):
            contiguous = self.clone(args[0], torch.contiguous_format)
            new = self.call(aten._unsafe_view.default, (contiguous, *args[1:]), kwargs)
        else:
            new = self.call(old.target, args, kwargs)
        if old.op == "call_function":
            new.meta = {**old.meta, "val": new.meta["val"]}
        self.env[old] = new

    def output(self, old: torch.fx.Node) -> None:
        def restore(arg: torch.fx.Node) -> torch.fx.Node:
            new, was = self.env[arg], arg.meta.get("val")
            if not isinstance(was, torch.Tensor) or new.meta["val"].stride() == was.stride():
                return new
            fmt = _layout_format(was)
            if fmt is None:
                raise _Declined(f"output {arg.name} has strides {was.stride()}")
            self.restored += 1
            return self.clone(new, fmt)

        self.graph.output(pytree.tree_map_only(torch.fx.Node, restore, old.args[0]))


class _Declined(Exception):
    """The rewrite does not pay or cannot keep eager's outputs: the graph stays as it was."""


def _sizes_only(node: torch.fx.Node) -> bool:
    """A node whose value holds no tensor: arithmetic on sizes."""
    if "val" not in node.meta:  # (its value is recomputed, as before)
        return False
    return not any(isinstance(v, torch.Tensor) for v in pytree.tree_leaves(node.meta["val"]))


def _channel_cat(tensors: Any, dim: int = 0) -> bool:
    """A cat of NHWC tensors along the channels."""
    vals = [t.meta["val"] for t in tensors if isinstance(t, torch.fx.Node)]
    return (
        len(vals) == len(tensors) > 1
        and all(v.ndim == 4 and v.is_contiguous(memory_format=CL) for v in vals)
        and dim % 4 == 1
    )


def _views(t: torch.Tensor, size: Any) -> bool:
    """Whether ``t``'s strides allow ``t.view(size)`` (a symbolic size is a node: its value)."""
    size = [s.meta["val"] if isinstance(s, torch.fx.Node) else s for s in size]
    shape = infer_size(size, t.numel())
    return _compute_stride(t.shape, t.stride(), shape) is not None


def channels_last_convolutions(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` with its 2-d CPU convolutions on channels-last activations (a new module), or
    ``gm`` itself where that does not apply or does not pay (see the module's docstring)."""
    mode = fake_mode_of(gm)
    if mode is None or not applies(gm):
        return gm
    rewrite = _Rewrite(gm, mode)
    shapes = mode.shape_env
    guards = None if shapes is None else len(shapes.guards)
    try:
        for node in gm.graph.nodes:
            rewrite.copy(node)
    except _Declined:
        return gm
    except Exception as e:  # an op whose fake value cannot be recomputed: eager's layout
        if check.enabled():  # (a bug of ours must not stop the user's program; tests: it must)
            raise
        log.LOG.warning("channels-last convolutions skipped: %r", e)
        return gm
    if rewrite.restored > MAX_RESTORED:
        return gm
    if shapes is not None and len(shapes.guards) != guards:
        # a layout decision on symbolic sizes needed a guard the compiled graph does not
        # check (capture installed its guards already): eager's layout, which needs none
        del shapes.guards[guards:]
        return gm
    new = torch.fx.GraphModule(gm, rewrite.graph)
    new.meta.update(gm.meta)
    return new
