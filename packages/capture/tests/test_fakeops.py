"""Fake results of attention, advanced indexing, embedding, arange and dtype casts with
symbolic sizes (ember.capture.fakeops): torch's kernel's sizes, strides and dtypes, eager's
at the current sizes, no guard added, and torch's kernel for what the formulas do not cover."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fakecheck import exprs as _exprs
from fakecheck import fake as _fake
from fakecheck import hints as _hints
from fakecheck import inverse as _inverse
from fakecheck import torch_result as _torch
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from ember.capture.fakememo import TracerFakeMode
from ember.capture.fakeops import SHORTCUTS

aten = torch.ops.aten


def _same(fast: Any, ref: Any, eager: Any) -> None:
    fasts = fast if isinstance(fast, tuple) else (fast,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    eagers = eager if isinstance(eager, tuple) else (eager,)
    assert len(fasts) == len(refs)
    for f, r, e in zip(fasts, refs, eagers, strict=False):
        assert _exprs(f.shape) == _exprs(r.shape)
        assert _exprs(f.stride()) == _exprs(r.stride())
        assert (f.dtype, f.device) == (r.dtype, r.device)
        if e is not None:
            assert _hints(f.shape) == tuple(e.shape) and _hints(f.stride()) == e.stride()


def _check(mode: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], eager: Any) -> Any:
    guards = len(mode.shape_env.guards)
    with mode:
        fast = SHORTCUTS[func](mode, args, kwargs)
    assert len(mode.shape_env.guards) == guards  # the shortcut asks nothing
    if fast is not None:
        _same(fast, _torch(mode, func, args, kwargs), eager)
    return fast


@pytest.mark.parametrize("seed", range(3))
def test_attention_matches_torchs_kernel(seed: int, random_cases: Any) -> None:
    taken = 0
    for rng, mode, _ in random_cases(seed, 25, [2]):
        batch, seq, heads, dim = rng.choice([1, 2, 3]), rng.choice([2, 5]), 4, 8
        dtype = rng.choice([torch.float32, torch.bfloat16])
        real = torch.randn(batch, seq, heads * dim, dtype=dtype)
        h = _fake(mode, real, [batch > 1 and rng.random() < 0.7, True, False])
        transposed = rng.random() < 0.7
        with mode:
            q = h.view(h.shape[0], h.shape[1], heads, dim)
            q = q.transpose(1, 2) if transposed else q.permute(0, 2, 1, 3).contiguous()
        real_q = real.view(batch, seq, heads, dim).transpose(1, 2)
        real_q = real_q if transposed else real_q.contiguous()
        kwargs: dict[str, Any] = {"scale": 1.0}
        func = aten._scaled_dot_product_flash_attention_for_cpu.default
        eager = func(real_q, real_q, real_q, **kwargs)
        fast = _check(mode, func, (q, q, q), kwargs, eager)
        taken += fast is not None
        if batch == 1:
            assert fast is None  # a size 1: empty_like's strides are torch's to decide
    assert taken >= 5


@pytest.mark.parametrize("seed", range(3))
def test_index_embedding_arange_and_casts_match_torchs_kernel(seed: int, random_cases: Any) -> None:
    taken = 0
    for rng, mode, sizes in random_cases(seed, 30, [2, 3, 5], one=0.2):
        dynamic = [s > 1 and rng.random() < 0.7 for s in sizes]
        real = torch.randint(0, 2, sizes)
        x = _fake(mode, real, dynamic)
        kind = rng.choice(["index", "embedding", "arange", "cast"])
        if kind == "index":  # mask[b_idx[:, None, None, None], s_idx[None, None, None, :]]
            rows, cols = x.shape[0], x.shape[-1]
            source = torch.randn(2 + _hints([rows])[0], 3 + _hints([cols])[0])
            src = _fake(mode, source, [rng.random() < 0.5, rng.random() < 0.5])
            with mode:
                i = torch.arange(rows).view(-1, 1, 1, 1)
                j = torch.arange(cols).view(1, 1, 1, -1)
            args: tuple[Any, ...] = (src, [i, j])
            real_i = torch.arange(_hints([rows])[0]).view(-1, 1, 1, 1)
            real_j = torch.arange(_hints([cols])[0]).view(1, 1, 1, -1)
            func, kwargs, eager = aten.index.Tensor, {}, source[real_i, real_j]
        elif kind == "embedding":
            weight = torch.randn(4, 6)
            w = _fake(mode, weight, [False, False])
            args, kwargs = (w, x), {}
            func, eager = aten.embedding.default, torch.nn.functional.embedding(real, weight)
        elif kind == "arange":
            n = x.shape[0]
            args = rng.choice([(n,), (0, n), (0, n, 1)])
            kwargs = rng.choice([{}, {"dtype": torch.int32}, {"device": torch.device("cpu")}])
            func = {1: aten.arange.default, 2: aten.arange.start, 3: aten.arange.start_step}[
                len(args)
            ]
            eager = torch.arange(*_hints(args), **kwargs)
        else:
            dtype = rng.choice([torch.float32, torch.bool, torch.int32])
            args, kwargs = (x,), {"dtype": dtype}
            func, eager = aten._to_copy.default, real.to(dtype)
        fast = _check(mode, func, args, kwargs, eager)
        expected = {  # where the formula holds (index: symbolic sizes on either side)
            "embedding": len(sizes) > 1 and any(dynamic),
            "arange": dynamic[0],
            "cast": any(dynamic),
            "index": fast is not None,
        }
        assert (fast is not None) == expected[kind], (kind, sizes, dynamic)
        taken += fast is not None
    assert taken >= 15


def test_the_mode_uses_them_and_the_rest_goes_to_torch() -> None:
    mode = TracerFakeMode(shape_env=ShapeEnv())
    x = _fake(mode, torch.randn(4, 6), [True, True])
    with mode:
        n = torch.arange(x.shape[0])
        cast = x.to(torch.float16)
    assert _exprs(n.shape) == _exprs(x.shape[:1]) and n.dtype == torch.int64
    assert cast.dtype == torch.float16 and _exprs(cast.stride()) == _exprs(x.stride())
    assert not mode.shape_env.guards
    with mode:
        flags = x > 0
        half = x.shape[0] // 2
    cases: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = [
        (aten._to_copy.default, (x.t(),), {"dtype": torch.float16}),  # not contiguous
        (aten._to_copy.default, (x,), {"device": torch.device("meta")}),  # another device
        (aten.index.Tensor, (x, [flags]), {}),  # a boolean mask: data-dependent size
        (aten.arange.default, (half,), {}),  # not a plain size symbol
        (aten.arange.start_step, (1, x.shape[0], 1), {}),  # another start
        (aten.embedding.default, (x, torch.ones(3, dtype=torch.int64)), {}),  # 1-d indices
    ]
    for func, args, kwargs in cases:
        assert SHORTCUTS[func](mode, args, kwargs) is None, (func, args)


@pytest.mark.parametrize("seed", range(2))
def test_mean_and_constructors_match_torchs_kernel(seed: int, random_cases: Any) -> None:
    taken = 0
    for rng, mode, sizes in random_cases(seed, 30, [2, 3, 5], one=0.2):
        dynamic = [s > 1 and rng.random() < 0.7 for s in sizes]
        real = torch.randn(sizes, dtype=rng.choice([torch.float32, torch.float64]))
        x = _fake(mode, real, dynamic)
        ndim = len(sizes)
        if rng.random() < 0.5:
            dims = rng.sample(range(ndim), rng.randint(1, ndim))
            dims = [d - ndim if rng.random() < 0.3 else d for d in dims]
            keepdim = rng.random() < 0.5
            args: tuple[Any, ...] = (x, dims, keepdim)
            func, kwargs, eager = aten.mean.dim, {}, real.mean(dims, keepdim)
        else:
            perm = list(range(ndim))
            rng.shuffle(perm)
            strides = x.permute(perm).contiguous().stride()
            real_strides = real.permute(perm).contiguous().stride()
            device = rng.choice([None, torch.device("cpu")])
            args, kwargs = (list(x.shape), [strides[perm.index(d)] for d in range(ndim)]), {}
            if device is not None:
                kwargs["device"] = device
            func = aten.empty_strided.default
            eager = torch.empty_strided(sizes, [real_strides[perm.index(d)] for d in range(ndim)])
        fast = _check(mode, func, args, kwargs, eager)
        assert (fast is not None) == any(dynamic), (func, sizes, dynamic)
        taken += fast is not None
    assert taken >= 10
    mode = TracerFakeMode(shape_env=ShapeEnv())
    x = _fake(mode, torch.randn(4, 6), [True, True])
    for args in [(x, [2]), (x, [0, 0]), (x.t(), [0]), (x, None)]:  # out of range, twice, ...
        assert SHORTCUTS[aten.mean.dim](mode, args, {}) is None, args


@pytest.mark.parametrize("seed", range(3))
def test_cat_and_likes_match_torchs_kernel(seed: int, random_cases: Any) -> None:
    taken = 0
    for rng, mode, sizes in random_cases(seed, 30, [2, 3, 4, 6], one=0.15):
        ndim = len(sizes)
        dynamic = [s > 1 and rng.random() < 0.6 for s in sizes]
        real = torch.randn(sizes)
        x = _fake(mode, real, dynamic)
        perm = list(range(ndim))
        if rng.random() < 0.6:
            rng.shuffle(perm)
        if rng.random() < 0.6:  # a cat: the other input made from the same symbols
            dim = rng.randrange(ndim) - (ndim if rng.random() < 0.3 else 0)
            width = rng.choice([1, 2, 3])
            other_sizes = [width if d == dim % ndim else n for d, n in enumerate(x.shape)]
            with mode:
                y = torch.empty([other_sizes[p] for p in perm]).permute(_inverse(perm))
                xs = (
                    x.permute(perm).contiguous().permute(_inverse(perm))
                    if rng.random() < 0.5
                    else x
                )
            real_y = torch.randn(_hints([other_sizes[p] for p in perm])).permute(_inverse(perm))
            real_x = (
                real.permute(perm).contiguous().permute(_inverse(perm)) if xs is not x else real
            )
            pair = [(xs, real_x), (y, real_y)]
            if rng.random() < 0.5:
                pair.reverse()
            args: tuple[Any, ...] = ([p[0] for p in pair], dim)
            func, kwargs, eager = aten.cat.default, {}, torch.cat([p[1] for p in pair], dim)
        else:
            func = rng.choice([aten.full_like.default, aten.zeros_like.default])
            args = (x, 7) if func is aten.full_like.default else (x,)
            kwargs = rng.choice([{}, {"dtype": torch.int64}])
            eager = func(real, *args[1:], **kwargs)
        fast = _check(mode, func, args, kwargs, eager)
        taken += fast is not None
    assert taken >= 15


def test_rotary_cat_takes_the_shortcut() -> None:
    """Llama's ``rotate_half``: ``cat((-x2, x1), -1)`` of halves of a transposed ``q``."""
    mode = TracerFakeMode(shape_env=ShapeEnv())
    h = _fake(mode, torch.randn(2, 5, 64), [True, True, False])
    with mode:
        q = h.view(h.shape[0], h.shape[1], 4, 16).transpose(1, 2)
        x1, x2 = q[..., :8], q[..., 8:]
        neg = -x2
    fast = _check(mode, aten.cat.default, ([neg, x1], -1), {}, None)
    assert fast is not None and not mode.shape_env.guards


@pytest.mark.parametrize("seed", range(2))
def test_mm_matches_torchs_kernel(seed: int, random_cases: Any) -> None:
    taken = 0
    for rng, mode, _ in random_cases(seed, 20, [2]):
        n, k, m = rng.choice([1, 3, 4]), rng.choice([2, 5]), rng.choice([3, 6])
        real_a, real_b = torch.randn(n, k), torch.randn(k, m)
        a = _fake(mode, real_a, [rng.random() < 0.6, rng.random() < 0.6])
        with mode:  # b's rows: a's column size, the same expression
            b = torch.empty(m, a.shape[1]).t() if rng.random() < 0.5 else torch.empty(a.shape[1], m)
        fast = _check(mode, aten.mm.default, (a, b), {}, real_a @ real_b)
        assert (fast is not None) == any(isinstance(x, torch.SymInt) for x in a.shape)
        taken += fast is not None
    assert taken >= 5
    mode = TracerFakeMode(shape_env=ShapeEnv())
    a = _fake(mode, torch.randn(4, 6), [True, True])
    other = _fake(mode, torch.randn(5, 3), [True, False])  # s0 against s2: torch compares
    assert SHORTCUTS[aten.mm.default](mode, (a, other), {}) is None
