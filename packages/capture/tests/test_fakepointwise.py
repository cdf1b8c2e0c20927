"""The tracer's shortcut for pointwise ops of contiguous fake tensors with symbolic sizes
(ember.capture.fakepointwise): the same sizes, strides and dtype as torch's own kernel for
every op it takes, eager's strides and dtype at the current sizes, and torch's kernel (with
its errors) for the rest."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fakecheck import exprs as _exprs
from fakecheck import fake as _fake
from fakecheck import hints as _hints
from fakecheck import torch_result as _torch
from torch._subclasses import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from ember.capture.fakememo import TracerFakeMode
from ember.capture.fakepointwise import pointwise_result

aten = torch.ops.aten


def _real(dtype: torch.dtype, sizes: list[int]) -> torch.Tensor:
    if dtype is torch.bool:
        return torch.rand(sizes) > 0.5
    if dtype.is_floating_point:
        return torch.randn(sizes, dtype=dtype)
    return torch.randint(1, 5, sizes, dtype=dtype)


# op, then how to build its arguments from the tensors (a, b of one dtype each, a 0-dim c)
CASES: list[tuple[Any, Any]] = [
    (aten.add.Tensor, lambda a, b, c: ((a, b), {})),
    (aten.add.Tensor, lambda a, b, c: ((a, c), {"alpha": 2})),
    (aten.mul.Tensor, lambda a, b, c: ((a, c), {})),
    (aten.mul.Scalar, lambda a, b, c: ((a, 0.5), {})),
    (aten.sub.Tensor, lambda a, b, c: ((b, a), {})),
    (aten.div.Tensor, lambda a, b, c: ((a, b), {})),
    (aten.div.Tensor_mode, lambda a, b, c: ((a, b), {"rounding_mode": "floor"})),
    (aten.le.Scalar, lambda a, b, c: ((a, 0), {})),
    (aten.eq.Tensor, lambda a, b, c: ((a, b), {})),
    (aten.where.self, lambda a, b, c: ((aten.gt.Scalar(a, 1), a, b), {})),
    (aten.where.self, lambda a, b, c: ((aten.gt.Scalar(a, 1), a, c), {})),
    (aten.relu.default, lambda a, b, c: ((a,), {})),
    (aten.rsqrt.default, lambda a, b, c: ((a,), {})),
    (aten.pow.Tensor_Scalar, lambda a, b, c: ((a, 2), {})),
    (aten.neg.default, lambda a, b, c: ((b,), {})),
    (aten.minimum.default, lambda a, b, c: ((a, b), {})),
    (aten.clone.default, lambda a, b, c: ((a,), {"memory_format": torch.contiguous_format})),
]
DTYPES = [torch.float32, torch.float16, torch.int64, torch.int32]


@pytest.mark.parametrize("seed", range(4))
def test_ops_match_torchs_kernel_and_eager(seed: int, random_cases: Any) -> None:
    taken = 0
    for rng, mode, sizes in random_cases(seed, 40, [2, 3, 4, 6, 8], one=0.3):
        ndim = len(sizes)
        dynamic = [rng.random() < 0.7 and s > 1 for s in sizes]
        if not any(dynamic):
            if max(sizes) == 1:
                continue  # sizes 1 specialise: nothing symbolic
            dynamic[sizes.index(max(sizes))] = True
        real_a = _real(rng.choice(DTYPES), sizes)
        real_b = _real(rng.choice(DTYPES), sizes)
        real_c = _real(rng.choice(DTYPES), [])
        a = _fake(mode, real_a, dynamic)
        # b: a's symbolic sizes, some of them 1 (broadcast) and leading ones dropped
        b_sizes = [1 if rng.random() < 0.25 else n for n in a.shape]
        b_sizes = b_sizes[rng.randint(0, ndim - 1) if rng.random() < 0.25 else 0 :]
        real_b = torch.ones(_hints(b_sizes), dtype=real_b.dtype)
        with mode:
            b = torch.empty(b_sizes, dtype=real_b.dtype)
        if rng.random() < 0.5:  # the broadcast operand first
            a, b, real_a, real_b = b, a, real_b, real_a
        c = mode.from_tensor(real_c)
        func, build = rng.choice(CASES)
        with mode:
            args, kwargs = build(a, b, c)
        try:
            ref = _torch(mode, func, args, kwargs)
        except Exception:
            ref = None  # an op eager rejects (rsqrt of an int tensor on a float16, ...)
        guards = len(mode.shape_env.guards)
        with mode:
            fast = pointwise_result(mode, func, args, kwargs)
        assert len(mode.shape_env.guards) == guards  # the shortcut asks nothing
        tensors = [x for x in args if isinstance(x, torch.Tensor)]
        symbolic = any(isinstance(n, torch.SymInt) for x in tensors for n in x.shape)
        if ref is None or not symbolic:  # nothing symbolic: torch's kernel is quick
            assert fast is None
            continue
        assert fast is not None, (func, sizes, dynamic, kwargs)
        taken += 1
        assert _exprs(fast.shape) == _exprs(ref.shape)
        assert _exprs(fast.stride()) == _exprs(ref.stride())
        assert (fast.dtype, fast.device) == (ref.dtype, ref.device)
        reals = {id(a): real_a, id(b): real_b, id(c): real_c}
        if all(id(x) in reals for x in tensors):  # eager's strides at today's sizes
            eager = func(*[reals.get(id(x), x) for x in args], **kwargs)
            assert _hints(fast.shape) == tuple(eager.shape)
            assert _hints(fast.stride()) == eager.stride() and fast.dtype == eager.dtype
    assert taken >= 20


def test_the_mode_uses_it_and_graph_values_are_torchs() -> None:
    mode = TracerFakeMode(shape_env=ShapeEnv())
    x = _fake(mode, torch.randn(4, 6, 8), [True, True, False])
    with mode:
        y = torch.relu(x)
        z = torch.where(x > 0, x, torch.tensor(0.5))
        w = (x * 2).to(torch.int64) // 3
    for t, dtype in ((y, torch.float32), (z, torch.float32), (w, torch.int64)):
        assert _exprs(t.shape) == _exprs(x.shape) and _exprs(t.stride()) == _exprs(x.stride())
        assert t.dtype == dtype
    assert not mode.shape_env.guards


def test_other_inputs_go_to_torchs_kernel() -> None:
    mode = TracerFakeMode(shape_env=ShapeEnv())
    x = _fake(mode, torch.randn(4, 6, 8), [True, True, False])
    other = _fake(mode, torch.randn(5, 6, 8), [True, True, False])  # s0 against s2
    with mode:
        t = x.transpose(0, 1)
        empty = torch.empty(0, x.shape[1])
    cases: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = [
        (aten.add.Tensor, (x, other), {}),  # sizes that differ as expressions
        (aten.relu.default, (t[:, :1],), {}),  # not contiguous, with a size 1
        (aten.add_.Tensor, (x, x), {}),  # in place
        (aten.add.Tensor, (x, x.shape[0]), {}),  # a SymInt argument
        (aten.clone.default, (x,), {"memory_format": torch.channels_last}),
        (aten.relu.default, (empty,), {}),  # a size 0
        (aten.sum.default, (x,), {}),  # a reduction
        (aten.bernoulli.p, (x, 0.5), {}),  # random
    ]
    for func, args, kwargs in cases:
        assert pointwise_result(mode, func, args, kwargs) is None, func
    with mode:
        flags = x > 0
    with pytest.raises(RuntimeError, match="on a bool tensor is not supported"):
        with mode:  # eager's error, from torch's kernel (the probe raised it first)
            torch.neg(flags)
    static = FakeTensorMode(shape_env=ShapeEnv()).from_tensor(torch.randn(3), static_shapes=True)
    assert pointwise_result(static.fake_mode, aten.relu.default, (static,), {}) is None


prims = torch.ops.prims


@pytest.mark.parametrize("seed", range(2))
def test_reduction_prims_match_torchs_kernel(seed: int, random_cases: Any) -> None:
    """prims' reductions (any input layout) and ``prims.div`` by a number: as torch's."""
    taken = 0
    for rng, mode, sizes in random_cases(seed, 30, [1, 2, 3, 5]):
        ndim = len(sizes)
        real = torch.randn(sizes, dtype=rng.choice([torch.float32, torch.float64]))
        transposed = ndim > 1 and rng.random() < 0.5
        if transposed:
            real = real.transpose(0, ndim - 1)
        x = _fake(mode, real, [s > 1 and rng.random() < 0.7 for s in real.shape])
        dims = sorted(rng.sample(range(ndim), rng.randint(1, ndim)))
        func, args = rng.choice(
            [
                (prims.sum.default, (x, dims)),
                (prims.amax.default, (x, dims)),
                (prims.var.default, (x, dims, 1.0)),
                (prims.div.default, (x, 3.0)),
            ]
        )
        ref = _torch(mode, func, args, {})
        with mode:
            fast = pointwise_result(mode, func, args, {})
        if not any(isinstance(n, torch.SymInt) for n in x.shape) or (
            func is prims.div.default and transposed
        ):
            continue  # nothing symbolic, or not contiguous: torch's kernel (checked above)
        assert fast is not None, (func, args)
        taken += 1
        assert _exprs(fast.shape) == _exprs(ref.shape)
        assert _exprs(fast.stride()) == _exprs(ref.stride())
        assert fast.dtype == ref.dtype
    assert taken >= 10
    mode = TracerFakeMode(shape_env=ShapeEnv())
    x = _fake(mode, torch.randn(4, 6), [True, True])
    for args in [(x, [2]), (x, [0, 0]), (x, [-1])]:  # out of range, repeated, not canonical
        assert pointwise_result(mode, prims.sum.default, args, {}) is None
