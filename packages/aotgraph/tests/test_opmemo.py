"""The per-op trace memo (ember.aotgraph.opmemo): an inference trace of repeated layers with
the memo gives the graph it gives without, node for node (targets, arguments, names, fake
values' layouts and aliasing, and metadata), and the compiled graph computes what eager
does. Layers of other shapes or dtypes, random ops and symbolic sizes never share a
template."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._decomp import get_decompositions
from torch._subclasses import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from ember.aotgraph import aot_compile, opmemo, settings
from ember.aotgraph.decompositions import DECOMPOSITIONS, default_decompositions
from ember.aotgraph.onepass import trace_inference
from ember.aotgraph.trace import Lifted, analyze, trace_forward, trace_joint

aten = torch.ops.aten
# with layer norm decomposed (into ten ops), as the inductor's table does
NORM = get_decompositions([aten.native_layer_norm.default, aten.gelu.default])
TABLE = {**default_decompositions(), **NORM, **DECOMPOSITIONS}


class Block(nn.Module):
    """A pre-norm transformer block: layer norm (decomposed into ten ops), a fused q/k/v
    projection split into views, attention, and an MLP."""

    def __init__(self, dim: int, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=2)
        q, k, v = (u.view(b, t, self.heads, d // self.heads).transpose(1, 2) for u in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Stack(nn.Module):
    """``depth`` blocks of width 8, then one of width 12 (a projection between) and one in
    float64: the last two must not reuse the first ones' templates."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(8) for _ in range(depth))
        self.widen = nn.Linear(8, 12)
        self.wide = Block(12)
        self.f64 = Block(12).double()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        for block in self.blocks:
            x = block(x)
        y = self.wide(self.widen(x))
        z = self.f64(y.double())
        return z, z.view(-1), y.transpose(0, 1), x[:, :1]  # views of outputs and intermediates


def annotated(module: nn.Module) -> torch.fx.GraphModule:
    """``module`` traced flat, each node with the metadata capture gives it (its layer's
    module path, its line), so that a stamped node must take its own."""
    gm = torch.fx.symbolic_trace(module)
    for node in gm.graph.nodes:
        if node.op.startswith("call"):
            path = str(node.target).rsplit(".", 1)[0] if node.op == "call_module" else node.name
            node.meta["stack_trace"] = f'  File "model.py", line 9, in forward\n    {node.name}\n'
            node.meta["nn_module_stack"] = {path: (path, nn.Module)}
            node.meta["custom"] = {"at": node.name}
    return gm


@contextlib.contextmanager
def watched() -> Iterator[list[opmemo.Memo]]:
    """The memos of the traces run in the block."""
    memos: list[opmemo.Memo] = []
    plain = opmemo.memoized

    @contextlib.contextmanager
    def keeping() -> Iterator[opmemo.Memo]:
        with plain() as memo:
            memos.append(memo)
            yield memo

    opmemo.memoized = keeping  # type: ignore[assignment]
    try:
        yield memos
    finally:
        opmemo.memoized = plain  # type: ignore[assignment]


META = (
    "stack_trace", "nn_module_stack", "custom", "original_aten", "seq_nr", "torch_fn",
    "partitioner_tag", "fwd_nn_module_stack", "fwd_source_fn_stack", "eager_input_vals",
)  # fmt: skip


def described(gm: torch.fx.GraphModule) -> list[Any]:
    """Each node: its text, its value's layout, which earlier value's storage it shares, and
    the metadata keys and values the trace sets."""
    out, storages = [], {}
    # autograd's sequence numbers count on across traces: compared from the first node's
    first = next(iter(gm.graph.nodes)).meta.get("seq_nr", 0)
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        layout = None
        if isinstance(val, torch.Tensor):
            storage = val.untyped_storage()._cdata
            shares = storages.setdefault(storage, node.name)
            layout = (
                tuple(val.shape), val.stride(), val.storage_offset(), val.dtype,
                val.requires_grad, val._is_view(), shares,
            )  # fmt: skip
        meta = {k: str(node.meta.get(k)) for k in META}
        if "seq_nr" in node.meta:
            meta["seq_nr"] = str(node.meta["seq_nr"] - first)
        origin = node.meta.get("from_node")
        meta["from_node"] = str([source.name for source in origin]) if origin else ""
        tensor_meta = node.meta.get("tensor_meta")
        out.append((node.format_node(), layout, meta, sorted(node.meta), str(tensor_meta)))
    return out


def traced(gm: torch.fx.GraphModule, inputs: list[Any], memo: bool) -> tuple[Any, Any]:
    lifted = Lifted.of(gm, inputs)  # parameters become inputs
    with settings.section.patch(trace_memo=memo), torch.no_grad():
        found = trace_inference(lifted, lifted.flat_inputs(inputs), TABLE)
    assert found is not None
    return found


def test_a_stack_traces_node_for_node_as_without_the_memo():
    torch.manual_seed(0)
    gm = annotated(Stack(4).eval())
    x = torch.randn(2, 5, 8)
    inputs = [x]
    plain_sig, plain = traced(gm, inputs, memo=False)
    with watched() as memos:
        sig, graph = traced(gm, inputs, memo=True)
    with watched() as fewer:
        traced(annotated(Stack(2).eval()), inputs, memo=True)
    (memo,) = memos
    assert memo.misses == fewer[0].misses  # two more repeats: nothing more recorded,
    assert memo.hits > fewer[0].hits > 0  # only stamped
    assert graph.gm.code == plain.gm.code
    assert described(graph.gm) == described(plain.gm)
    assert sig == plain_sig
    # z.view(-1) is made from z at run time, as eager's view of it: aliasing came through
    assert [o.kind for o in sig.outputs] == ["graph", "view", "graph", "graph"]
    with torch.no_grad():
        want = gm(x)
        f = aot_compile(gm, inputs, fw_compiler=lambda g, _: g, cache=False)
        got = f(x)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_a_stamped_view_is_made_without_dispatching_it_again(monkeypatch):
    """A repeat's view ops (the q/k/v split, head views, transposes) are made as torch's
    fake-tensor cache makes them, not dispatched to the fake mode again: a stack of four
    blocks dispatches as many of them as a stack of two (the first block's, recorded)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    dispatched: list[Any] = []
    plain = FakeTensorMode.dispatch

    def noting(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if isinstance(func, torch._ops.OpOverload) and func.is_view:
            dispatched.append(func)
        return plain(self, func, types, args, kwargs)

    monkeypatch.setattr(FakeTensorMode, "dispatch", noting)
    counts = []
    for depth in (2, 2, 4):  # the first: torch's first uses of these ops dispatch more
        torch.manual_seed(0)
        del dispatched[:]
        traced(annotated(Stack(depth).eval()), [torch.randn(2, 5, 8)], memo=True)
        counts.append(len(dispatched))
    assert counts[1] == counts[2] > 0


def test_layers_of_other_shapes_or_dtypes_do_not_share_an_entry():
    torch.manual_seed(0)
    gm = annotated(Stack(1).eval())
    with watched() as memos:
        _, graph = traced(gm, [torch.randn(2, 5, 8)], memo=True)
    (memo,) = memos
    norms = [key for key in memo.entries if key[0] is aten.native_layer_norm.default]
    dtypes = {tensors[0][6] for _, _, tensors, _ in norms}
    widths = {tensors[0][3][-1] for _, _, tensors, _ in norms}
    assert dtypes == {torch.float32, torch.float64} and widths == {8, 12}
    by_dtype = {}
    for node in graph.gm.graph.nodes:
        if node.target is aten.var_mean.correction:
            by_dtype.setdefault(node.meta["val"][0].dtype, []).append(node.args[0].name)
    assert set(by_dtype) == {torch.float32, torch.float64}


def test_keys_tell_apart_what_changes_the_graph():
    mode = FakeTensorMode()
    with mode:
        a, b = torch.empty(2, 3), torch.empty(2, 3)
        kinds = {
            "base": (a, b),
            "other dtype": (a.double(), b),
            "other size": (torch.empty(3, 3), torch.empty(3, 3)),
            "other stride": (a.t().contiguous().t(), b),
            "same tensor twice": (a, a),
            "aliasing views": (a[0], a[1]),
            "offset view": (a[1], b[0]),
        }

    class Tracker:  # the tracer's slots for these fakes: each its own node
        tensor_tracker = {
            t: type("Slot", (), {"constant": None, "proxy": type("P", (), {"node": object()})})
            for pair in kinds.values()
            for t in pair
        }
        record_stack_traces = False

    mode_like = type(
        "Mode", (), {"tracer": Tracker, "decomposition_table": {}, "pre_dispatch": False,
                     "emulate_precision_casts": False},
    )  # fmt: skip
    keys = {
        name: opmemo._key(mode_like, aten.add.Tensor, pair, {})[0] for name, pair in kinds.items()
    }
    assert len(set(keys.values())) == len(keys)
    with pytest.raises(opmemo._NotMemoized):  # random: never memoized
        opmemo._key(mode_like, aten.bernoulli.default, (a,), {})
    assert (
        opmemo._key(mode_like, aten.add.Tensor, (a, 0.0), {})[0]
        != opmemo._key(mode_like, aten.add.Tensor, (a, -0.0), {})[0]
    )


def test_random_ops_are_traced_each_time():
    gm = torch.fx.symbolic_trace(lambda x: (torch.rand_like(x) + x, torch.rand_like(x) + x))
    x = torch.randn(3)
    with watched() as memos:
        _, graph = traced(gm, [x], memo=True)
    plain = traced(gm, [x], memo=False)[1]
    assert graph.gm.code == plain.gm.code
    rand = [n for n in graph.gm.graph.nodes if n.target is aten.rand_like.default]
    assert len(rand) == 2
    assert not any(key[0] is aten.rand_like.default for key in memos[0].entries)


FAKE_CALLS: list[int] = []


@torch.library.custom_op("ember_test_opmemo::scale", mutates_args=())
def scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@scale.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    FAKE_CALLS.append(1)  # user code: it runs for every call, as without the memo
    return torch.empty_like(x)


def test_custom_ops_run_their_fake_kernel_each_time():
    gm = torch.fx.symbolic_trace(lambda x: scale(scale(x).sin().sin()) + scale(x))
    x = torch.randn(3)
    FAKE_CALLS.clear()
    with watched() as memos:
        _, graph = traced(gm, [x], memo=True)
    assert len(FAKE_CALLS) == 3 and memos[0].hits == 1  # the second sin only
    assert graph.gm.code == traced(gm, [x], memo=False)[1].gm.code


def test_symbolic_sizes_are_traced_as_before():
    gm = annotated(nn.Sequential(Block(8), Block(8)).eval())
    x = torch.randn(2, 5, 8)

    def symbolic_trace(memo: bool) -> Any:
        """A trace on fakes of a new ShapeEnv (the sequence dynamic), after a first trace
        that settles it, as capture's run does."""
        mode = FakeTensorMode(shape_env=ShapeEnv())
        dims = StatelessSymbolicContext(
            dynamic_sizes=[DimDynamic.STATIC, DimDynamic.DYNAMIC, DimDynamic.STATIC]
        )
        fake = [mode.from_tensor(x, symbolic_context=dims)]
        lifted = Lifted.of(gm, fake)
        with settings.section.patch(trace_memo=memo):
            trace_inference(lifted, lifted.flat_inputs(fake), TABLE)
        return traced(gm, fake, memo=memo)[1]

    plain = symbolic_trace(memo=False)
    with watched() as memos:
        graph = symbolic_trace(memo=True)
    assert graph.gm.code == plain.gm.code
    assert described(graph.gm) == described(plain.gm)
    recorded = {key[0] for key, entry in memos[1].entries.items() if entry is not opmemo._UNUSABLE}
    assert recorded <= {aten.t.default}  # only ops on the weights the trace left static


def test_trace_forward_uses_it_and_the_setting_turns_it_off():
    gm = annotated(nn.Sequential(Block(8), Block(8)).eval())
    x = torch.randn(2, 5, 8)
    lifted = Lifted.of(gm, [x])
    flat = lifted.flat_inputs([x])
    sig = analyze(lifted, flat, grad=False)
    with watched() as memos:
        graph = trace_forward(lifted, flat, sig, TABLE)
        with settings.section.patch(trace_memo=False):
            plain = trace_forward(lifted, flat, sig, TABLE)
    assert len(memos) == 1 and memos[0].hits > 0
    assert described(graph.gm) == described(plain.gm)


def test_a_joint_trace_is_node_for_node_as_without_the_memo():
    torch.manual_seed(0)
    gm = annotated(Stack(3).train())
    x = torch.randn(2, 5, 8, requires_grad=True)
    lifted = Lifted.of(gm, [x])
    flat = lifted.flat_inputs([x])
    sig = analyze(lifted, flat, grad=True)
    with settings.section.patch(trace_memo=False):
        plain = trace_joint(lifted, flat, sig, TABLE)
    with watched() as memos:
        joint = trace_joint(lifted, flat, sig, TABLE)
    assert memos[0].hits > 0
    assert joint.gm.code == plain.gm.code
    assert described(joint.gm) == described(plain.gm)
    assert (joint.mutated, joint.num_grads) == (plain.mutated, plain.num_grads)
    f = aot_compile(gm, [x], fw_compiler=lambda g, _: g, bw_compiler=lambda g, _: g, cache=False)
    want = gm(x)
    got = f(x)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    grads = torch.autograd.grad(sum(o.sum() for o in got), [x, *gm.parameters()])
    expected = torch.autograd.grad(sum(o.sum() for o in want), [x, *gm.parameters()])
    for a, b in zip(grads, expected, strict=True):
        torch.testing.assert_close(a, b)


def test_the_hook_is_removed_after_the_trace():
    proxy_call = torch.fx.experimental.proxy_tensor.proxy_call
    with opmemo.memoized():
        assert torch.fx.experimental.proxy_tensor.proxy_call is not proxy_call
    assert torch.fx.experimental.proxy_tensor.proxy_call is proxy_call
