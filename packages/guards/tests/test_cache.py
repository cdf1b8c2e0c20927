"""Cache policy: limit, warn once, eager fallback, recompile reasons, reset, backends."""

from __future__ import annotations

import warnings

import pytest
import torch

import ember.guards as eg
from ember.guards import CodeCache, Decision, GuardSet, Local


def step(n, x):  # type: ignore[no-untyped-def]
    return x * n


def guards_for(n: int, *extra: eg.Guard) -> eg.CompiledGuards:
    return GuardSet([eg.equals(Local("n"), n), *extra]).compile(step)


def call(cache: CodeCache[str], n: int, *extra: eg.Guard) -> str:
    """What the capture hook does on one call: hit, or decide and maybe compile."""
    hit = cache.lookup(n, None)
    if hit is not None:
        return hit
    if cache.on_miss(n, None) is Decision.RUN_EAGER:
        return "eager"
    cache.add(guards_for(n, *extra), f"graph n={n}")
    return f"compiled n={n}"


def test_hits_and_misses_newest_first() -> None:
    cache: CodeCache[str] = CodeCache(step.__code__)
    assert cache.name.startswith("step (")
    assert call(cache, 1) == "compiled n=1"
    assert call(cache, 1) == "graph n=1"
    assert call(cache, 2) == "compiled n=2"
    assert [t for _, t in cache.hook_entries] == ["graph n=2", "graph n=1"]
    assert [e.translation for e in cache.entries] == ["graph n=2", "graph n=1"]


def test_recompile_reasons_name_the_failing_guard_of_each_entry() -> None:
    cache: CodeCache[str] = CodeCache("step")
    for n in (1, 2, 3):
        call(cache, n)
    assert [str(r) for r in cache.reasons] == [
        "step: n: expected 1, got 2",
        "step: n: expected 2, got 3; n: expected 1, got 3",
    ]
    assert cache.reasons[1].failures == ("n: expected 2, got 3", "n: expected 1, got 3")
    assert all(reason in eg.recompile_reasons() for reason in cache.reasons)


def test_cache_limit_warns_once_with_the_latest_failures_then_runs_eagerly() -> None:
    cache: CodeCache[str] = CodeCache("step", cache_size_limit=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [call(cache, n) for n in (1, 2, 3, 4, 1, 2)]
    assert results == ["compiled n=1", "compiled n=2", "eager", "eager", "graph n=1", "graph n=2"]
    assert len(caught) == 1 and caught[0].category is eg.CacheLimitWarning
    assert str(caught[0].message) == (
        "step: cache_size_limit (2) reached; running eagerly from now on. "
        "Last miss: n: expected 2, got 3; n: expected 1, got 3"
    )
    assert cache.eager and len(cache.entries) == 2 and len(cache.reasons) == 1


def test_default_limit_is_eight() -> None:
    cache: CodeCache[str] = CodeCache("step")
    assert cache.limit == eg.settings.section.get().cache_size_limit == 8
    with pytest.warns(eg.CacheLimitWarning):
        results = [call(cache, n) for n in range(10)]
    assert results.count("eager") == 2 and len(cache.entries) == 8
    with pytest.raises(ValueError):
        CodeCache("step", cache_size_limit=0)


def test_reset_forgets_everything() -> None:
    cache: CodeCache[str] = CodeCache("step", cache_size_limit=1)
    hook_list = cache.hook_entries
    with pytest.warns(eg.CacheLimitWarning):
        for n in (1, 2):
            call(cache, n)
    assert cache.eager and cache.entries
    eg.reset()
    assert not cache.eager and not cache.entries and not cache.reasons
    assert cache.hook_entries is hook_list and hook_list == []
    assert cache in eg.all_caches() and eg.recompile_reasons() == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert call(cache, 5) == "compiled n=5"


def test_two_backends_keep_two_entries_and_never_share() -> None:
    cache: CodeCache[str] = CodeCache("step")
    served = {}
    for name in ("eager", "inductor", "eager", "inductor"):
        with eg.backend_scope(name):
            hit = cache.lookup(1, None)
            if hit is None:
                assert cache.on_miss(1, None) is Decision.RECOMPILE
                cache.add(guards_for(1, eg.backend()), f"{name} code")
            served.setdefault(name, []).append(cache.lookup(1, None))
    assert served == {"eager": ["eager code"] * 2, "inductor": ["inductor code"] * 2}
    assert len(cache.entries) == 2
    assert [str(r) for r in cache.reasons] == ["step: backend: expected 'eager', got 'inductor'"]
    assert cache.lookup(1, None) is None  # no backend in scope: no entry applies


def test_tensor_recompile_reason() -> None:
    def f(x):  # type: ignore[no-untyped-def]
        return x

    cache: CodeCache[str] = CodeCache(f.__code__)
    for x in (torch.zeros(8), torch.zeros(12)):
        if cache.lookup(x) is None and cache.on_miss(x) is Decision.RECOMPILE:
            cache.add(GuardSet([eg.tensor_match(Local("x"), x)]).compile(f), "graph")
    assert cache.reasons[0].failures == ("x: size[0] expected 8, got 12",)
