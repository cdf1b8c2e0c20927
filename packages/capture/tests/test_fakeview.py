"""The tracer's shortcut for ``view`` of a contiguous fake tensor (ember.capture.fakeview):
the same sizes, strides, offset and storage as torch's own kernel for every view it takes,
the eager strides at the current sizes, and torch's kernel (with its errors) for the rest."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from torch._subclasses import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from ember.capture import fakeview
from ember.capture.fakememo import TracerFakeMode

aten = torch.ops.aten


def _fake(mode: Any, real: torch.Tensor, dynamic: list[bool]) -> Any:
    kinds = [DimDynamic.DYNAMIC if d else DimDynamic.STATIC for d in dynamic]
    return mode.from_tensor(real, symbolic_context=StatelessSymbolicContext(dynamic_sizes=kinds))


def _torch_view(mode: Any, x: Any, shape: list[Any]) -> Any:
    """What torch's fake kernel makes of the view (TracerFakeMode's override bypassed)."""
    with mode:
        return FakeTensorMode.dispatch(mode, aten.view.default, (), (x, shape), {})


def _exprs(values: Any) -> tuple[str, ...]:
    return tuple(str(v.node.expr) if isinstance(v, torch.SymInt) else str(v) for v in values)


def _hints(values: Any) -> tuple[int, ...]:
    return tuple(int(v.node.hint) if isinstance(v, torch.SymInt) else int(v) for v in values)


def _targets(rng: random.Random, x: Any) -> list[Any]:
    """A view's shape for ``x`` built from its sizes: dims merged, a static dim split, 1s
    inserted, one entry written as -1."""
    dims = list(x.shape)
    out: list[Any] = []
    k = 0
    while k < len(dims):
        take = rng.choice([1, 1, 2, 3])
        group = dims[k : k + take]
        k += take
        merged: Any = 1
        for d in group:
            merged = merged * d
        if isinstance(merged, int) and merged % 2 == 0 and merged > 2 and rng.random() < 0.5:
            out += [2, merged // 2]
        else:
            out.append(merged)
        if rng.random() < 0.2:
            out.append(1)
    if rng.random() < 0.5:
        out[rng.randrange(len(out))] = -1
    return out


@pytest.mark.parametrize("seed", range(4))
def test_views_match_torchs_kernel_and_eager(seed: int, random_cases: Any) -> None:
    taken = 0
    for rng, mode, sizes in random_cases(seed, 40, [2, 3, 4, 6, 8], one=0.3):
        real = torch.randn(sizes)
        x = _fake(mode, real, [rng.random() < 0.6 and s > 1 for s in sizes])
        shape = _targets(rng, x)
        with mode:
            fast = fakeview.contiguous_view(x, shape)
        ref = _torch_view(mode, x, shape)
        assert fast is not None, (sizes, shape)  # a contiguous input: always taken here
        taken += 1
        assert _exprs(fast.shape) == _exprs(ref.shape)
        assert _exprs(fast.stride()) == _exprs(ref.stride())
        assert _exprs([fast.storage_offset()]) == _exprs([ref.storage_offset()])
        assert fast.untyped_storage()._cdata == x.untyped_storage()._cdata
        eager = real.view(_hints(ref.shape))  # eager's strides at today's sizes
        assert _hints(fast.shape) == tuple(eager.shape)
        assert _hints(fast.stride()) == eager.stride()
    assert taken == 40


def test_the_mode_uses_it_and_adds_no_guard() -> None:
    mode = TracerFakeMode(shape_env=ShapeEnv())
    x = _fake(mode, torch.randn(4, 6, 8), [True, True, False])
    b, s = x.shape[0], x.shape[1]
    sb, ss = str(b.node.expr), str(s.node.expr)
    with mode:
        y = x.view(b * s, 8)
        z = y.view(-1, s, 2, 4)
    assert _exprs(y.shape) == (f"{sb}*{ss}", "8") and _exprs(y.stride()) == ("8", "1")
    assert _exprs(z.shape) == (sb, ss, "2", "4")
    assert _exprs(z.stride()) == (f"8*{ss}", "8", "4", "1")
    assert y._is_view() and z._is_view()
    assert not mode.shape_env.guards
    # torch's kernel, on the same views of a fresh input: the same tensors
    ref_mode = TracerFakeMode(shape_env=ShapeEnv())
    x2 = _fake(ref_mode, torch.randn(4, 6, 8), [True, True, False])
    y2 = _torch_view(ref_mode, x2, [x2.shape[0] * x2.shape[1], 8])
    z2 = _torch_view(ref_mode, y2, [-1, x2.shape[1], 2, 4])
    assert _hints(z2.stride()) == _hints(z.stride()) and len(_exprs(z2.shape)) == 4


def test_other_inputs_go_to_torchs_kernel() -> None:
    mode = TracerFakeMode(shape_env=ShapeEnv())
    x = _fake(mode, torch.randn(4, 6, 8), [True, True, False])
    with mode:
        t = x.transpose(0, 1)  # not contiguous: torch decides (here: it cannot be viewed)
        assert fakeview.contiguous_view(t, [-1, 8]) is None
        with pytest.raises((RuntimeError, ValueError), match="Cannot view"):
            t.view(-1, 8)
        # a view torch allows on strides that are not contiguous: torch's kernel makes it
        u = t.view(t.shape[0], t.shape[1], 2, 4)
        assert _exprs(u.stride()) == ("8", f"8*{x.shape[1].node.expr}", "4", "1")
        # counts that differ: torch's error, not a wrong tensor
        assert fakeview.contiguous_view(x, [x.shape[0], 5, 8]) is None
        with pytest.raises((RuntimeError, ValueError)):
            x.view(x.shape[0], 5, 8)
        # two -1s and a negative size: torch's error
        assert fakeview.contiguous_view(x, [-1, -1]) is None
        assert fakeview.contiguous_view(x, [-2, 8]) is None


def test_static_and_plain_modes_are_untouched() -> None:
    real = torch.randn(4, 6)
    assert fakeview.contiguous_view(real, [24]) is None  # not a fake tensor
    with FakeTensorMode() as mode:
        x = mode.from_tensor(real)
        assert fakeview.contiguous_view(x, [24]) is None  # no ShapeEnv: static sizes


def _torch_op(mode: Any, func: Any, args: tuple[Any, ...]) -> Any:
    with mode:
        return FakeTensorMode.dispatch(mode, func, (), args, {})


def _shape_view_case(rng: random.Random, x: Any) -> tuple[Any, tuple[Any, ...]]:
    """One of the shortcut's ops on ``x``: unsqueeze, a full slice, an expand, a permute,
    a transpose or ``t``."""
    kind = rng.choice(["unsqueeze", "slice", "expand", "permute", "transpose", "t"])
    ndim = x.dim()
    if kind == "unsqueeze":
        return aten.unsqueeze.default, (x, rng.randint(-ndim - 1, ndim))
    if kind == "slice":
        end = rng.choice([fakeview.INT64_MAX, None])
        return aten.slice.Tensor, (x, rng.randrange(ndim), rng.choice([0, None]), end)
    if kind == "permute":
        order = list(range(ndim))
        rng.shuffle(order)
        return aten.permute.default, (x, [d - ndim if rng.random() < 0.3 else d for d in order])
    if kind == "transpose":
        return aten.transpose.int, (x, rng.randint(-ndim, ndim - 1), rng.randint(-ndim, ndim - 1))
    if kind == "t" and ndim == 2:
        return aten.t.default, (x,)
    lead = [rng.choice([1, 2, 3]) for _ in range(rng.randint(0, 2))]  # a new 1: ATen's stride
    size = [
        rng.choice([s, 5]) if isinstance(s, int) and s == 1 else rng.choice([s, -1])
        for s in x.shape
    ]
    return aten.expand.default, (x, lead + size)


def _eager_differs(func: Any, args: tuple[Any, ...]) -> bool:
    """An expand whose new leading 1 comes before a new size other than 1: torch's symbolic
    kernel and eager give the 1 different strides, so the shortcut leaves it to torch."""
    if func is not aten.expand.default:
        return False
    lead = args[1][: len(args[1]) - args[0].dim()]
    return any(n == 1 and any(m != 1 for m in lead[k + 1 :]) for k, n in enumerate(lead))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("direct", [False, True])
def test_shape_views_match_torchs_kernel(seed: int, direct: bool, random_cases: Any) -> None:
    """Each shortcut against torch's kernel and eager; ``direct`` as the mode's dispatch
    calls it (the meta kernel wrapped, no second fake dispatch)."""
    taken = 0
    for rng, mode, sizes in random_cases(seed, 40, [1, 2, 3, 4, 6]):
        ndim = len(sizes)
        real = torch.randn(sizes)
        if ndim > 1 and rng.random() < 0.4:  # a non-contiguous input: formulas hold too
            real = real.transpose(0, ndim - 1)
        x = _fake(mode, real, [rng.random() < 0.7 and s > 1 for s in real.shape])
        func, args = _shape_view_case(rng, x)
        ref = _torch_op(mode, func, args)
        guards = len(mode.shape_env.guards)
        with mode:
            fast = fakeview.shape_view(func, args, {}, direct=direct)
        assert len(mode.shape_env.guards) == guards
        symbolic = any(isinstance(n, torch.SymInt) for n in (*x.shape, *x.stride()))
        if not symbolic or _eager_differs(func, args):
            assert fast is None
            continue
        assert fast is not None, (func, args)
        taken += 1
        assert _exprs(fast.shape) == _exprs(ref.shape)
        assert _exprs(fast.stride()) == _exprs(ref.stride())
        assert _exprs([fast.storage_offset()]) == _exprs([ref.storage_offset()])
        assert fast.untyped_storage()._cdata == x.untyped_storage()._cdata
        assert type(fast) is type(ref) and fast.fake_mode is mode and fast.device == ref.device
        plain = [_hints(a) if isinstance(a, list) else a for a in args[1:]]
        eager = func(real, *plain)
        assert _hints(fast.shape) == tuple(eager.shape)
        assert _hints(fast.stride()) == eager.stride()
    assert taken >= 15


def test_shape_views_leave_the_rest_to_torch() -> None:
    mode = TracerFakeMode(shape_env=ShapeEnv())
    x = _fake(mode, torch.randn(4, 6), [True, True])
    for func, args in [
        (aten.slice.Tensor, (x, 1, 1, fakeview.INT64_MAX)),  # not the whole dimension
        (aten.slice.Tensor, (x, 0, 0, fakeview.INT64_MAX, 2)),  # a step
        (aten.slice.Tensor, (x, 1, 0, x.shape[1])),  # an end torch compares
        (aten.expand.default, (x, [x.shape[1], x.shape[1]])),  # s0 against s1
        (aten.unsqueeze.default, (x, 3)),  # out of range: torch's error
    ]:
        assert fakeview.shape_view(func, args, {}) is None, (func, args)
    with pytest.raises(IndexError):
        with mode:
            x.unsqueeze(3)
