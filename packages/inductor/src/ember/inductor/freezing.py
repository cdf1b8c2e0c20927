"""Inference freezing: module state read by an inference graph becomes constants.

With ``freezing`` on (``compile(m, backend="inductor", options={"freezing": True})`` or
``config.inductor.freezing``), :func:`freeze` rewrites an inference graph before lowering.
Its pipeline is a flat script of passes over the aten graph:

    frozen = frozen_inputs(gm, inputs)   # which inputs read as module state
    fold_conv_affine(graph, frozen)      # a per-channel affine after a conv (eval batch norm)
                                         #   -> the conv's weight and bias
    prepack_matmul(graph, frozen)        # a transposed constant weight made contiguous once,
                                         #   where the timed matmul says it pays
    plan = split(gm, graph, frozen)      # frozen-only nodes -> a fold graph run once;
                                         #   the rest -> the graph that is compiled

The compiled graph takes the live inputs and the folded constants. The returned
:class:`FrozenGraph` checks on each call that every frozen input is the tensor it froze,
with the same version counter and data pointer (an in-place update such as
``m.weight.mul_(2)`` under ``no_grad`` moves the counter); if not, it runs the fold graph
again on the new values (a re-freeze, with its reason in ``refreezes``), or, where the new
constants' layout differs from the compiled one, runs the original graph from then on
(``fallback``). A write through ``.data`` moves no counter and is not seen (as in torch).

Which inputs are frozen: those the graph lists in ``gm.meta["state_inputs"]`` (ember.aotgraph
lists the inputs ember's capture read from a module's registered parameters and buffers);
for a graph without that list, every ``nn.Parameter`` and plain tensors of at most one
dimension (buffers such as batch norm's running statistics), where a user's data input
frozen by mistake costs a re-freeze per call, never a wrong result. Only inference graphs
are frozen: ``ember.compiler``'s backend passes ``freezing`` to the inference compiler only.

>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> lin = torch.nn.Linear(4, 3)
>>> w, b, x = lin.weight.detach(), lin.bias.detach(), torch.randn(2, 4)
>>> gm = make_fx(lambda x, w, b: torch.addmm(b, x, w.t()))(x, w, b)
>>> w = torch.nn.Parameter(w, requires_grad=False)
>>> f = freeze(gm, [x, w, b], lambda g, ins: g)
>>> torch.testing.assert_close(f(x, w, b), lin(x), rtol=1e-5, atol=1e-6)
>>> f.plan.frozen, f.plan.live
((1, 2), (0,))
"""

from __future__ import annotations

import copy
import dataclasses
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ember.aotgraph.hints import state_inputs
from ember.inductor import check, log
from ember.inductor.freezing_conv import prepack_conv

__all__ = ["FreezePlan", "FrozenGraph", "freeze", "frozen_inputs"]

aten = torch.ops.aten
Compiler = Callable[[torch.fx.GraphModule, list[Any]], Callable[..., Any]]

# How many re-freeze reasons a FrozenGraph keeps (a data input frozen by mistake re-freezes
# on every call: the count grows, the list does not).
KEEP_REASONS = 8
# Frozen buffers of at most one dimension and this many elements keep a copy, compared by
# value when their version counter moves (see FrozenGraph._same_values).
SNAPSHOT_NUMEL = 1 << 16


def frozen_inputs(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> tuple[int, ...]:
    """The indices of the inputs that read as module state: those ``gm.meta["state_inputs"]``
    lists, or without that list ``nn.Parameter`` s and plain tensors of at most one
    dimension (buffers: batch norm statistics, scales).

    >>> frozen_inputs(None, [torch.randn(2, 3), torch.nn.Parameter(torch.ones(3, 3)),
    ...                      torch.zeros(3)])
    (1, 2)
    """
    # An input of symbolic size (dynamic=True) is data: a constant has one size.
    vals = [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")] if gm else []
    symbolic = {i for i, v in enumerate(vals) if _meta(v) is None and isinstance(v, torch.Tensor)}
    # Which inputs are module state: as the graph says (ember.aotgraph lists them from the
    # capture's sources), else by type and rank.
    declared = state_inputs(gm) if gm is not None else None
    return tuple(
        i
        for i, t in enumerate(example_inputs)
        if isinstance(t, torch.Tensor)
        and not isinstance(t, torch._subclasses.FakeTensor)
        and not t.is_inference()  # no version counter: an update could not be seen
        and (
            isinstance(t, torch.nn.Parameter) or t.dim() <= 1 if declared is None else i in declared
        )
        and i not in symbolic
    )


def _foldable(node: torch.fx.Node) -> bool:
    """Whether ``node`` may run once at freeze time: a pure, non-random aten op."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    if target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags:
        return False
    return True


def constants(
    graph: torch.fx.Graph, frozen: set[torch.fx.Node], blocked: set[torch.fx.Node]
) -> set[torch.fx.Node]:
    """The nodes computed from ``frozen`` placeholders and the graph's own tensors
    (``get_attr``) alone, ``blocked`` ones excluded."""
    found = set(frozen) | set(graph.find_nodes(op="get_attr"))
    for node in graph.nodes:
        if node in found or node in blocked or not _foldable(node):
            continue
        args = [
            a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, torch.fx.Node)
        ]
        if args and all(a in found for a in args):
            found.add(node)
    return found


class _Arith:
    """Builds ``x * s + t`` terms before ``anchor``: Python numbers fold at once, nodes get
    their fake value (``meta["val"]``) from their arguments'."""

    def __init__(self, graph: torch.fx.Graph, anchor: torch.fx.Node) -> None:
        self.graph, self.anchor = graph, anchor

    def call(self, target: Any, *args: Any) -> torch.fx.Node:
        with self.graph.inserting_before(self.anchor):
            node = self.graph.call_function(target, args)
        vals = [_meta(a.meta.get("val")) if isinstance(a, torch.fx.Node) else a for a in args]
        if all(v is not None for v in vals):  # on the meta device: any graph's fakes mix
            node.meta["val"] = target(*vals)
        return node

    def mul(self, a: Any, b: Any) -> Any:
        if isinstance(a, float) and isinstance(b, float):
            return a * b
        if a == 1.0 or b == 1.0:  # 1 * x -> x
            return b if a == 1.0 else a
        if isinstance(a, float):
            a, b = b, a
        return self.call(aten.mul.Tensor, a, b)

    def add(self, a: Any, b: Any) -> Any:
        if isinstance(a, float) and isinstance(b, float):
            return a + b
        if isinstance(a, float) and a == 0.0:  # 0 + x -> x
            return b
        if isinstance(b, float) and b == 0.0:  # x + 0 -> x
            return a
        if isinstance(a, float):
            a, b = b, a
        return self.call(aten.add.Tensor, a, b)

    def sub(self, a: Any, b: Any) -> Any:
        if isinstance(a, float) and isinstance(b, float):
            return a - b
        if isinstance(a, float):  # a - x -> (-x) + a
            return self.add(self.call(aten.neg.default, b), a)
        return self.call(aten.sub.Tensor, a, b)

    def div(self, a: Any, b: Any) -> Any:
        if isinstance(b, float):
            return self.mul(a, 1.0 / b)
        return self.mul(a, self.call(aten.reciprocal.default, b))


def _meta(val: Any) -> torch.Tensor | None:
    """A static-shaped tensor's layout on the meta device (None for anything else)."""
    if not isinstance(val, torch.Tensor) or not all(type(d) is int for d in val.shape):
        return None
    return torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device="meta")


# One step of a chain after a conv, ``y = op(x, c)`` with ``x = conv * s + t``: whether the
# conv side may be either operand, and the new (s, t).
AFFINE: dict[Any, tuple[bool, Callable[[_Arith, Any, Any, Any], tuple[Any, Any]]]] = {
    aten.mul.Tensor: (True, lambda b, s, t, c: (b.mul(s, c), b.mul(t, c))),  # (xs+t)c
    aten.add.Tensor: (True, lambda b, s, t, c: (s, b.add(t, c))),  # xs+t+c
    aten.sub.Tensor: (False, lambda b, s, t, c: (s, b.sub(t, c))),  # xs+t-c
    aten.div.Tensor: (False, lambda b, s, t, c: (b.div(s, c), b.div(t, c))),  # (xs+t)/c
}


def _per_channel(c: Any, out: torch.Tensor, consts: set[torch.fx.Node]) -> bool:
    """Whether ``c`` scales or shifts each output channel of a conv output ``out`` alone:
    a number, or a constant of ``out``'s dtype broadcasting along dimension 1 only."""
    if isinstance(c, int | float) and not isinstance(c, bool):
        return True
    if not isinstance(c, torch.fx.Node) or c not in consts:
        return False
    val = c.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype != out.dtype or val.dim() > out.dim():
        return False
    shape = [1] * (out.dim() - val.dim()) + list(val.shape)
    return all(d == 1 for i, d in enumerate(shape) if i != 1) and shape[1] in (1, out.shape[1])


def _channel_vector(c: Any, out: torch.Tensor, consts: set[torch.fx.Node]) -> bool:
    """Whether ``c`` is a constant vector of one value per channel of ``out`` (batch norm's
    statistics and affine parameters), of ``out``'s dtype."""
    val = c.meta.get("val") if isinstance(c, torch.fx.Node) and c in consts else None
    return (
        isinstance(val, torch.Tensor)
        and val.dtype == out.dtype
        and tuple(val.shape) == (out.shape[1],)
    )


@dataclass(frozen=True, slots=True)
class _Step:
    """One per-channel step after a conv: the nodes it replaces (the last one gives its
    value) and ``update(builder, s, t) -> (s, t)`` for ``y = conv * s + t``."""

    nodes: tuple[torch.fx.Node, ...]
    update: Callable[[_Arith, Any, Any], tuple[Any, Any]]


def _vector(b: _Arith, c: Any) -> Any:
    return c if isinstance(c, float) else b.call(aten.reshape.default, c, [-1])


def _binary_step(user: torch.fx.Node, cur: torch.fx.Node, out: Any, consts: set[Any]) -> Any:
    """``user = op(cur, c)`` with ``c`` per channel (AFFINE), or None."""
    rule = AFFINE.get(user.target)
    if rule is None or user.kwargs or len(user.args) != 2:
        return None
    either, fn = rule
    if user.args[0] is cur and user.args[1] is not cur:
        c = user.args[1]
    elif either and user.args[1] is cur and user.args[0] is not cur:
        c = user.args[0]
    else:
        return None
    if not _per_channel(c, out, consts):
        return None
    c = float(c) if isinstance(c, int | float) else c
    return _Step((user,), lambda b, s, t: fn(b, s, t, _vector(b, c)))


def _batch_norm_step(user: torch.fx.Node, cur: torch.fx.Node, out: Any, consts: set[Any]) -> Any:
    """``_native_batch_norm_legit_no_training(cur, w, b, mean, var, _, eps)[0]`` (what eval
    batch norm is under symbolic sizes, where it is not decomposed), or None:
    ``y = (x - mean) * k + b`` with ``k = w * rsqrt(var + eps)``."""
    if user.target is not aten._native_batch_norm_legit_no_training.default or user.kwargs:
        return None
    x, w, bias, mean, var, _, eps = user.args
    getters = list(user.users)
    if x is not cur or len(getters) != 1 or getters[0].args != (user, 0):
        return None
    if not all(a is None or _channel_vector(a, out, consts) for a in (w, bias)):
        return None
    if not all(_channel_vector(a, out, consts) for a in (mean, var)):
        return None
    if not isinstance(eps, float):
        return None

    def update(b: _Arith, s: Any, t: Any) -> tuple[Any, Any]:
        k = b.call(aten.rsqrt.default, b.add(var, eps))
        k = k if w is None else b.mul(k, w)
        s, t = b.mul(s, k), b.mul(b.sub(t, mean), k)
        return s, t if bias is None else b.add(t, bias)

    return _Step((user, getters[0]), update)


# Size reads of a conv's output: the folded conv has the same sizes, so they move to it.
SIZE_READS = (aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default)
STEPS = (_binary_step, _batch_norm_step)


def _chain(conv: torch.fx.Node, consts: set[torch.fx.Node]) -> list[_Step]:
    """The per-channel steps that follow ``conv`` (each the only reader of the one before;
    a conv's size reads aside, which must come after the chain's end)."""
    out = conv.meta.get("val")
    steps: list[_Step] = []
    cur = conv
    while isinstance(out, torch.Tensor):
        users = [u for u in cur.users if cur is not conv or u.target not in SIZE_READS]
        if len(users) != 1:
            break
        step = next((s for rule in STEPS if (s := rule(users[0], cur, out, consts))), None)
        if step is None:
            break
        steps.append(step)
        cur = step.nodes[-1]
    if not steps:
        return []
    order = {n: i for i, n in enumerate(conv.graph.nodes)}
    if any(order[u] < order[cur] for u in conv.users if u.target in SIZE_READS):
        return []
    return steps


def fold_conv_affine(graph: torch.fx.Graph, frozen: set[torch.fx.Node]) -> int:
    """Fold each per-channel affine chain after a convolution with constant weight (eval
    batch norm: ``(conv - mean) * rsqrt(var + eps) * gamma + beta``) into the conv's weight
    and bias: ``conv(x, w) * s + t == conv(x, w * s) + (b * s + t)``. Returns how many."""
    folded = 0
    for conv in list(graph.nodes):
        if conv.target is not aten.convolution.default or len(conv.args) != 9 or conv.kwargs:
            continue
        consts = constants(graph, frozen, set())
        _, w, bias, *_, transposed, _, _ = conv.args
        if transposed or "val" not in w.meta or w not in consts:
            continue
        if bias is not None and bias not in consts:
            continue
        steps = _chain(conv, consts)
        if not steps:
            continue
        end = steps[-1].nodes[-1]
        b = _Arith(graph, end)
        s, t = 1.0, 0.0
        for step in steps:
            s, t = step.update(b, s, t)
        w_val = w.meta["val"]
        s_w = s  # s along the weight's first dimension: [C, 1, 1, ...]
        if not isinstance(s, float):
            s_w = b.call(aten.reshape.default, s, [-1] + [1] * (w_val.dim() - 1))
        base = bias if bias is not None else b.call(aten.new_zeros.default, w, [w_val.shape[0]])
        new_bias = b.add(b.mul(base, s), t)
        new = b.call(
            aten.convolution.default, conv.args[0], b.mul(w, s_w), new_bias, *conv.args[3:]
        )
        new.meta["val"] = conv.meta["val"]  # the conv's layout, not the last step's
        end.replace_all_uses_with(new)
        for node in reversed([n for step in steps for n in step.nodes]):
            graph.erase_node(node)
        conv.replace_all_uses_with(new)  # its size reads, all after the chain's end
        graph.erase_node(conv)
        folded += 1
    return folded


# The matmul ops whose last argument may be a constant weight, as nn.Linear's ``w.t()``.
MATMULS = (aten.mm.default, aten.addmm.default)
_PAYS: dict[tuple[Any, ...], bool] = {}  # (M, K, N, dtype) -> contiguous weight is faster


def prepack_matmul(graph: torch.fx.Graph, frozen: set[torch.fx.Node]) -> int:
    """Give each matmul whose constant weight is transposed (``w.t()``, as nn.Linear reads
    it) a contiguous copy, made once at freeze time, where a timed trial of both layouts
    says it pays (:func:`_contiguous_pays`). Returns how many."""
    consts = constants(graph, frozen, set())
    packed = 0
    for node in list(graph.nodes):
        if node.target not in MATMULS or node.kwargs:
            continue
        a, w = node.args[-2], node.args[-1]
        w_val, a_val = w.meta.get("val"), getattr(a, "meta", {}).get("val")
        if w not in consts or not isinstance(w_val, torch.Tensor) or w_val.is_contiguous():
            continue
        if not isinstance(a_val, torch.Tensor) or not all(type(d) is int for d in a_val.shape):
            continue
        if not _contiguous_pays(tuple(a_val.shape), tuple(w_val.shape), w_val.dtype):
            continue
        with graph.inserting_before(node):
            clone = graph.call_function(
                aten.clone.default, (w,), {"memory_format": torch.contiguous_format}
            )
        clone.meta["val"] = w_val.contiguous()
        node.update_arg(len(node.args) - 1, clone)
        packed += 1
    return packed


def _contiguous_pays(a: tuple[int, ...], w: tuple[int, ...], dtype: torch.dtype) -> bool:
    """Whether ``a @ w`` runs faster with ``w`` contiguous than transposed, by 10% or more.
    Neither layout wins everywhere (measured on this machine's BLAS: contiguous 1.8x faster
    at 64x256 @ 256x1024, 1.3x slower at 128x768 @ 768x3072), so it is timed, once per
    shape in a process: a few ms per distinct shape."""
    key = (*a, *w, dtype)
    if key not in _PAYS and dtype.is_floating_point and len(a) == 2 and len(w) == 2:
        x = torch.randn(a, dtype=dtype)
        transposed = torch.randn(w[::-1], dtype=dtype).t()
        contiguous = transposed.contiguous()
        best = {"t": float("inf"), "c": float("inf")}
        for _ in range(3):  # interleaved rounds: a noisy machine slows both alike
            for name, m in (("t", transposed), ("c", contiguous)):
                start = time.perf_counter()
                for _ in range(2):
                    torch.mm(x, m)
                best[name] = min(best[name], time.perf_counter() - start)
        _PAYS[key] = best["c"] < 0.9 * best["t"]
    return _PAYS.get(key, False)


@dataclass(frozen=True, slots=True)
class FreezePlan:
    """A graph split at its frozen values.

    ``fold`` takes the frozen inputs (``frozen``: their indices among the graph's inputs)
    and returns the constants; ``graph`` takes the live inputs (``live``) then the
    constants, and returns what the original graph returns.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> w = torch.nn.Parameter(torch.randn(3, 4), requires_grad=False)
    >>> gm = make_fx(lambda x, w: x + (w * 2).sum(0))(torch.randn(2, 4), w)
    >>> plan = freeze(gm, [torch.randn(2, 4), w], lambda g, ins: g).plan
    >>> plan.frozen, plan.live, plan.folded  # w * 2 and its sum run once
    ((1,), (0,), 2)
    """

    frozen: tuple[int, ...]
    live: tuple[int, ...]
    fold: torch.fx.GraphModule
    graph: torch.fx.GraphModule
    folded: int  # nodes that run once, in ``fold``, instead of on every call
    conv_affine: int = 0  # conv + per-channel affine chains folded (batch norm)
    prepacked: int = 0  # matmul weights made contiguous, conv weights packed, once

    @property
    def worth_it(self) -> bool:
        """Whether freezing saves any per-call work (else the graph compiles as it is)."""
        return bool(self.folded or self.conv_affine or self.prepacked)


def _boundary(
    graph: torch.fx.Graph, frozen: set[torch.fx.Node]
) -> tuple[set[torch.fx.Node], list[torch.fx.Node]]:
    """The constant nodes, and those the rest of the graph reads (the fold's outputs).

    A constant larger than every constant it is computed from (an ``expand`` to the batch
    size) is not materialised: it would cost memory and a read per call, so it stays in the
    compiled graph, computed from the smaller constants."""
    blocked: set[torch.fx.Node] = set()
    while True:
        consts = constants(graph, frozen, blocked)
        boundary = [n for n in graph.nodes if n in consts and any(u not in consts for u in n.users)]
        grown = [n for n in boundary if not _materialisable(n, consts)]
        if not grown:
            return consts, boundary
        blocked.update(grown)


def _materialisable(node: torch.fx.Node, consts: set[torch.fx.Node]) -> bool:
    if node.op in ("placeholder", "get_attr"):
        return True
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not all(type(d) is int for d in val.shape):
        return False
    sources = [a.meta.get("val") for a in node.all_input_nodes if a in consts]
    sizes = [v.numel() for v in sources if isinstance(v, torch.Tensor)]
    return bool(sizes) and val.numel() <= max(sizes)


def split(root: torch.nn.Module, graph: torch.fx.Graph, frozen: Sequence[int]) -> FreezePlan:
    """``graph`` split into the graph of its constants (``fold``) and the rest (``graph``);
    ``root`` holds the tensors its ``get_attr`` nodes read."""
    placeholders = list(graph.find_nodes(op="placeholder"))
    frozen_nodes = {placeholders[i] for i in frozen}
    consts, boundary = _boundary(graph, frozen_nodes)
    needed = _ancestors(boundary, consts)
    fold = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for i in frozen:
        env[placeholders[i]] = fold.placeholder(placeholders[i].name)
    for node in graph.nodes:
        if node in needed and node.op != "placeholder":
            env[node] = fold.node_copy(node, env.__getitem__)
    fold.output(tuple(env[b] for b in boundary))
    live = tuple(i for i in range(len(placeholders)) if i not in set(frozen))
    rest = _live_graph(graph, [placeholders[i] for i in live], consts, boundary)
    folded = sum(n.op == "call_function" for n in needed)
    return FreezePlan(
        tuple(frozen),
        live,
        torch.fx.GraphModule(root, fold),
        torch.fx.GraphModule(root, rest),
        folded,
    )


def _ancestors(boundary: list[torch.fx.Node], consts: set[torch.fx.Node]) -> set[torch.fx.Node]:
    seen: set[torch.fx.Node] = set()
    todo = list(boundary)
    while todo:
        node = todo.pop()
        if node not in seen and node in consts:
            seen.add(node)
            todo.extend(node.all_input_nodes)
    return seen


def _live_graph(
    original: torch.fx.Graph,
    inputs: list[torch.fx.Node],
    consts: set[torch.fx.Node],
    boundary: list[torch.fx.Node],
) -> torch.fx.Graph:
    """The graph of the live inputs and the constants (placeholders ``frozen_<k>``); an
    output that is a constant is a copy of it, so a caller
    writing into an output cannot change the constant."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {n: graph.node_copy(n) for n in inputs}
    for k, node in enumerate(boundary):
        env[node] = graph.placeholder(f"frozen_{k}")
        if isinstance(node.meta.get("val"), torch._subclasses.FakeTensor):
            env[node].meta["val"] = node.meta["val"]  # checked against the constant later
    for node in original.nodes:
        if node.op == "placeholder" or node in consts:
            continue
        if node.op == "output":
            copies = {b: _copy_of(graph, env[b]) for b in node.all_input_nodes if b in consts}
            env.update(copies)
        env[node] = graph.node_copy(node, env.__getitem__)
    return graph


def _copy_of(graph: torch.fx.Graph, node: torch.fx.Node) -> torch.fx.Node:
    out = graph.call_function(aten.clone.default, (node,))
    if "val" in node.meta:
        out.meta["val"] = node.meta["val"]
    return out


def fake_mode_of(gm: torch.fx.GraphModule) -> Any:
    """The fake mode of ``gm``'s traced values (the first ``meta["val"]`` that has one), or
    None for a graph traced without fake tensors.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> fake_mode_of(make_fx(torch.sin)(torch.randn(2))) is not None  # make_fx records vals
    True
    >>> fake_mode_of(torch.fx.symbolic_trace(torch.nn.ReLU())) is None
    True
    """
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch._subclasses.FakeTensor):
            return val.fake_mode
    return None


def _layout(t: Any) -> tuple[Any, ...]:
    if not isinstance(t, torch.Tensor):
        return (type(t),)
    if t.layout is not torch.strided:  # a packed oneDNN weight has no strides
        return (t.shape, t.layout, t.dtype, t.device)
    return (t.shape, t.stride(), t.dtype, t.device)


class FrozenGraph:
    """A compiled graph whose frozen inputs' values were folded into constants.

    Call it with the original graph's inputs. Each call first checks that each frozen input
    is the tensor frozen, at the same version and address; when one is not, it re-freezes
    (``refreezes`` counts them, ``reasons`` keeps the first few) or, when the new constants'
    layouts differ from the compiled ones, runs the original graph from then on
    (``fallback`` says why). Other attributes (``schedule``, ``wrapper``, ...) are those of
    the compiled graph.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> w = torch.nn.Parameter(torch.ones(3, 4), requires_grad=False)
    >>> x = torch.ones(2, 3)
    >>> f = freeze(make_fx(lambda x, w: x @ (w * 2))(x, w), [x, w], lambda g, ins: g)
    >>> with torch.no_grad():
    ...     _ = w.mul_(3)
    >>> f(x, w)[0, 0].item(), f.refreezes, f.reasons
    (18.0, 1, ['input 1: updated in place (version 0 -> 1)'])
    """

    def __init__(
        self,
        plan: FreezePlan,
        compiled: Callable[..., Any],
        original: torch.fx.GraphModule,
        inputs: Sequence[Any],
        consts: Sequence[Any],
    ) -> None:
        self.plan, self.compiled, self._original = plan, compiled, original
        self._consts = tuple(consts)
        self._layouts = tuple(map(_layout, consts))
        self._watch = self._watching(inputs)
        self._snapshots = {  # small buffers, compared by value when only their version moved
            i: inputs[i].clone()
            for i in plan.frozen
            if inputs[i].dim() <= 1 and inputs[i].numel() <= SNAPSHOT_NUMEL
        }
        self.refreezes = 0
        self.reasons: list[str] = []
        self.fallback: str | None = None

    def _watching(self, inputs: Sequence[Any]) -> tuple[tuple[int, Any, int, int], ...]:
        return tuple(
            (i, inputs[i], inputs[i]._version, inputs[i].data_ptr()) for i in self.plan.frozen
        )

    def __call__(self, *args: Any) -> Any:
        if self.fallback is None:
            for i, t, version, ptr in self._watch:
                a = args[i]
                if a is not t or a._version != version or a.data_ptr() != ptr:
                    self._refreeze(args)
                    break
        if self.fallback is not None:
            return self._original(*args)
        return self.compiled(*[args[i] for i in self.plan.live], *self._consts)

    def _refreeze(self, args: Sequence[Any]) -> None:
        if self._same_values(args):
            self._watch = self._watching(args)
            return
        reason = self._reason(args)
        with torch.no_grad():
            consts = tuple(self.plan.fold(*[args[i] for i in self.plan.frozen]))
        self.refreezes += 1
        if tuple(map(_layout, consts)) != self._layouts:
            self.fallback = f"{reason}; the new constants' layouts differ from the compiled ones"
            log.LOG.warning(
                "freezing: running the graph as aten ops from now on: %s", self.fallback
            )
            return
        self._consts, self._watch = consts, self._watching(args)
        if len(self.reasons) < KEEP_REASONS:
            self.reasons.append(reason)
        log.LOG.info("freezing: constants folded again: %s", reason)

    def _same_values(self, args: Sequence[Any]) -> bool:
        """Whether every change is a version moved on a snapshotted buffer whose values are
        those frozen. ember.aotgraph writes batch norm's running statistics back after each
        call, even in eval mode, where they do not change: a version moved, no value."""
        for i, t, version, ptr in self._watch:
            a = args[i]
            if a is t and a._version == version and a.data_ptr() == ptr:
                continue
            snapshot = self._snapshots.get(i)
            if a is not t or a.data_ptr() != ptr or snapshot is None:
                return False
            if not torch.equal(a, snapshot):
                return False
        return True

    def _reason(self, args: Sequence[Any]) -> str:
        for i, t, version, ptr in self._watch:
            a = args[i]
            if a is not t:
                return f"input {i}: another tensor than the one frozen"
            if a._version != version:
                return f"input {i}: updated in place (version {version} -> {a._version})"
            if a.data_ptr() != ptr:
                return f"input {i}: its data was replaced (.data assigned)"
        return "no change"

    def direct(self) -> None:
        """None: a call checks the frozen inputs and drops them before the compiled graph's
        (which :meth:`ember.inductor.CompiledGraph.direct` would skip)."""
        return None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "compiled":
            raise AttributeError(name)
        return getattr(self.compiled, name)


def freeze(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], compile_inner: Compiler
) -> Callable[..., Any]:
    """Freeze an inference graph's module state (see the module's docstring) and compile the
    rest with ``compile_inner`` (``(graph, example_inputs) -> callable``). Returns a
    :class:`FrozenGraph`, or ``compile_inner``'s result for ``gm`` itself when freezing
    saves nothing (no frozen input, or nothing to fold)."""
    frozen = frozen_inputs(gm, example_inputs)
    try:
        made = _plan(gm, example_inputs, frozen) if frozen else None
    except Exception as e:  # a bug of ours must not stop the user's program (tests: it must)
        if check.enabled():
            raise
        warnings.warn(f"ember.inductor: freezing failed, compiling without it: {e!r}", stacklevel=2)
        made = None
    if made is None:
        return compile_inner(gm, list(example_inputs))
    plan, consts = made
    live = [example_inputs[i] for i in plan.live]
    compiled = compile_inner(plan.graph, [*live, *consts])
    return FrozenGraph(plan, compiled, gm, example_inputs, consts)


def _plan(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], frozen: tuple[int, ...]
) -> tuple[FreezePlan, tuple[Any, ...]] | None:
    """The passes, and the constants of the example inputs (None: nothing saved)."""
    work = copy.deepcopy(gm.graph)
    nodes = list(work.find_nodes(op="placeholder"))
    frozen_nodes = {nodes[i] for i in frozen}
    conv = fold_conv_affine(work, frozen_nodes)  # eval batch norm -> conv weight, bias
    packed = prepack_matmul(work, frozen_nodes)  # w.t() -> contiguous, where it pays
    packed += prepack_conv(work, frozen_nodes)  # conv weight -> oneDNN's layout, once
    work.eliminate_dead_code()
    plan = split(gm, work, frozen)  # constants -> fold; the rest -> graph
    plan = dataclasses.replace(plan, conv_affine=conv, prepacked=packed)
    if not plan.worth_it:
        return None
    with torch.no_grad():
        consts = tuple(plan.fold(*[example_inputs[i] for i in frozen]))
    _fake_constants(plan.graph, gm, consts)
    log.LOG.info(
        "freezing: %d inputs frozen, %d nodes folded, %d conv+affine, %d weights prepacked",
        *(len(frozen), plan.folded, conv, packed),
    )
    return plan, consts


def _fake_constants(
    graph: torch.fx.GraphModule, original: torch.fx.GraphModule, consts: Sequence[Any]
) -> None:
    """Give the constants' placeholders fake values (static shapes) in the graph's fake mode:
    the folded node's own where it has the constant's layout (most do: making a fake costs
    about 2 ms), else one made from the constant."""
    mode = fake_mode_of(original)
    if mode is None:
        return
    placeholders = list(graph.graph.find_nodes(op="placeholder"))
    for node, const in zip(placeholders[len(placeholders) - len(consts) :], consts, strict=True):
        val = node.meta.get("val")
        if not isinstance(val, torch._subclasses.FakeTensor) or _layout(val) != _layout(const):
            node.meta["val"] = mode.from_tensor(const, static_shapes=True)
