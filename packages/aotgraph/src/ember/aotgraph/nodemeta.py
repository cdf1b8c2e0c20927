"""Node metadata through the aten trace: each aten node keeps where its captured node came from.

While :func:`~ember.aotgraph.trace.trace_joint` (or ``trace_forward``) runs ``make_fx``,
the captured graph runs through ``torch.fx.Interpreter`` under torch.fx's
``preserve_node_meta``: the interpreter makes each captured node the *current* node, and
``make_fx`` copies that node's ``nn_module_stack``, ``source_fn_stack``, ``stack_trace``
(and torch's other copied keys, ``custom`` among them) onto every aten node it records
for it, with ``original_aten``, the overload the captured op dispatched to (before
decomposition). Outside tracing the graph module runs its own generated code, as before.

>>> import torch
>>> gm = torch.fx.symbolic_trace(lambda x: torch.nn.functional.silu(x) * 2)
>>> for node in gm.graph.nodes:
...     node.meta["stack_trace"] = f'  File "model.py", line 3, in forward\\n    {node.name}\\n'
>>> from ember.aotgraph.trace import Lifted, analyze, trace_forward
>>> x = torch.ones(2)
>>> lifted = Lifted.of(gm, [x])
>>> fw = trace_forward(lifted, [x], analyze(lifted, [x], grad=False), {})
>>> [(str(n.meta["original_aten"]), n.meta["stack_trace"].split()[-1])
...  for n in fw.gm.graph.nodes if n.op == "call_function"]
[('aten.silu.default', 'silu'), ('aten.mul.Tensor', 'mul')]
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
import torch.fx
from torch.fx import traceback as fx_traceback
from torch.fx._lazy_graph_module import _LazyGraphModule, _use_lazy_graph_module
from torch.fx.experimental import proxy_tensor

from ember.aotgraph import hints

__all__ = [
    "MODULE_STATE",
    "ORIGINAL_ATEN",
    "backward_from_forward",
    "call_module",
    "canonical",
    "code_later",
    "generate_code",
    "inherit",
    "interpreted",
    "make_fx",
    "mark_backward",
]

ORIGINAL_ATEN = "original_aten"  # the aten overload a node's op dispatched to first
# a captured placeholder's module-state mark (see ember.aotgraph.hints)
MODULE_STATE = hints.MODULE_STATE
# torch's mark of a node autograd's formulas made (copied from node to node by make_fx)
TAG, BACKWARD = "partitioner_tag", "is_backward"
# what a backward node learns from the forward node of its autograd node, under torch's keys
FORWARD_KEYS = {
    "nn_module_stack": "fwd_nn_module_stack",
    "source_fn_stack": "fwd_source_fn_stack",
    "stack_trace": "stack_trace",  # the forward's line: which user code this gradient is of
}


def make_fx(
    f: Callable[..., Any],
    table: Any,
    mode: Literal["symbolic", "fake"],
    retraces: torch.fx.GraphModule | None = None,
) -> Callable[..., torch.fx.GraphModule]:
    """``make_fx(f, decomposition_table=table, tracing_mode=mode)``, with node metadata
    preserved: aten nodes get ``original_aten``, those a graph module run through
    :func:`call_module` records get its current node's keys, and backward nodes those of
    their forward node (:func:`mark_backward`). ``retraces``: the graph ``f`` runs
    (functionalized), whose nodes' keys the new ones keep (:func:`inherit`).

    >>> gm = make_fx(lambda x: torch.nn.functional.silu(x), {}, "fake")(torch.ones(2))
    >>> [n.meta[ORIGINAL_ATEN] for n in gm.graph.nodes if n.op == "call_function"]
    [<OpOverload(op='aten.silu', overload='default')>]
    """
    traced = proxy_tensor.make_fx(f, decomposition_table=table, tracing_mode=mode)

    def run(*args: Any) -> torch.fx.GraphModule:
        with fx_traceback.preserve_node_meta():
            gm = traced(*args)
        for node in gm.graph.nodes:
            node.meta[ORIGINAL_ATEN] = canonical(node.meta.get(ORIGINAL_ATEN))
        if retraces is None:
            backward_from_forward(gm)
        else:
            inherit(gm, retraces)
        return gm

    return run


def canonical(op: Any) -> Any:
    """torch's overload object for ``op``, a copy of it (``make_fx`` copies each meta value, and
    overloads compare by identity): ``meta["original_aten"] is aten.silu.default`` holds.

    >>> import copy
    >>> canonical(copy.copy(torch.ops.aten.silu.default)) is torch.ops.aten.silu.default
    True
    """
    if isinstance(op, torch._ops.OpOverload):
        return getattr(op.overloadpacket, op._overloadname)
    return op


def call_module(
    module: Callable[..., Any],
    args: Sequence[Any],
    names: Sequence[str] = (),
    tensors: Sequence[Any] = (),
) -> Any:
    """``module(*args)``, with the tensors ``tensors`` in place of its parameters and
    buffers ``names`` (``torch.func.functional_call``); a graph module runs node by node
    while metadata is preserved (see :func:`make_fx`).

    >>> linear = torch.nn.Linear(1, 1, bias=False)
    >>> call_module(linear, [torch.ones(1)], ["weight"], [torch.full((1, 1), 2.0)])
    tensor([2.])
    """
    graph = module if isinstance(module, torch.fx.GraphModule) else None
    if not fx_traceback.has_preserved_node_meta():
        graph = None  # not tracing: the generated code, fast
    if not names:
        return interpreted(graph)(*args) if graph is not None else module(*args)
    assert isinstance(module, torch.nn.Module)
    state = dict(zip(names, tensors, strict=True))
    if graph is not None:  # a child of a module that runs it node by node: names gain a prefix
        module = StateRunner(graph)
        state = {f"module.{name}": value for name, value in state.items()}
    return torch.func.functional_call(module, state, tuple(args))


def interpreted(gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """A function running ``gm`` through ``torch.fx.Interpreter``: each node is the current
    node while it runs, so what a trace records for it inherits its metadata.

    >>> gm = torch.fx.symbolic_trace(lambda x: x + 1)
    >>> interpreted(gm)(torch.zeros(1))
    tensor([1.])
    """

    def run(*args: Any) -> Any:
        interpreter = _Interpreter(gm)
        interpreter.extra_traceback = False  # the op's own error, as the generated code raises
        return _plain(interpreter.run(*args))

    return run


class _Interpreter(torch.fx.Interpreter):
    """``torch.fx.Interpreter``, with a dropout that eager runs as the identity run so.

    ``F.dropout(x, p, training=False)`` (and ``p == 0``) returns ``x`` itself in eager:
    ATen's composite kernel does, and so does a static trace. A symbolic trace runs with
    torch's Python dispatcher, which takes torch's Python decomposition of ``aten.dropout``
    instead: ``x.clone()``, a copy per dropout in the graph (18 in hf-t5-infer) that the
    static graph does not have."""

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        where = IDENTITY_DROPOUTS.get(target)
        if where is not None and _identity_dropout(where, args, kwargs):
            return args[0] if args else kwargs["input"]
        return super().call_function(target, args, kwargs)


# dropout functions -> (position, name, default) of their p and training arguments
IDENTITY_DROPOUTS: dict[Any, tuple[tuple[int, str, Any], tuple[int, str, Any]]] = {
    torch.nn.functional.dropout: ((1, "p", 0.5), (2, "training", True)),
    torch.dropout: ((1, "p", None), (2, "train", None)),
}


def _identity_dropout(where: Any, args: Any, kwargs: Any) -> bool:
    """Whether a dropout call with ``args``/``kwargs`` returns its input in eager (the
    input a tensor, ``training`` false or ``p`` zero, both plain values)."""
    (p_at, p_name, p_default), (t_at, t_name, t_default) = where
    x = args[0] if args else kwargs.get("input")
    p = args[p_at] if len(args) > p_at else kwargs.get(p_name, p_default)
    train = args[t_at] if len(args) > t_at else kwargs.get(t_name, t_default)
    if not isinstance(x, torch.Tensor) or type(train) is not bool:
        return False
    return not train or (type(p) in (int, float) and p == 0)


def _plain(value: Any) -> Any:
    """``value`` with fx's immutable lists and dicts (the output node's arguments) made the
    plain ones the generated code returns, so that its pytree spec is the same.

    >>> from torch.fx.immutable_collections import immutable_dict, immutable_list
    >>> _plain((immutable_dict(a=immutable_list([1])), 2))
    ({'a': [1]}, 2)
    """
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if type(value) is tuple:
        return tuple(_plain(v) for v in value)
    return value


class StateRunner(torch.nn.Module):
    """``module`` as a child, run node by node: ``torch.func.functional_call`` swaps its
    parameters (named ``module.<name>``) in while the interpreter reads them."""

    def __init__(self, module: torch.fx.GraphModule) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any) -> Any:
        return interpreted(self.module)(*args)


# -- backward nodes -----------------------------------------------------------------------------


def mark_backward(outputs: Sequence[Any]) -> None:
    """While metadata is preserved, before autograd runs backward from ``outputs``: each
    autograd node's formulas record aten nodes tagged as backward, with the autograd node's
    sequence number as ``seq_nr`` (the one its forward op's nodes carry).

    >>> def joint(x):
    ...     y = x.exp().sum()
    ...     mark_backward([y])
    ...     return torch.autograd.grad(y, x)
    >>> gm = make_fx(joint, {}, "fake")(torch.ones(2, requires_grad=True))
    >>> [n.name for n in gm.graph.nodes if n.meta.get(TAG) == BACKWARD]
    ['expand', 'detach_1', 'mul']
    """
    if not fx_traceback.has_preserved_node_meta():
        return
    seen: set[Any] = set()
    todo = [t.grad_fn for t in outputs if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    while todo:
        fn = todo.pop()
        if fn in seen:
            continue
        seen.add(fn)
        if type(fn).__name__ == "AccumulateGrad":  # a leaf (never run by grad(); maybe real)
            continue
        fn.register_prehook(functools.partial(_enter_backward, fn._sequence_nr()))
        fn.register_hook(_leave_backward)
        todo.extend(f for f, _ in fn.next_functions if f is not None)


def _enter_backward(seq_nr: int, grad_outputs: Any) -> None:
    fx_traceback.set_grad_fn_seq_nr(seq_nr)
    fx_traceback.current_meta[TAG] = BACKWARD


def _leave_backward(grad_inputs: Any, grad_outputs: Any) -> None:
    fx_traceback.reset_grad_fn_seq_nr()
    if "in_grad_fn" not in fx_traceback.current_meta:  # the outermost formula is done
        fx_traceback.current_meta.pop(TAG, None)


def backward_from_forward(gm: torch.fx.GraphModule) -> None:
    """Give each backward node the keys of the forward node of the same ``seq_nr`` (the first
    one: the op that made the autograd node), under :data:`FORWARD_KEYS`, as torch does.

    >>> gm = torch.fx.symbolic_trace(lambda x: x.exp() * 2)
    >>> exp, mul = [n for n in gm.graph.nodes if n.op.startswith("call")]
    >>> exp.meta.update(seq_nr=7, stack_trace="at exp")
    >>> mul.meta.update(seq_nr=7, partitioner_tag=BACKWARD)
    >>> backward_from_forward(gm)
    >>> mul.meta["stack_trace"]
    'at exp'
    """
    forward: dict[int, dict[str, Any]] = {}
    for node in gm.graph.nodes:
        meta = node.meta
        seq_nr = meta.get("seq_nr")
        if seq_nr is None:
            continue
        if meta.get(TAG) != BACKWARD:
            forward.setdefault(seq_nr, meta)
            continue
        found = forward.get(seq_nr)
        for key, to in FORWARD_KEYS.items():
            if found is not None and key in found:
                meta[to] = found[key]


def inherit(gm: torch.fx.GraphModule, source: torch.fx.GraphModule) -> None:
    """Give the nodes of ``gm``, a retrace of ``source``, the keys of the node each comes
    from (``from_node``) that make_fx does not copy (the backward ones) or sets anew
    (``original_aten``: the retrace's own op, not the one before decomposition).

    >>> first = make_fx(lambda x: x.add_(1), {}, "fake")(torch.ones(2))
    >>> functional = torch.func.functionalize(interpreted(first), remove="mutations")
    >>> again = make_fx(functional, {}, "fake", retraces=first)(torch.ones(2))
    >>> [str(n.meta[ORIGINAL_ATEN]) for n in again.graph.nodes if n.op == "call_function"]
    ['aten.add_.Tensor', 'aten.copy_.default']
    """
    by_name = {node.name: node.meta for node in source.graph.nodes}
    keys = (ORIGINAL_ATEN, "seq_nr", *FORWARD_KEYS.values())
    for node in gm.graph.nodes:
        origin = node.meta.get("from_node")
        found = by_name.get(origin[-1].name) if origin else None
        if found is not None:
            node.meta.update((key, found[key]) for key in keys if key in found)


def code_later() -> Any:
    """A block whose ``make_fx`` traces return graph modules that generate their Python code
    when first asked for it (torch's lazy graph module), not when made: the trace's passes
    change the graph anyway, and :func:`generate_code` generates it once after them
    (hf-gpt2, 12 layers: one of the two generations of a 911-node graph, about 0.03 s).

    >>> with code_later():
    ...     gm = make_fx(lambda x: x.cos(), {}, "fake")(torch.ones(2))
    >>> type(gm).__mro__[1].__name__
    '_LazyGraphModule'
    """
    return _use_lazy_graph_module(True)


def generate_code(gm: torch.fx.GraphModule) -> None:
    """Generate ``gm``'s code from its graph now (``recompile``); one made under
    :func:`code_later` becomes a plain ``torch.fx.GraphModule``, as ``make_fx`` makes
    outside it, so what ember hands on is of one class either way.

    >>> with code_later():
    ...     gm = make_fx(lambda x: x.cos(), {}, "fake")(torch.ones(2))
    >>> generate_code(gm)
    >>> type(gm).__mro__[1] is torch.fx.GraphModule, "cos" in gm.code
    (True, True)
    """
    if isinstance(gm, _LazyGraphModule):
        # GraphModule gives each instance a class of its own (its code's forward is set on
        # it): a new one under the plain base, with the name the constructor gave the old
        own = type("GraphModuleImpl", (torch.fx.GraphModule,), {})
        own.__name__ = type(gm).__name__
        gm.__class__ = own
    gm.recompile()
