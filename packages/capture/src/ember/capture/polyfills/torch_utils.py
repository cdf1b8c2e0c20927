"""``torch.utils.checkpoint``, as compiled code sees it inside an ember capture.

Activation checkpointing trades memory for time: it drops the function's intermediate
values after the forward and recomputes them in backward. Its values and gradients are
those of calling the function itself, so inside a graph the function is traced inline,
its nodes tagged as torch tags them (``recompute``, ``ac_graph_id``: see
``ember.capture.nodemeta``), so that the partitioner recomputes them in backward as
eager does instead of saving them. Stepping through torch's own implementation
instead would record its saved-tensor hooks around a graph that has none, and backward
would then see a different number of saved tensors. The argument checks eager makes (and
the reentrant variant's no-grad result when no input requires grad) are kept.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils.checkpoint as _checkpoint

from ember.capture import markers
from ember.capture.polyfills import polyfill


@polyfill(_checkpoint.checkpoint)
def checkpoint(
    function: Any,
    *args: Any,
    use_reentrant: bool | None = None,
    context_fn: Any = _checkpoint.noop_context_fn,
    determinism_check: str = "default",
    debug: bool = False,
    early_stop: bool = True,
    **kwargs: Any,
) -> Any:
    if use_reentrant is None:
        use_reentrant = True  # torch's default (it also warns)
    kwargs.pop("preserve_rng_state", True)
    if kwargs and use_reentrant:
        raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))
    if use_reentrant:
        if context_fn is not _checkpoint.noop_context_fn or debug is not False:
            raise ValueError(
                "Passing `context_fn` or `debug` is only supported when use_reentrant=False."
            )
        if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            with torch.no_grad():  # CheckpointFunction: no input needs grad, no grad out
                return function(*args)
        return _region(function, args, {})
    if context_fn is not _checkpoint.noop_context_fn:
        forward_context, _ = context_fn()
        with forward_context:
            return _region(function, args, kwargs)
    return _region(function, args, kwargs)


def _region(function: Any, args: Any, kwargs: Any) -> Any:
    markers.checkpoint_region(True)
    out = function(*args, **kwargs)
    markers.checkpoint_region(False)
    return out
