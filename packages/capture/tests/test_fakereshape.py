"""Views, reshapes and indexing of fakes of any layout with symbolic sizes
(ember.capture.fakeview's ``strided_view``, ``reshape``, ``index_view``): ATen's
``computeStride`` and ``applySlicing`` decided for every value of the symbols, checked
against torch's own kernels and against eager on permuted, sliced and broadcast inputs,
with no guard added."""

from __future__ import annotations

import operator
import random
from typing import Any

import pytest
import torch
from fakecheck import exprs, fake, hints, torch_result
from torch._subclasses import FakeTensorMode
from torch.fx.experimental.sym_node import SymNode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from ember.capture import fakeview
from ember.capture.fakememo import FakeMemo, TracerFakeMode

aten = torch.ops.aten


def _layout(rng: random.Random, sizes: list[int]) -> torch.Tensor:
    """A real tensor of ``sizes`` laid out as a permutation, a broadcast or a slice of a
    contiguous one (or contiguous)."""
    kind = rng.choice(["contiguous", "permuted", "permuted", "broadcast", "sliced"])
    if kind == "permuted" and len(sizes) > 1:
        perm = list(range(len(sizes)))
        rng.shuffle(perm)
        base = torch.randn([sizes[p] for p in perm])
        return base.permute([perm.index(d) for d in range(len(sizes))])
    if kind == "broadcast":
        d = rng.randrange(len(sizes))
        return torch.randn([1 if k == d else s for k, s in enumerate(sizes)]).expand(sizes)
    if kind == "sliced":
        return torch.randn([*sizes[:-1], sizes[-1] * 2])[..., : sizes[-1]]
    return torch.randn(sizes)


def _target(rng: random.Random, x: Any) -> list[Any]:
    """A new shape of ``x``'s element count: neighbouring dims merged, 1s inserted, the
    dims reversed sometimes (a shape that no view may reach), one entry -1 sometimes."""
    dims = list(x.shape)
    if rng.random() < 0.2:
        dims.reverse()
    out: list[Any] = []
    k = 0
    while k < len(dims):
        take = rng.choice([1, 1, 2, 3])
        merged: Any = 1
        for d in dims[k : k + take]:
            merged = merged * d
        k += take
        out.append(merged)
        if rng.random() < 0.2:
            out.insert(rng.randrange(len(out) + 1), 1)
    if rng.random() < 0.4:
        out[rng.randrange(len(out))] = -1
    return out


def _shortcut_cases(seed: int, random_cases: Any, shortcut: Any) -> Any:
    """``(mode, real, x, shape, fast)`` per random case: ``fast`` is ``shortcut(x, shape)``
    of a fake of a random layout, decided without a guard (asserted here)."""
    for rng, mode, sizes in random_cases(seed, 50, [2, 3, 4, 6]):
        real = _layout(rng, sizes)
        x = fake(mode, real, [rng.random() < 0.7 for _ in sizes])
        shape = _target(rng, x)
        guards = len(mode.shape_env.guards)
        with mode:
            fast = shortcut(x, shape)
        assert len(mode.shape_env.guards) == guards  # decided without a guard
        yield mode, real, x, shape, fast


@pytest.mark.parametrize("seed", range(4))
def test_views_of_any_layout_match_torchs_kernel(seed: int, random_cases: Any) -> None:
    viewed = refused = 0
    for mode, real, x, shape, fast in _shortcut_cases(seed, random_cases, fakeview.strided_view):
        try:
            ref = torch_result(mode, aten.view.default, (x, shape), {})
        except (RuntimeError, ValueError):
            ref = None  # no view: torch's kernel raises, the shortcut left it to torch
        if fast is None:
            refused += 1
            continue
        assert ref is not None, (exprs(x.shape), exprs(x.stride()), shape)
        viewed += 1
        assert hints(fast.shape) == hints(ref.shape)
        if exprs(fast.shape) == exprs(ref.shape):  # (torch's -1 may read ((s1*(6*s0//s1))//6))
            assert exprs(fast.stride()) == exprs(ref.stride())
        assert hints(fast.stride()) == hints(ref.stride())
        assert fast.untyped_storage()._cdata == x.untyped_storage()._cdata
        eager = real.view(hints(ref.shape))
        assert hints(fast.stride()) == eager.stride()
    assert viewed >= 15 and refused >= 5


@pytest.mark.parametrize("seed", range(4))
def test_reshape_matches_eager(seed: int, random_cases: Any) -> None:
    views = copies = 0
    for _, real, x, shape, fast in _shortcut_cases(seed, random_cases, fakeview.reshape):
        if fast is None:
            continue
        eager = real.reshape([s if s == -1 else hints([s])[0] for s in shape])
        assert hints(fast.shape) == tuple(eager.shape)
        assert hints(fast.stride()) == eager.stride()
        assert fast._is_view() == eager._is_view()
        shares = fast.untyped_storage()._cdata == x.untyped_storage()._cdata
        eager_shares = eager.untyped_storage().data_ptr() == real.untyped_storage().data_ptr()
        assert shares == eager_shares
        views += shares
        copies += not shares
    assert views >= 10 and copies >= 5


def _count_symnode_ops(monkeypatch: Any) -> list[int]:
    """A counter of torch's binary ``SymNode`` operations (sizes arithmetic, comparisons)."""
    count = [0]
    for name in ("add", "mul", "eq", "ne", "lt", "le", "gt", "ge", "int_floordiv", "mod"):
        method = getattr(SymNode, name)

        def counted(self: Any, other: Any, method: Any = method) -> Any:
            count[0] += 1
            return method(self, other)

        monkeypatch.setattr(SymNode, name, counted)
    return count


def test_memo_reshapes_without_torchs_composite_or_a_guard(monkeypatch: Any) -> None:
    # A transposed (s0, s1, 8) merged to (-1, 8): no view, so eager copies; and a reshape
    # to its own shape, a view. ATen's composite reshape computes both in SymNode arithmetic.
    count = _count_symnode_ops(monkeypatch)
    mode = TracerFakeMode(shape_env=ShapeEnv())
    x = fake(mode, torch.randn(4, 6, 8), [True, True, False]).transpose(0, 1)
    with mode:
        ref = x.reshape(-1, 8)  # the composite
        x.reshape(x.shape)
        by_composite, count[0] = count[0], 0
        out = FakeMemo().call(mode, "call_method", "reshape", (x, -1, 8), {})
        same = FakeMemo().call(mode, "call_function", torch.reshape, (x, x.shape), {})
    assert count[0] * 3 < by_composite, (count[0], by_composite)
    assert not mode.shape_env.guards
    assert exprs(out.shape) == exprs(ref.shape) and exprs(out.stride()) == exprs(ref.stride())
    assert not out._is_view() and out.untyped_storage()._cdata != x.untyped_storage()._cdata
    assert same._is_view() and exprs(same.stride()) == exprs(x.stride())  # its own shape


def test_the_mode_views_any_layout_without_torchs_kernel(monkeypatch: Any) -> None:
    count = _count_symnode_ops(monkeypatch)
    results = []
    for kind in (FakeTensorMode, TracerFakeMode):  # torch's kernel, then the shortcut
        mode = kind(shape_env=ShapeEnv())
        t = fake(mode, torch.randn(4, 6, 8), [True, True, False]).transpose(0, 1)
        count[0] = 0
        with mode:
            results.append((t.view(t.shape[0], 1, t.shape[1], 2, 4), count[0]))
        assert not mode.shape_env.guards
    (ref, by_torch), (fast, by_mode) = results
    assert by_mode < 10 and by_mode * 10 < by_torch, (by_mode, by_torch)  # 34 without it
    assert hints(fast.shape) == hints(ref.shape) and hints(fast.stride()) == hints(ref.stride())
    assert fast._is_view()


def test_undecided_layouts_are_left_to_torch() -> None:
    mode = TracerFakeMode(shape_env=ShapeEnv())
    x = fake(mode, torch.randn(4, 6), [True, True])
    with mode:
        assert fakeview.strided_view(x[:, 1:], [-1]) is None  # s1 - 1: not a monomial
        assert fakeview.reshape(x, [x.shape[0] * 2, -1]) is None  # s1 / 2: torch decides


def _index(rng: random.Random, ndim: int) -> tuple[Any, ...]:
    """An index of whole slices, ``None``s and at most one ``...`` for ``ndim`` dims."""
    items: list[Any] = [slice(None)] * rng.randint(0, ndim)
    for _ in range(rng.randint(0, 3)):
        items.insert(rng.randint(0, len(items)), None)
    if rng.random() < 0.4:
        items.insert(rng.randint(0, len(items)), ...)
    return tuple(items) or (None,)


@pytest.mark.parametrize("seed", range(3))
def test_indexing_with_slices_and_nones_matches_torch(seed: int, random_cases: Any) -> None:
    for rng, mode, sizes in random_cases(seed, 40, [1, 2, 3, 4, 6]):
        real = _layout(rng, sizes)
        x = fake(mode, real, [rng.random() < 0.7 and s > 1 for s in sizes])
        index = _index(rng, x.dim())
        guards = len(mode.shape_env.guards)
        with mode:
            fast = fakeview.index_view(x, index)
            ref = x[index]  # torch's indexing (no shortcut outside the memo)
        assert len(mode.shape_env.guards) == guards
        if not any(isinstance(n, torch.SymInt) for n in (*x.shape, *x.stride())):
            assert fast is None
            continue
        assert fast is not None, index
        assert exprs(fast.shape) == exprs(ref.shape) and exprs(fast.stride()) == exprs(ref.stride())
        assert fast._is_view() and fast.untyped_storage()._cdata == x.untyped_storage()._cdata
        assert hints(fast.stride()) == real[index].stride()


def test_the_memo_indexes_without_symnode_arithmetic(monkeypatch: Any) -> None:
    count = _count_symnode_ops(monkeypatch)
    mode = TracerFakeMode(shape_env=ShapeEnv())
    x = fake(mode, torch.randn(4, 6), [True, True])
    index = (slice(None), None, None, slice(None))  # transformers' mask broadcast
    with mode:
        ref = x[index]
        by_torch, count[0] = count[0], 0
        out = FakeMemo().call(mode, "call_function", operator.getitem, (x, index), {})
    assert count[0] * 5 < by_torch, (count[0], by_torch)  # 2 (the strides of Nones) of 15
    assert exprs(out.shape) == exprs(ref.shape) and exprs(out.stride()) == exprs(ref.stride())
    with mode:  # an integer index, a partial slice: torch's indexing
        assert fakeview.index_view(x, (0, None)) is None
        assert fakeview.index_view(x, (slice(1, None),)) is None
        assert fakeview.index_view(x, (slice(None),) * 3) is None  # too many: torch raises
