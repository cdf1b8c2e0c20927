"""Helpers of capture's tests of its fake-tensor shortcuts (test_fakepointwise.py,
test_fakestrides.py, test_fakeops.py): symbolic fakes, and what torch's own fake kernel
makes of an op, to compare the shortcut's result with."""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext


def fake(mode: Any, real: torch.Tensor, dynamic: list[bool]) -> Any:
    """A fake of ``real`` in ``mode``, its dims symbolic where ``dynamic`` says."""
    kinds = [DimDynamic.DYNAMIC if d else DimDynamic.STATIC for d in dynamic]
    return mode.from_tensor(real, symbolic_context=StatelessSymbolicContext(dynamic_sizes=kinds))


def torch_result(mode: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What torch's fake kernel makes of the op (TracerFakeMode's override bypassed)."""
    with mode:
        return FakeTensorMode.dispatch(mode, func, (), args, kwargs)


def exprs(values: Any) -> tuple[str, ...]:
    """Sizes or strides as text: a SymInt's expression, an int's value."""
    return tuple(str(v.node.expr) if isinstance(v, torch.SymInt) else str(v) for v in values)


def hints(values: Any) -> tuple[int, ...]:
    """Sizes or strides at the example's values."""
    return tuple(int(v.node.hint) if isinstance(v, torch.SymInt) else int(v) for v in values)


def inverse(perm: list[int]) -> list[int]:
    """The permutation that undoes ``perm`` (``x.permute(perm).permute(inverse(perm))`` is x)."""
    out = [0] * len(perm)
    for i, p in enumerate(perm):
        out[p] = i
    return out
