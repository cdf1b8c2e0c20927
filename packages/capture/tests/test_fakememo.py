"""The fake-propagation memo of one translation (ember.capture.fakememo): what it reuses,
what it never reuses, and that a compile with it makes the same graph and guards."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses import FakeTensorMode
from torch._subclasses.fake_tensor import FakeTensor
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


@pytest.mark.parametrize("inference", [False, True])
@pytest.mark.parametrize(
    "method, extra",
    [("sin", ()), ("mul", (2,)), ("exp", ())],  # on x, on x.mT (a permuted result), on x
)
def test_a_remade_result_is_the_tensor_a_run_makes(
    method: str, extra: tuple[Any, ...], inference: bool
) -> None:
    """The memo remakes a repeat's result from the meta kernel (no fake dispatch): the same
    sizes, strides, dtype, device and inference flag as a run makes, a fresh storage, and a
    fake of the mode."""
    mode, (x,) = _mode_and((4, 6))
    memo = FakeMemo()
    state = torch.inference_mode() if inference else torch.no_grad()
    with mode, state:
        t = x.mT if method == "mul" else x
        first = memo.call(mode, "call_method", method, [t, *extra], {})
        second = memo.call(mode, "call_method", method, [t, *extra], {})
        again = getattr(t, method)(*extra)
    assert (memo.misses, memo.hits) == (1, 1)
    for run in (first, again):
        assert _meta(second) == _meta(run)
        assert (second.device, second.is_inference(), second.requires_grad) == (
            run.device,
            run.is_inference(),
            run.requires_grad,
        )
    assert type(second) is FakeTensor and second.fake_mode is mode
    assert second.storage_offset() == 0 and not second._is_view()
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


# -- TracerFakeMode: views bypass torch's fake-tensor cache under symbolic sizes ----------

VIEWS = {
    "view": lambda x: x.view(x.shape[0], -1),
    "transpose": lambda x: x.transpose(0, 1),
    "permute": lambda x: x.permute(2, 0, 1),
    "split": lambda x: x.split(2, dim=-1),
    "slice": lambda x: x[:, 1:],
    "unsqueeze_expand": lambda x: x.unsqueeze(0).expand(3, -1, -1, -1),
    "as_strided": lambda x: x.as_strided((2, 2), (1, 2), 1),
    "reshape_of_transpose": lambda x: x.transpose(0, 1).reshape(-1, 4),  # a copy
    "chain": lambda x: x.transpose(1, 2)[1:].unsqueeze(1).narrow(-1, 0, 2),
}


def _symbolic(mode_type: type) -> tuple[Any, Any]:
    mode = mode_type(shape_env=ShapeEnv(), static_shapes=False)
    dims = StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.DYNAMIC, DimDynamic.STATIC]
    )
    return mode, mode.from_tensor(torch.randn(6, 5, 4), symbolic_context=dims)


def _layout(t: Any) -> Any:
    if isinstance(t, tuple | list):
        return [_layout(i) for i in t]
    sizes = (*t.shape, *t.stride(), t.storage_offset())
    return (tuple(str(n) for n in sizes), t.dtype, t._is_view(), t.is_contiguous())


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_views_skip_the_cache_and_match_torchs_mode(name: str) -> None:
    from ember.capture.fakememo import TracerFakeMode

    fn = VIEWS[name]
    results = []
    for mode_type in (FakeTensorMode, TracerFakeMode):
        mode, x = _symbolic(mode_type)
        with mode:
            out = fn(x)
            again = fn(x)  # torch's mode: a cache hit for each view op
        env = mode.shape_env
        guards = [str(g.expr) for g in env.guards]
        results.append((_layout(out), _layout(again), guards, env.replacements))
        outs = out if isinstance(out, tuple) else (out,)
        if name != "reshape_of_transpose":  # views of x: they share its storage
            assert all(o.untyped_storage()._cdata == x.untyped_storage()._cdata for o in outs)
        assert mode.cache_enabled
    (layout, again, guards, replaced), (my_layout, my_again, my_guards, my_replaced) = results
    assert (layout, again, replaced) == (my_layout, my_again, my_replaced)
    assert my_layout == my_again
    # the shortcuts (fakeview) skip checks whose answer cannot change the view: torch's
    # unsqueeze of an (s0 - 1, ...) tensor guards Ne(s0 - 1, 1), its stride is one formula
    assert set(my_guards) <= set(guards)
    assert my_guards == guards or name == "chain"


def test_only_views_bypass_the_cache_and_only_with_symbolic_sizes() -> None:
    from ember.capture.fakememo import TracerFakeMode

    mode, x = _symbolic(TracerFakeMode)
    cache = mode.shape_env.fake_tensor_cache
    with mode:
        x.transpose(0, 1).unsqueeze(0)
        assert len(cache) == 0
        x.cumsum(0)  # neither a view nor pointwise (those have shortcuts of their own)
        hits = FakeTensorMode.cache_hits
        x.cumsum(0)
    assert FakeTensorMode.cache_hits > hits  # cumsum: cached, then hit
    assert cache and not any(getattr(k.key[0], "is_view", False) for k in cache)
    static = TracerFakeMode()  # no ShapeEnv: torch's behaviour unchanged (global cache)
    with static:
        y = torch.empty(3, 4)
        y.t()  # cached now, or a hit on what an earlier test cached in this process
        before = FakeTensorMode.cache_hits
        y.t()
    assert FakeTensorMode.cache_hits == before + 1


def test_a_view_that_raises_leaves_the_cache_on() -> None:
    from ember.capture.fakememo import TracerFakeMode

    mode, x = _symbolic(TracerFakeMode)
    with mode, pytest.raises(RuntimeError):
        x.view(7, -1, 3)  # 4*s0*s1 elements never split into 7 x ? x 3 with a static 4
    assert mode.cache_enabled


def test_contiguous_of_a_contiguous_symbolic_fake_is_itself() -> None:
    """As eager's ``contiguous()``: the tensor itself, without asking torch (whose answer
    costs ``SymNode`` arithmetic); a transposed one is copied by torch's kernel."""
    from ember.capture.fakememo import FakeMemo, TracerFakeMode

    mode, x = _symbolic(TracerFakeMode)
    memo = FakeMemo()
    with mode:
        same = memo.call(mode, "call_method", "contiguous", (x,), {})
        fmt = {"memory_format": torch.contiguous_format}
        also = memo.call(mode, "call_method", "contiguous", (x,), fmt)
        t = x.transpose(0, 1)
        copied = memo.call(mode, "call_method", "contiguous", (t,), {})
    assert same is x and also is x and copied is not t
    assert copied.is_contiguous() and _layout(copied)[0][:3] == _layout(t)[0][:3]
    assert not mode.shape_env.guards


@pytest.mark.parametrize("seed", range(3))
def test_contiguous_of_a_layout_never_contiguous_is_the_copy(seed: int) -> None:
    """``contiguous()`` of a permuted or sliced symbolic fake that is contiguous for no value
    of its symbols is the ``clone`` eager's makes, decided without ``is_contiguous`` in
    ``SymNode`` arithmetic and without a guard; layouts it cannot decide (a slice of a
    static dimension against a symbol) go to torch."""
    import random

    from ember.capture import fakememo
    from ember.capture.fakememo import FakeMemo, TracerFakeMode

    rng = random.Random(seed)
    taken = 0
    for _ in range(30):
        mode = TracerFakeMode(shape_env=ShapeEnv(), static_shapes=False)
        sizes = [rng.choice([2, 3, 4, 6]) for _ in range(rng.randint(2, 4))]
        kinds = [DimDynamic.DYNAMIC if rng.random() < 0.7 else DimDynamic.STATIC for _ in sizes]
        real = torch.randn(sizes)
        x = mode.from_tensor(real, symbolic_context=StatelessSymbolicContext(dynamic_sizes=kinds))
        perm = list(range(len(sizes)))
        rng.shuffle(perm)
        cut = rng.randrange(len(sizes)) if rng.random() < 0.3 else None
        real_t = real.permute(perm)
        narrow = cut is not None and sizes[perm[cut]] > 2
        if narrow:
            real_t = real_t.narrow(cut, 1, 2)
        with mode:
            t = x.permute(perm)
            if narrow:
                t = t.narrow(cut, 1, 2)
            never = fakememo._never_contiguous(t)
            guards = len(mode.shape_env.guards)
            got = FakeMemo().call(mode, "call_method", "contiguous", (t,), {})
            if never:
                assert len(mode.shape_env.guards) == guards  # asked nothing
            want = t.contiguous()  # torch's composite
        taken += never
        assert _layout(got) == _layout(want)
        assert (got is t) == (want is t)
        eager = real_t.contiguous()
        assert tuple(int(n) for n in got.stride()) == eager.stride()
    assert taken >= 10
