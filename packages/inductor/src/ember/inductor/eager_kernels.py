"""Whether eager has a kernel for an op at the dtypes a node gives it.

Fake tensors check shapes and dtypes of results, not whether a CPU kernel exists:
``torch.abs`` of a bool tensor, ``softmax`` of integers and ``argmax`` of bools trace
fine and raise in eager ("abs_cpu" not implemented for 'Bool'). A lowering would
compute something for them; :func:`lacks_kernel` runs the op once on one-element
tensors of the node's dtypes (cached per op and argument kinds) so that such a node
runs as the aten call instead, which raises eager's error.

>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> gm = make_fx(lambda x: (x.abs(), x.float().abs()), tracing_mode="fake")(torch.ones(2).bool())
>>> [lacks_kernel(n) for n in gm.graph.nodes if n.op == "call_function"]
[True, False, False]
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.utils._python_dispatch import _disable_current_modes

__all__ = ["lacks_kernel", "lacks_kernel_for", "unless_lacking"]

PROBE_LIMIT = 1 << 12  # numbers in a size argument past which the op is not probed
# What eager says when it has no kernel for a dtype (every other error is not about dtypes:
# the one-element probes break size arguments, which proves nothing).
NO_KERNEL = ("not implemented for", "not supported", "does not support")


@dataclass(frozen=True, slots=True)
class _Tensor:
    """A tensor argument, as the probe rebuilds it: all sizes 1."""

    dtype: torch.dtype
    ndim: int


def _frozen(value: Any) -> Any:
    """``value`` (an fx node, a fake or real tensor, a constant) as a hashable probe key;
    raises TypeError for what cannot be probed."""
    if isinstance(value, torch.fx.Node):
        value = value.meta.get("val")
        if not isinstance(value, torch.Tensor | bool | int | float):
            raise TypeError(f"a {type(value).__name__} argument")
    if isinstance(value, torch.Tensor):
        return _Tensor(value.dtype, value.dim())
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _frozen(v)) for k, v in value.items())
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        raise TypeError("a symbolic argument")
    hash(value)
    return value


def _thawed(value: Any) -> Any:
    if isinstance(value, _Tensor):
        return torch.ones((1,) * value.ndim, dtype=value.dtype)
    if isinstance(value, tuple):
        return [_thawed(v) for v in value]
    return value


def _small(key: Any) -> bool:
    """No size argument asks the probe for a big tensor (``new_zeros(x, [10**5, 10**5])``)."""
    if isinstance(key, tuple):
        ints = [v for v in key if isinstance(v, int) and not isinstance(v, bool)]
        return math.prod(abs(v) for v in ints) <= PROBE_LIMIT and all(_small(v) for v in key)
    return True


def lacks_kernel(node: torch.fx.Node) -> bool:
    """Whether eager has no kernel for ``node``'s op at its arguments' dtypes."""
    return lacks_kernel_for(node.target, node.args, node.kwargs)


def lacks_kernel_for(target: Any, args: Any, kwargs: Any) -> bool:
    """Whether eager has no kernel for ``target`` at the dtypes of ``args`` (fx nodes, fake
    or real tensors, constants)."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in target.tags:  # a probe would draw numbers
        return False
    try:
        args, kwargs = _frozen(args), _frozen(kwargs)
    except TypeError:
        return False
    tensors = any(isinstance(a, _Tensor) for a in args)
    if not tensors or not _small(args) or not _small(kwargs):
        return False
    return _probe(target, args, kwargs)


@functools.lru_cache(maxsize=4096)
def _probe(target: Any, args: tuple[Any, ...], kwargs: tuple[Any, ...]) -> bool:
    # on real tensors: a decomposition calls this while make_fx's fake and proxy modes are on
    with _disable_current_modes(), warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            target(*_thawed(args), **{k: _thawed(v) for k, v in kwargs})
        except Exception as e:
            return isinstance(e, NotImplementedError) or any(s in str(e) for s in NO_KERNEL)
    return False


def unless_lacking(op: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The decomposition ``fn`` of ``op``, except where eager has no kernel for ``op`` at
    the arguments' dtypes (``gelu`` of integers): there it returns ``NotImplemented``,
    which ``make_fx`` takes as "record the op itself", so the aten call raises eager's
    error instead of the decomposition computing a number. The same where the
    decomposition raises (``sign`` of bools subtracts bools, which the op does not).

    >>> gelu = unless_lacking(torch.ops.aten.gelu.default, lambda x: x * 0.5)
    >>> gelu(torch.ones(1)), gelu(torch.ones(1, dtype=torch.int64))
    (tensor([0.5000]), NotImplemented)
    """

    @functools.wraps(fn)
    def decomposition(*args: Any, **kwargs: Any) -> Any:
        if lacks_kernel_for(op, args, kwargs):
            return NotImplemented
        try:
            return fn(*args, **kwargs)
        except Exception:  # the decomposition fails where the op works (sign of bools)
            return NotImplemented

    return decomposition
