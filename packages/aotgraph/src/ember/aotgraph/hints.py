"""Plain-data hints that ``aot_compile`` leaves on the graphs it hands to compilers.

Three hints: which outputs are new values of inputs (``INPUT_UPDATES``, below), on an
inference graph which inputs are module state (``STATE_INPUTS``: :func:`state_inputs`), and
on a backward graph which inputs only the call holds (``OWNED_INPUTS``: :func:`owned_inputs`).

A functional graph returns the new value of each input it mutates as an extra output, and
the runtime copies that value back into the caller's tensor. A compiler that can store the
value straight into the input's memory saves that copy: ``gm.meta[INPUT_UPDATES]`` tells it
which outputs are new values of which inputs. It is a dict ``{output position: input
position}`` over the graph's flat outputs and its placeholders, plain ints, so any backend
may read it (or ignore it) without importing ember.

A compiler that uses it returns, at that output position, the input tensor itself (the
same Python object the graph was called with), holding the new value; the runtime then
skips the copy (:func:`~ember.aotgraph.runtime.write_back`). A compiler that returns
anything else gets the copy as before. The hint promises what the compiler needs to know
to write early: the input shares no storage with another input (the trace saw none, and
ember's capture guards that), and the backward graph does not read the input's old value.
It does not promise that no *other* output of the graph is the old value or a view of it:
the compiler checks that itself.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> gm = make_fx(lambda x, y: (x + y, y * 2))(torch.ones(2), torch.ones(2))
>>> mark_input_updates(gm, {1: 0})  # output 1 is the new value of input 0
>>> input_updates(gm)
{1: 0}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

__all__ = [
    "INPUT_UPDATES",
    "MODULE_STATE",
    "OWNED_INPUTS",
    "STATE_INPUTS",
    "input_updates",
    "mark_forward",
    "mark_input_updates",
    "mark_owned_inputs",
    "mark_state_inputs",
    "owned_inputs",
    "state_inputs",
    "state_inputs_of",
    "updates_of",
]

INPUT_UPDATES = "input_updates"  # the gm.meta key: {output position: input position}
# the gm.meta key of an inference graph: the inputs that are module state (a module's
# registered parameters and buffers, from the captured placeholders' "module_state" marks)
STATE_INPUTS = "state_inputs"
# A captured placeholder's mark: "parameter" or "buffer" (a module's registered state), None
# (other inputs); ember's capture writes it on every placeholder, any caller may.
MODULE_STATE = "module_state"
# the gm.meta key of a backward graph: positions of the inputs nothing but the call holds,
# the values the forward saved (not the primals, which are parameters or the caller's, nor
# the tangents, which autograd holds): called boxed, it frees each at its last use
OWNED_INPUTS = "owned_inputs"


def mark_owned_inputs(gm: torch.fx.GraphModule) -> None:
    """Record on a backward graph of ``aot_compile`` (placeholders ``primals_<i>``, the saved
    values by their forward names, ``tangents_<i>``) which inputs are saved values: a memory
    planner may count their memory as free after their last use.

    >>> gm = torch.fx.symbolic_trace(lambda primals_1, mul, tangents_1: tangents_1 * mul)
    >>> mark_owned_inputs(gm); owned_inputs(gm)
    (1,)
    """
    places = gm.graph.find_nodes(op="placeholder")
    foreign = ("primals_", "tangents_")
    gm.meta[OWNED_INPUTS] = tuple(
        k for k, p in enumerate(places) if not str(p.name).startswith(foreign)
    )


def owned_inputs(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """The positions :func:`mark_owned_inputs` recorded on ``gm`` (none without the hint).

    >>> owned_inputs(torch.fx.symbolic_trace(lambda x: x))
    ()
    """
    found = getattr(gm, "meta", {}).get(OWNED_INPUTS)
    if not isinstance(found, tuple) or not all(type(i) is int for i in found):
        return ()
    return found


def state_inputs_of(gm: Any, positions: Sequence[int], lifted: int = 0) -> tuple[int, ...] | None:
    """The flat inputs that are module state, when ``gm``'s placeholders say which are (each
    carries ``meta["module_state"]``), else None. ``positions``: which placeholders are flat
    inputs, in order; ``lifted``: how many parameters and buffers follow them (state too).

    >>> gm = torch.fx.symbolic_trace(lambda x, w: x * w)
    >>> state_inputs_of(gm, [0, 1]) is None
    True
    >>> x, w = gm.graph.find_nodes(op="placeholder")
    >>> x.meta[MODULE_STATE], w.meta[MODULE_STATE] = None, "buffer"
    >>> state_inputs_of(gm, [0, 1])
    (1,)
    """
    graph = getattr(gm, "graph", None)
    nodes = list(graph.find_nodes(op="placeholder")) if graph is not None else []
    if not any(MODULE_STATE in n.meta for n in nodes):
        return None
    marked = {i for i, n in enumerate(nodes) if n.meta.get(MODULE_STATE)}
    own = [k for k, pos in enumerate(positions) if pos in marked]
    return (*own, *range(len(positions), len(positions) + lifted))


def mark_state_inputs(gm: torch.fx.GraphModule, indices: Iterable[int] | None) -> None:
    """Record on ``gm`` which of its inputs are module state (None: it is not known). An
    inference compiler may treat them as constants (ember.inductor's freezing does).

    >>> gm = torch.fx.symbolic_trace(lambda x, w: x * w)
    >>> mark_state_inputs(gm, [1]); state_inputs(gm)
    (1,)
    """
    if indices is None:
        gm.meta.pop(STATE_INPUTS, None)
    else:
        gm.meta[STATE_INPUTS] = tuple(int(i) for i in indices)


def state_inputs(gm: torch.fx.GraphModule) -> tuple[int, ...] | None:
    """The module-state inputs recorded on ``gm``, or None when there is no such record.

    >>> state_inputs(torch.fx.symbolic_trace(lambda x: x)) is None
    True
    """
    found = getattr(gm, "meta", {}).get(STATE_INPUTS)
    if not isinstance(found, tuple) or not all(type(i) is int for i in found):
        return None
    return found


def mark_input_updates(gm: torch.fx.GraphModule, updates: Mapping[int, int]) -> None:
    """Record on ``gm`` that output ``k`` is the new value of input ``updates[k]`` (an empty
    mapping removes the hint).

    >>> gm = torch.fx.symbolic_trace(lambda x: x + 1)
    >>> mark_input_updates(gm, {0: 0}); mark_input_updates(gm, {}); input_updates(gm)
    {}
    """
    if updates:
        gm.meta[INPUT_UPDATES] = {int(k): int(i) for k, i in updates.items()}
    else:
        gm.meta.pop(INPUT_UPDATES, None)


def input_updates(gm: torch.fx.GraphModule) -> dict[int, int]:
    """The hint on ``gm`` (empty when there is none, or when it is not plain ints).

    >>> input_updates(torch.fx.symbolic_trace(lambda x: x))
    {}
    """
    found = getattr(gm, "meta", {}).get(INPUT_UPDATES)
    if not isinstance(found, dict):
        return {}
    if not all(type(k) is int and type(i) is int for k, i in found.items()):
        return {}
    return dict(found)


def updates_of(first: int, mutated: Iterable[int], skip: Iterable[int] = ()) -> dict[int, int]:
    """The hint for a graph whose mutation values start at output ``first``, one per input of
    ``mutated`` in order, leaving out the inputs of ``skip`` (their old value is still
    needed: the backward graph reads it).

    >>> updates_of(2, [0, 3, 5], skip=[3])
    {2: 0, 4: 5}
    """
    left_out = set(skip)
    return {first + j: i for j, i in enumerate(mutated) if i not in left_out}


def mark_forward(
    gm: torch.fx.GraphModule,
    num_outputs: int,
    mutated: Sequence[int],
    partition: Any | None,
    separate: bool,
) -> None:
    """The hint for a forward (or inference) graph of ``aot_compile``: its ``num_outputs``
    graph outputs are followed by the new values of the inputs ``mutated``. Inputs the
    backward graph reads (``partition.saved``: ``primals_<i+1>``) keep their old value, and
    with inputs sharing storage (``separate`` false: merged into one graph input) there is
    no hint.

    >>> gm = torch.fx.symbolic_trace(lambda x, y: (x + y, y * 2))
    >>> mark_forward(gm, 1, [0], None, separate=True); input_updates(gm)
    {1: 0}
    """
    saved = set() if partition is None else set(partition.saved)
    skip = [i for i in mutated if f"primals_{i + 1}" in saved]
    mark_input_updates(gm, updates_of(num_outputs, mutated, skip) if separate else {})
