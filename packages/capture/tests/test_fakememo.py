"""The fake-propagation memo of one translation (ember.capture.fakememo): what it reuses,
what it never reuses, and that a compile with it makes the same graph and guards."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from ember.capture.fakememo import FakeMemo


def _mode_and(*shapes: tuple[int, ...], requires_grad: bool = False) -> tuple[Any, list[Any]]:
    """A fake mode with a ShapeEnv, and fakes of ``shapes`` with every size symbolic."""
    mode = FakeTensorMode(shape_env=ShapeEnv(), static_shapes=False)
    fakes = []
    for shape in shapes:
        dims = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * len(shape))
        real = torch.randn(shape, requires_grad=requires_grad)
        fakes.append(mode.from_tensor(real, symbolic_context=dims))
    return mode, fakes


def _meta(t: torch.Tensor) -> tuple[Any, ...]:
    exprs = [getattr(n, "node", n) for n in (*t.shape, *t.stride())]
    return (tuple(str(getattr(e, "expr", e)) for e in exprs), t.dtype, t._is_view())


def test_a_repeat_is_remade_with_the_same_metadata_and_no_sharing():
    mode = FakeTensorMode(shape_env=ShapeEnv(), static_shapes=False)
    x = mode.from_tensor(
        torch.randn(4, 6, 8),
        symbolic_context=StatelessSymbolicContext(
            dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.DYNAMIC, DimDynamic.STATIC]
        ),
    )
    w, b = (mode.from_tensor(torch.randn(s), static_shapes=True) for s in [(5, 8), (5,)])
    memo = FakeMemo()
    with mode, torch.no_grad():
        first = memo.call(mode, "call_function", F.linear, [x, w, b], {})
        second = memo.call(mode, "call_function", F.linear, [x, w, b], {})
    assert (memo.misses, memo.hits) == (1, 1)
    assert _meta(first) == _meta(second)
    # eager's linear of a 3-d input returns a view of its addmm: so does the remade one
    assert second._is_view() and second._base is not None
    assert second.untyped_storage()._cdata != first.untyped_storage()._cdata


def test_the_key_holds_the_tensor_a_method_is_called_on():
    mode, (a, b) = _mode_and((3, 4), (5, 6, 7))
    memo = FakeMemo()
    with mode:
        sa = memo.call(mode, "call_method", "sin", [a], {})
        sb = memo.call(mode, "call_method", "sin", [b], {})
    assert sa.dim() == 2 and sb.dim() == 3 and memo.hits == 0


@pytest.mark.parametrize(
    ("kind", "target", "args"),
    [
        ("call_method", "transpose", lambda x: [x, 0, 1]),  # a view of an input
        ("call_method", "add_", lambda x: [x, 1]),  # in place: the input itself
        ("call_method", "contiguous", lambda x: [x]),  # the input itself
        ("call_function", lambda x: x * 2, lambda x: [x]),  # a user function
    ],
    ids=["view-of-input", "in-place", "same-object", "user-function"],
)
def test_never_remembered(kind, target, args):
    mode, (x,) = _mode_and((3, 4))
    memo = FakeMemo()
    with mode:
        outs = [memo.call(mode, kind, target, args(x), {}) for _ in range(2)]
    assert memo.hits == 0 and memo.entries == {}
    if kind == "call_method" and target != "transpose":
        assert outs[0] is x and outs[1] is x
    if target == "transpose":
        assert outs[1].untyped_storage()._cdata == x.untyped_storage()._cdata


def test_results_requiring_grad_are_not_remembered():
    mode, (x,) = _mode_and((3, 4), requires_grad=True)
    memo = FakeMemo()
    with mode, torch.enable_grad():
        out = [memo.call(mode, "call_function", torch.sin, [x], {}) for _ in range(2)]
    assert memo.hits == 0 and all(o.grad_fn is not None for o in out)


def test_what_the_shape_env_learns_is_part_of_the_key():
    mode, (x,) = _mode_and((6, 4))
    memo = FakeMemo()
    with mode:
        memo.call(mode, "call_function", torch.cos, [x], {})
        assert bool(x.shape[0] > 2)  # a branch on the size: a guard
        memo.call(mode, "call_function", torch.cos, [x], {})
        memo.call(mode, "call_function", torch.cos, [x], {})
    assert (memo.misses, memo.hits) == (2, 1)


def test_a_run_that_adds_guards_is_not_stored():
    mode, (x,) = _mode_and((6, 4))
    memo = FakeMemo()
    with mode:  # view(3, -1) needs s0*s1 divisible by 3: the run records a guard
        memo.call(mode, "call_function", torch.reshape, [x.sin(), (3, -1)], {})
    assert mode.shape_env.guards and memo.entries == {}


def test_static_translations_do_not_use_it():
    mode = FakeTensorMode()
    x = mode.from_tensor(torch.randn(3))
    memo = FakeMemo()
    with mode:
        memo.call(mode, "call_function", torch.sin, [x], {})
        memo.call(mode, "call_function", torch.sin, [x], {})
    assert memo.entries == {} and memo.misses == 0
