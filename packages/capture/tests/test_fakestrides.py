"""Pointwise ops of permuted, sliced and broadcast fakes with symbolic sizes
(ember.capture.fakestrides through fakepointwise): the shortcut's output has the sizes,
strides and dtype of torch's own kernel, eager's at the current sizes, adds no guard, and
leaves to torch what it cannot decide for every value of the symbols."""

from __future__ import annotations

from typing import Any

import pytest
import sympy
import torch
from fakecheck import exprs as _exprs
from fakecheck import fake as _fake
from fakecheck import hints as _hints
from fakecheck import inverse as _inverse
from fakecheck import torch_result as _torch
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from ember.capture.fakememo import TracerFakeMode
from ember.capture.fakepointwise import layout_of, pointwise_result
from ember.capture.fakestrides import elementwise_order

aten = torch.ops.aten


def _views(rng: Any, x: Any, static: list[bool]) -> list[tuple[str, Any]]:
    """Random views as models make them: a slice of a static dimension (``x[..., :half]``),
    then a permutation."""
    steps: list[tuple[str, Any]] = []
    ndim = x.dim()
    if rng.random() < 0.4:
        dims = [d for d in range(ndim) if static[d] and x.shape[d] > 2]
        if dims:
            d = rng.choice(dims)
            start = rng.choice([0, 1])
            steps.append(("slice", (d, start, x.shape[d] // 2)))
    if rng.random() < 0.8:
        perm = list(range(ndim))
        rng.shuffle(perm)
        steps.append(("permute", perm))
    return steps


def _apply(t: Any, steps: list[tuple[str, Any]]) -> Any:
    for kind, arg in steps:
        if kind == "permute":
            t = t.permute(arg)
        else:
            d, start, length = arg
            t = t.narrow(d, start, length)
    return t


CASES: list[tuple[Any, Any]] = [
    (aten.add.Tensor, lambda a, b, c: ((a, b), {})),
    (aten.mul.Tensor, lambda a, b, c: ((b, a), {})),
    (aten.sub.Tensor, lambda a, b, c: ((a, c), {})),
    (aten.div.Tensor, lambda a, b, c: ((a, b), {})),
    (aten.where.self, lambda a, b, c: ((aten.gt.Scalar(b, 0), a, c), {})),
    (aten.where.self, lambda a, b, c: ((aten.gt.Scalar(a, 0), b, a), {})),
    (aten.neg.default, lambda a, b, c: ((a,), {})),
    (aten.mul.Scalar, lambda a, b, c: ((a, 2.0), {})),
    (aten.eq.Tensor, lambda a, b, c: ((a, b), {})),
    (aten.clone.default, lambda a, b, c: ((a,), {})),
    (aten.clone.default, lambda a, b, c: ((a,), {"memory_format": torch.contiguous_format})),
    (aten.maximum.default, lambda a, b, c: ((a, b), {})),
]


@pytest.mark.parametrize("seed", range(6))
def test_permuted_inputs_match_torchs_kernel_and_eager(seed: int, random_cases: Any) -> None:
    taken = 0
    for rng, mode, sizes in random_cases(seed, 50, [2, 3, 4, 6, 8], one=0.15):
        ndim = len(sizes)
        dynamic = [rng.random() < 0.6 and s > 1 for s in sizes]
        if not any(dynamic) and max(sizes) > 1:
            dynamic[sizes.index(max(sizes))] = True
        static = [not d for d in dynamic]
        real = torch.randn(sizes)
        base = _fake(mode, real, dynamic)
        steps = _views(rng, base, static)
        with mode:
            a = _apply(base, steps)
        real_a = _apply(real, steps)
        # b: broadcasts against a (static 1s, dropped leading dims), own layout
        b_sizes = [1 if rng.random() < 0.3 else n for n in a.shape]
        b_sizes = b_sizes[rng.randint(0, ndim - 1) if rng.random() < 0.25 else 0 :]
        b_perm = list(range(len(b_sizes)))
        if rng.random() < 0.5:
            rng.shuffle(b_perm)
        with mode:
            b = torch.empty([b_sizes[p] for p in b_perm]).permute(_inverse(b_perm))
        real_b = torch.randn(_hints([b_sizes[p] for p in b_perm])).permute(_inverse(b_perm))
        real_c = torch.randn(())
        c = mode.from_tensor(real_c)
        if rng.random() < 0.3:
            a, b, real_a, real_b = b, a, real_b, real_a
        func, build = rng.choice(CASES)
        with mode:
            args, kwargs = build(a, b, c)
        with torch.no_grad():
            real_args, _ = build(real_a, real_b, real_c)
        guards = len(mode.shape_env.guards)
        with mode:
            fast = pointwise_result(mode, func, args, kwargs)
        assert len(mode.shape_env.guards) == guards  # the shortcut asks nothing
        try:
            ref = _torch(mode, func, args, kwargs)
        except RuntimeError:
            assert fast is None
            continue
        if fast is None:
            continue
        inputs = [x for x in args if isinstance(x, torch.Tensor) and x.dim()]
        taken += any(layout_of(x) is None for x in inputs)  # the new path, not the contiguous one
        where = (func, sizes, dynamic, steps, b_sizes, b_perm)
        assert _exprs(fast.shape) == _exprs(ref.shape), where
        assert _exprs(fast.stride()) == _exprs(ref.stride()), where
        assert (fast.dtype, fast.device) == (ref.dtype, ref.device)
        eager = func(*real_args, **kwargs)
        assert _hints(fast.shape) == tuple(eager.shape)
        assert _hints(fast.stride()) == eager.stride(), where
    assert taken >= 10


def test_models_layouts_take_the_shortcut() -> None:
    """Llama's rotary ``q * cos`` on a transposed ``q`` and T5's ``where`` on its permuted
    position bias (the layouts the profile found), as torch's kernel makes them."""
    mode = TracerFakeMode(shape_env=ShapeEnv())
    h = _fake(mode, torch.randn(2, 5, 64), [True, True, False])
    with mode:
        batch, seq = h.shape[:2]
        pos = torch.empty(batch, seq, 16)
        bias = torch.empty(seq, seq, 4)
        mask = torch.empty(batch, seq, seq, dtype=torch.bool)
        q = h.view(h.shape[0], h.shape[1], 4, 16).transpose(1, 2)
        cos = pos.unsqueeze(1)
        half = q[..., :8]
        position = bias.permute(2, 0, 1).unsqueeze(0)
        m = mask[:, None]
    cases: list[tuple[Any, tuple[Any, ...]]] = [
        (aten.mul.Tensor, (q, cos)),
        (aten.neg.default, (half,)),
        (aten.where.self, (m, position, mode.from_tensor(torch.tensor(0.0)))),
    ]
    for func, args in cases:
        with mode:
            fast = pointwise_result(mode, func, args, {})
        assert fast is not None, func
        ref = _torch(mode, func, args, {})
        assert _exprs(fast.stride()) == _exprs(ref.stride()), func
        assert _exprs(fast.shape) == _exprs(ref.shape)
    assert not mode.shape_env.guards


def test_orders_it_cannot_prove_go_to_torch() -> None:
    s0, s1 = sympy.symbols("s0 s1", positive=True, integer=True)
    lower = {s0: 2, s1: 2}.get
    assert elementwise_order([s0, s1], [[s1, 4]], lower) is None  # s1 against 4
    assert elementwise_order([s0, s1], [[s0 + 1, 1]], lower) is None  # not a monomial
    assert elementwise_order([s0, 4], [[1, s0]], {s0: 1}.get) is None  # s0 may be 1
    assert elementwise_order([s0, 4], [[4, 1]], lower) == [0, 1]
    assert elementwise_order([s0, 4], [[1, s0]], lower) == [1, 0]
    mode = TracerFakeMode(shape_env=ShapeEnv())
    x = _fake(mode, torch.randn(4, 6), [True, True])
    with mode:
        one = x[:, :1]  # a size 1: its stride is ambiguous
        y = torch.empty(x.shape[1], x.shape[0]).t()
    assert pointwise_result(mode, aten.neg.default, (one,), {}) is None
    z = pointwise_result(mode, aten.add.Tensor, (x, y), {})  # two orders: the first decides
    ref = _torch(mode, aten.add.Tensor, (x, y), {})
    assert z is not None and _exprs(z.stride()) == _exprs(ref.stride())


def _layout(rng: Any, mode: Any, sizes: list[int], dynamic: list[bool], dtype: Any) -> Any:
    """A fake and a real tensor of ``sizes`` (symbolic where ``dynamic``), laid out as a
    random permutation of a contiguous tensor."""
    perm = list(range(len(sizes)))
    rng.shuffle(perm)
    real = torch.randn([sizes[p] for p in perm]).to(dtype)
    fake = _fake(mode, real, [dynamic[p] for p in perm])
    back = _inverse(perm)
    with mode:
        fake = fake.permute(back)
    return fake, real.permute(back)


@pytest.mark.parametrize("seed", range(4))
def test_where_with_a_size_one_matches_torchs_kernel_and_eager(
    seed: int, random_cases: Any
) -> None:
    """``where`` whose output has a static 1 (T5's mask and permuted position bias): torch's
    reference gives the 1 a stride by its own rule; the shortcut reproduces it."""
    taken = 0
    for rng, mode, sizes in random_cases(seed, 40, [2, 3, 4, 6], one=1.0):
        sizes = sizes + [rng.choice([2, 3, 4])] * (len(sizes) < 2)
        dynamic = [s > 1 and rng.random() < 0.7 for s in sizes]
        if not any(dynamic):
            dynamic[sizes.index(max(sizes))] = True
        a, real_a = _layout(rng, mode, sizes, dynamic, torch.float32)
        pred_sizes = [
            1 if s > 1 and rng.random() < 0.3 else n for s, n in zip(sizes, a.shape, strict=True)
        ]
        perm = list(range(len(sizes)))
        rng.shuffle(perm)  # its own layout, over a's symbols
        with mode:
            pred = torch.empty([pred_sizes[p] for p in perm], dtype=torch.bool)
            pred = pred.permute(_inverse(perm))
        real_pred = torch.rand(_hints([pred_sizes[p] for p in perm])) < 0.5
        real_pred = real_pred.permute(_inverse(perm))
        real_c = torch.tensor(0.0)
        c = mode.from_tensor(real_c)
        args, real_args = (pred, a, c), (real_pred, real_a, real_c)
        if rng.random() < 0.3:  # the tensor as the other branch
            args, real_args = (pred, c, a), (real_pred, real_c, real_a)
        guards = len(mode.shape_env.guards)
        with mode:
            fast = pointwise_result(mode, aten.where.self, args, {})
        assert len(mode.shape_env.guards) == guards  # the shortcut asks nothing
        ref = _torch(mode, aten.where.self, args, {})
        if fast is None:
            continue
        taken += 1
        where = (sizes, dynamic, pred_sizes, [t.stride() for t in args])
        assert _exprs(fast.shape) == _exprs(ref.shape), where
        assert _exprs(fast.stride()) == _exprs(ref.stride()), where
        assert (fast.dtype, fast.device) == (ref.dtype, ref.device)
        eager = torch.where(*real_args)
        assert _hints(fast.shape) == tuple(eager.shape)
        # eager's TensorIterator strides a size 1 by its own rule (torch's fake kernel and
        # eager differ there); every other dimension is eager's
        kept = [d for d, n in enumerate(eager.shape) if n != 1]
        strides = _hints(fast.stride())
        assert [strides[d] for d in kept] == [eager.stride()[d] for d in kept], where
    assert taken >= 20


def test_t5s_where_with_a_size_one_takes_the_shortcut() -> None:
    mode = TracerFakeMode(shape_env=ShapeEnv())
    h = _fake(mode, torch.randn(1, 7, 4), [False, True, False])
    with mode:
        seq = h.shape[1]
        mask = torch.empty(1, 1, seq, seq, dtype=torch.bool)
        bias = torch.empty(1, seq, seq, 4).permute(0, 3, 1, 2)  # (1, heads, s, s), heads inner
    args = (mask, bias, mode.from_tensor(torch.tensor(0.0)))
    with mode:
        fast = pointwise_result(mode, aten.where.self, args, {})
    assert fast is not None
    ref = _torch(mode, aten.where.self, args, {})
    assert _exprs(fast.stride()) == _exprs(ref.stride()) == _exprs(bias.stride())
    assert not mode.shape_env.guards
