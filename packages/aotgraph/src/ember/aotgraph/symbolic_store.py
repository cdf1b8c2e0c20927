"""The disk cache for graphs with symbolic sizes: a warm process skips their trace too.

:mod:`ember.aotgraph.store` keys a record on the example's sizes, which a graph with
symbolic sizes must not be bound to. Its record here is keyed on what the trace
read instead: the input graph, each placeholder's sizes and strides as expressions
over the ShapeEnv's symbols (``[s0, 64]``), and the ShapeEnv's state when the trace
starts (each symbol's range, the replacements, the guards so far). The graphs are
written with their sizes as expressions (:func:`ember.aotgraph.serialize.encode_expr`)
and read back as ``SymInt``\\ s of the graph's own ShapeEnv.

A trace also *adds* to that ShapeEnv: the guards it relied on (``Eq(Mod(s0, 2), 0)``
for a reshape by ``s0 // 2``), which capture turns into the frame's guards and
:class:`~ember.aotgraph.symbolic.ShapeCheck` checks on each call. The record keeps
them, and a hit replays them in order (``ShapeEnv.evaluate_expr``, as the trace did),
so the ShapeEnv ends as a trace would have left it. A hit is refused, and the graph
traced, when a recorded guard is false for this compile's example sizes (the trace of
those sizes may differ) or when the replay does not add exactly the recorded guards.

Inference graphs only: a training record would need its backward's saved sizes too.

A graph without symbols has no key here (:func:`ember.aotgraph.store.record_key` names it):

>>> from ember.aotgraph.trace import Lifted
>>> x = torch.ones(2)
>>> record_key(Lifted.of(torch.fx.symbolic_trace(lambda x: x * 2), [x]), None, [x], False, "k")
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._subclasses import FakeTensor

from ember.aotgraph import check, serialize, store
from ember.aotgraph.log import LOG
from ember.aotgraph.serialize import JSON, Unencodable
from ember.aotgraph.store import Traced
from ember.aotgraph.symbolic import GraphSymbols
from ember.aotgraph.trace import Lifted

__all__ = ["cached", "record_key"]


def _layout_id(found: GraphSymbols, inputs: Sequence[Any]) -> JSON:
    """Each graph input as the trace sees it (:func:`~ember.aotgraph.symbolic.fresh_fakes`):
    a placeholder's sizes and strides as expressions, its SymInt, or a static tensor's."""
    out: list[JSON] = []
    for i, real in enumerate(inputs):
        value = found.values[i] if i < len(found.values) else None
        if isinstance(value, torch.SymInt):
            out.append(["symint", str(value.node.expr)])
        elif not isinstance(real, torch.Tensor):
            raise Unencodable(f"a {type(real).__name__} input")
        elif isinstance(value, FakeTensor):
            flags = [real.requires_grad, real.is_conj(), real.is_neg(), real.is_inference()]
            layout = [[str(n) for n in value.shape], [str(n) for n in value.stride()]]
            out.append([*layout, str(value.storage_offset()), str(real.dtype), flags])
        else:
            out.append(store._tensor_id(real))
    return out


def _env_id(found: GraphSymbols) -> JSON:
    """What the ShapeEnv knows when the trace starts: it decides what the trace can prove
    without a guard, and so which graph and guards it makes."""
    env = found.env
    ranges = sorted(f"{s}: [{r.lower}, {r.upper}]" for s, r in env.var_to_range.items())
    replaced = sorted(f"{s} -> {e}" for s, e in env.replacements.items())
    return [ranges, replaced, [str(g.expr) for g in env.guards], sorted(map(str, env.divisible))]


def record_key(
    lifted: Lifted, found: GraphSymbols | None, inputs: Sequence[Any], grad: bool, settings: Any
) -> str | None:
    """The record's name for tracing ``lifted`` (with the symbols ``found``) on ``inputs``;
    ``None``: not cacheable (no settings key, float inputs, a part with no JSON form)."""
    if settings is None or found is None or lifted.floats:
        return None
    try:
        parts = [
            store.RECORD_VERSION,
            "symbolic",
            store._package_hash(),
            torch.__version__,
            list(sys.version_info[:2]),
            settings,
            store._module_id(lifted),
            _layout_id(found, inputs),
            _env_id(found),
            [lifted.input_positions, lifted.floats],
            [store._constant_id(lifted.template[i]) for i in lifted.constant_positions],
            grad,
            store.global_state(),
        ]
    except Unencodable:
        return None
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _changes(found: GraphSymbols, guards: int, replaced: dict[Any, Any]) -> list[str]:
    """The guards and replacements added since the ShapeEnv had ``guards`` guards and the
    replacements ``replaced``."""
    env = found.env
    added = [str(g.expr) for g in env.guards[guards:]]
    return added + sorted(
        f"{s} -> {e}" for s, e in env.replacements.items() if replaced.get(s) != e
    )


def _replay(found: GraphSymbols, record: dict[str, Any]) -> bool:
    """Add the record's guards to the ShapeEnv as its trace did; False (nothing added) if
    one is false for this compile's example sizes, or (some added) if the replay does not
    leave the ShapeEnv as the trace left it."""
    env = found.env
    symbols = {s.name: s for s in env.backed_var_to_val}
    guards = [serialize.decode_expr(g, symbols) for g in record["shape_guards"]]
    if not all(bool(g.xreplace(env.backed_var_to_val)) for g in guards):
        return False
    before, replaced = len(env.guards), dict(env.replacements)
    for g in guards:
        env.evaluate_expr(g)
    return bool(_changes(found, before, replaced) == record["changes"])


def _hit(found: GraphSymbols, record: dict[str, Any]) -> Traced | None:
    """The record's graphs, after replaying its guards; None if it cannot serve."""
    try:
        if not _replay(found, record):
            LOG.debug("symbolic record: its guards do not fit these sizes; tracing")
            return None
        with found.env.suppress_guards():  # building the fake values proves nothing new
            traced = store.decode(record, serialize.Fakes(found.mode))
    except Exception as e:  # not a record of ours after all: trace, and write it again
        LOG.debug("symbolic record not used: %s: %s", type(e).__name__, e)
        return None
    if check.enabled():
        check.check_functional(traced.forward, "forward graph from the cache")
    return traced


def cached(key: str | None, found: GraphSymbols, trace: Callable[[], Traced]) -> Traced:
    """``trace()``'s result for a graph with symbolic sizes: from the record for ``key`` if
    there is one that serves (its guards replayed into the ShapeEnv), else traced and,
    for an inference graph, saved with the guards the trace added."""
    record = store.load(key) if key is not None else None
    if record is not None and (traced := _hit(found, record)) is not None:
        return traced
    env = found.env
    before, replaced = len(env.guards), dict(env.replacements)
    traced = trace()
    if key is None or traced.partition is not None or traced.signature.training:
        return traced
    try:
        guards = [serialize.encode_expr(g.expr) for g in env.guards[before:]]
        changes = _changes(found, before, replaced)
        store.save(key, {**store.encode(traced), "shape_guards": guards, "changes": changes})
    except Exception as e:  # a graph that is not cached still compiles
        if check.enabled() and not isinstance(e, Unencodable):
            raise  # in tests: a bug of the encoder, not a graph it cannot hold
    return traced
