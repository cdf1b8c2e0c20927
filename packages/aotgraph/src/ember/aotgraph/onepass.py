"""An inference graph traced in one run: :func:`~ember.aotgraph.trace.analyze` and
:func:`~ember.aotgraph.trace.trace_forward` share ``make_fx``'s run of the function.

``analyze`` runs the function on fakes to learn which outputs the graph returns (not
those aliasing an input, not constants), then ``trace_forward`` runs it again under
``make_fx`` returning those. Without gradients the first run teaches the second nothing
it needs beforehand: ``make_fx`` can trace the function returning every tensor and
number, the signature is read from that same run, and the output node then keeps the
graph outputs only; dead-code elimination drops what fed the others, as it would after
``trace_forward``. With symbolic sizes each run costs the ``SymNode`` arithmetic of
every op again: 0.3 s of gpt-infer's cold compile.

Where an input is written or restrided in place (the two-run path rewrites the function
first, and counts eager's version bumps, which ``make_fx``'s decompositions do not keep),
or the run fails, it returns None and the caller takes the two-run path, which raises
the error it always did.

>>> import torch
>>> from ember.aotgraph.trace import Lifted
>>> gm = torch.fx.symbolic_trace(lambda x: (x.t(), x.sin() + 1, 3))
>>> x = torch.randn(2, 3)
>>> sig, graph = trace_inference(Lifted.of(gm, [x]), [x], {})
>>> [o.kind for o in sig.outputs], sig.graph_outputs
(['alias', 'graph', 'constant'], (1,))
>>> print(graph.gm.code.strip())  # doctest: +NORMALIZE_WHITESPACE
def forward(self, primals_1):
    sin = torch.ops.aten.sin.default(primals_1);  primals_1 = None
    add = torch.ops.aten.add.Tensor(sin, 1);  sin = None
    return [add]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from ember.aotgraph import opmemo
from ember.aotgraph.trace import (
    JointGraph,
    Observed,
    Signature,
    Specialized,
    Table,
    _fake_mode,
    _fakes,
    _finish,
    _trace,
    _unspecialized,
)

__all__ = ["trace_inference", "trace_without_grad"]

_NUMBERS = (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)


def trace_inference(
    fn: Callable[..., Any], inputs: Sequence[Any], table: Table
) -> tuple[Signature, JointGraph] | None:
    """The signature and forward graph of ``fn`` without gradients, from one ``make_fx``
    run; None where the two-run path must decide (see the module docstring)."""
    seen: list[Observed] = []

    def run(*args: Any) -> list[Any]:
        seen.append(Observed.start(args))
        leaves = seen[-1].after(fn(*args))
        return [leaf for leaf in leaves if isinstance(leaf, _NUMBERS)]

    try:
        gm = trace_without_grad(run, inputs, table)
        sig = seen[0].signature(inputs, grad=False)
    except Specialized:
        raise  # analyze would find the same: the caller retraces with the float constant
    except Exception:
        return None  # the two runs raise the error they always did, in their order
    if sig.restrided or any(sig.versions):
        # own_views and Merge rewrite the function before its trace; and make_fx's
        # decompositions move version counters as eager's ops do not (add_: add, copy_)
        return None
    _keep_outputs(gm, seen[0], sig)
    n_outs = len(sig.graph_outputs)
    mutated = _finish(gm, len(inputs), n_outs)
    return sig, JointGraph(gm, len(inputs), 0, n_outs, mutated, 0)


def trace_without_grad(
    fn: Callable[..., Any], inputs: Sequence[Any], table: Table
) -> torch.fx.GraphModule:
    """``fn``'s functional aten graph over fakes of ``inputs`` with gradients off, in the
    inputs' fake mode (their symbolic sizes) or a static one; raises ``Specialized`` if
    the trace needed a float input's value. The caller then ``_finish``-es it.

    >>> import torch
    >>> gm = trace_without_grad(lambda x: [x.cos()], [torch.ones(2)], {})
    >>> [n.target for n in gm.graph.nodes if n.op == "call_function"]
    [<OpOverload(op='aten.cos', overload='default')>]
    """
    mode = _fake_mode(inputs)
    with torch.no_grad(), opmemo.if_enabled():  # repeated layers: each op traced once
        gm = _trace(fn, _fakes(mode, inputs), table)
    _unspecialized(mode)
    return gm


def _keep_outputs(gm: torch.fx.GraphModule, seen: Observed, sig: Signature) -> None:
    """Make the graph return the signature's graph outputs, as ``trace_forward``'s does."""
    assert seen.leaves is not None
    returned = [p for p, leaf in enumerate(seen.leaves) if isinstance(leaf, _NUMBERS)]
    slot = {p: k for k, p in enumerate(returned)}
    (output,) = gm.graph.find_nodes(op="output")
    (values,) = output.args
    output.args = ([values[slot[p]] for p in sig.graph_outputs],)
