"""New values of mutated inputs stored straight into the inputs (``ember.aotgraph``'s
``input_updates`` hint): where the kernels write them, what they return, and where they
must not (a later read of the old value, a shifted read, aliasing inputs, other strides)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.aotgraph.hints import mark_input_updates
from ember.inductor import compile_graph
from ember.inductor.compile import input_updates

T = torch.Tensor


def _compiled(
    fn: Callable[..., Any], updates: dict[int, int], *args: T, cache: bool = False
) -> Any:
    gm = make_fx(fn)(*args)
    mark_input_updates(gm, updates)
    return compile_graph(gm, list(args), {"graph_cache": cache})


def _sgd(p: T, g: T) -> tuple[T, T]:
    """A functional update: (loss-like output, new value of ``p``)."""
    return (g * g).sum(), p - 0.1 * g


def test_the_new_value_is_written_into_the_input_and_returned_as_it() -> None:
    p, g = torch.randn(64), torch.randn(64)
    want = _sgd(p, g)
    compiled = _compiled(_sgd, {1: 0}, p.clone(), g)
    mine = p.clone()
    for k in range(3):  # each call writes over the last one's value
        loss, new = compiled(mine, g)
        assert new is mine
        torch.testing.assert_close(loss, want[0])
        torch.testing.assert_close(mine, p - 0.1 * (k + 1) * g)
    assert compiled.schedule.updates  # (checked on the schedule too)


def test_without_the_hint_the_input_is_never_written() -> None:
    p, g = torch.randn(64), torch.randn(64)
    for cache in (False, True):  # nor from a graph cached by a call with the hint
        _compiled(_sgd, {1: 0}, p.clone(), g, cache=cache)
        compiled = _compiled(_sgd, {}, p.clone(), g, cache=cache)
        mine = p.clone()
        _, new = compiled(mine, g)
        assert new is not mine and torch.equal(mine, p)
        torch.testing.assert_close(new, p - 0.1 * g)


def _read_after(p: T, g: T) -> tuple[T, T]:
    new = p - 0.1 * g
    return new, (p.sum(0, keepdim=True) + new).exp()  # the old value read after the update


def _shifted(p: T, g: T) -> tuple[T, T]:
    return p[1:] + p[:-1], torch.cat([p[:1], p[1:] + g[1:]])  # reads p at other points


def _returned(p: T, g: T) -> tuple[T, T]:
    return p, p + g  # output 0 is the old value itself


def _twice(p: T, g: T) -> tuple[T, T]:
    new = p + g
    return new, new  # saved for backward as well, say


def _check_not_in_place(fn: Callable[..., Any], updates: dict[int, int], *args: T) -> None:
    want = fn(*args)
    compiled = _compiled(fn, updates, *(a.clone() for a in args))
    mine = [a.clone() for a in args]
    got = compiled(*mine)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    for a, b in zip(mine, args, strict=True):
        assert torch.equal(a, b)  # the inputs keep their old values
    assert not compiled.schedule.updates


def test_an_input_read_after_its_new_value_is_computed_keeps_its_memory() -> None:
    _check_not_in_place(_read_after, {0: 0}, torch.randn(4, 8), torch.randn(4, 8))


def test_an_input_read_at_other_points_in_the_same_kernel_keeps_its_memory() -> None:
    _check_not_in_place(_shifted, {1: 0}, torch.randn(16), torch.randn(16))


def test_an_input_returned_or_a_value_returned_twice_is_not_written_in_place() -> None:
    _check_not_in_place(_returned, {1: 0}, torch.randn(8), torch.randn(8))
    _check_not_in_place(_twice, {1: 0}, torch.randn(8), torch.randn(8))


def test_inputs_sharing_storage_are_not_written_in_place() -> None:
    base = torch.randn(16)
    assert input_updates(_graph_with_hint(), [base[:8], base[8:]]) == {}
    assert input_updates(_graph_with_hint(), [base[:8].clone(), base[8:]]) == {1: 0}


def _graph_with_hint() -> torch.fx.GraphModule:
    gm = make_fx(_sgd)(torch.randn(8), torch.randn(8))
    mark_input_updates(gm, {1: 0})
    return gm


def test_an_input_of_other_strides_gets_the_value_through_a_copy() -> None:
    p, g = torch.randn(8, 8), torch.randn(8, 8)
    compiled = _compiled(_sgd, {1: 0}, p.clone(), g)
    mine = p.t().contiguous().t()  # same values, transposed strides
    _, new = compiled(mine, g)
    assert new is not mine and torch.equal(mine, p)  # the caller copies it back
    torch.testing.assert_close(new, p - 0.1 * g)


def test_a_malformed_hint_is_ignored() -> None:
    p, g = torch.randn(8), torch.randn(8)
    for bad in ({1: 7}, {9: 0}, {-1: 0}):  # no such input, no such output
        compiled = _compiled(_sgd, bad, p.clone(), g)
        mine = p.clone()
        _, new = compiled(mine, g)
        assert torch.equal(mine, p)
        torch.testing.assert_close(new, p - 0.1 * g)
    gm = make_fx(_sgd)(p, g)
    gm.meta["input_updates"] = {"1": "0"}  # not ints: no hint
    assert input_updates(gm, [p, g]) == {}


def _adam_like(*ts: T) -> tuple[T, ...]:
    """A foreach-style update of three (param, grad, m, v) sets: one op over all sets, then
    the next, as ``torch._foreach_*`` ops lower; outputs: new params, then m, then v."""
    n = len(ts) // 4
    ps, gs, ms, vs = ts[:n], ts[n : 2 * n], ts[2 * n : 3 * n], ts[3 * n :]
    m2 = [m + 0.1 * (g - m) for m, g in zip(ms, gs, strict=True)]
    v2 = [v * 0.99 + 0.01 * g * g for v, g in zip(vs, gs, strict=True)]
    p2 = [p - 0.01 * m / (v.sqrt() + 1e-8) for p, m, v in zip(ps, m2, v2, strict=True)]
    return (*p2, *m2, *v2)


def test_a_foreach_update_computes_each_sets_values_in_one_loop_in_place() -> None:
    shapes = [(16, 8), (8,), (4, 8)]
    ts = [torch.randn(s) for _ in range(4) for s in shapes]
    ts[9:] = [t.abs() for t in ts[9:]]  # second moments are positive
    n = len(shapes)
    updates = {k: k for k in range(n)} | {n + k: 2 * n + k for k in range(2 * n)}
    compiled = _compiled(_adam_like, updates, *(t.clone() for t in ts))
    mine = [t.clone() for t in ts]
    got = compiled(*mine)
    want = _adam_like(*ts)
    for k, i in updates.items():
        assert got[k] is mine[i]
        torch.testing.assert_close(mine[i], want[k])
    sched = compiled.schedule
    stages = [[x.name for x in st.stores] for s in sched.steps for st in s.stages]
    params = [o.name for o in sched.program.outputs[:n]]
    m, v = (sched.program.outputs[n:][k * n : (k + 1) * n] for k in range(2))
    for p, m2, v2 in zip(params, m, v, strict=True):  # a set's new values: one loop
        assert [m2.name, v2.name, p] in stages
