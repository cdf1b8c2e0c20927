"""Guards that must see a change (issue 16): a cached graph may run only where eager would
give the same answer. Each case changes something between calls (a view's offset, a
partial's keywords, a method set on an instance, a patched torch function, a function's
code, a dict, an iterator, a namedtuple subclass's attributes) and compares every call
with eager on every backend. Restoring what was changed must reuse the first graph, not
compile a third. Also: torch ops with named-tuple results, and activation checkpointing.
"""

from __future__ import annotations

import collections
import functools
import typing
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as checkpoint_module

import ember.compiler
from ember.compiler.testing import assert_same, check_like_eager, outcome

BACKENDS = ["eager", "aot_eager", "inductor"]

Step = tuple[Callable[[], Any], Callable[[], tuple[Any, ...]]]


def nothing() -> None:
    """A step that changes nothing."""


def run_steps(fn: Callable[..., Any], backend: str, steps: list[Step], graphs: int | None = None):
    """For each ``(prepare, make_args)``: put the world in a state with ``prepare`` (it is
    called before eager and again before the compiled call, so it sets, never toggles), then
    compare the compiled result with eager's on fresh arguments. ``graphs``: how many graphs
    were compiled in all."""
    compiled = ember.compiler.compile(fn, backend=backend)
    for i, (prepare, make_args) in enumerate(steps):
        prepare()
        want = outcome(fn, *make_args())
        prepare()
        got = outcome(compiled, *make_args())
        assert got[0] == want[0], (i, got, want)
        assert_same(got[1], want[1])
    if graphs is not None:
        assert compiled.stats.graphs == graphs, (compiled.stats.graphs, compiled.stats.failures)
    return compiled


BASE = torch.arange(12.0)


def args(*values: Any) -> Callable[[], tuple[Any, ...]]:
    return lambda: values


# -- storage_offset ----------------------------------------------------------------------------


def offset_branch(x):
    if x.storage_offset() > 0:
        return x + 1
    return x - 1


def offset_number(x):
    return x * x.storage_offset()


def offset_of_inner_view(x):
    y = x[1:]
    return y * torch.Tensor.storage_offset(y)


GLOBAL_VIEW = BASE[0:4]


def offset_of_global(x):
    return x + GLOBAL_VIEW.storage_offset()


def set_global_view(start: int) -> Callable[[], None]:
    def prepare() -> None:
        global GLOBAL_VIEW
        GLOBAL_VIEW = BASE[start : start + 4]

    return prepare


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [offset_branch, offset_number, offset_of_inner_view])
def test_a_view_at_another_offset_recompiles_and_the_first_offset_reuses(backend, fn):
    steps = [(nothing, args(BASE[0:5])), (nothing, args(BASE[3:8])), (nothing, args(BASE[0:5]))]
    run_steps(fn, backend, steps, graphs=2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_global_views_offset_is_guarded(backend):
    steps = [(set_global_view(s), args(torch.ones(4))) for s in (0, 2, 0)]
    run_steps(offset_of_global, backend, steps, graphs=2)


# -- functools.partial keywords ----------------------------------------------------------------


def scaled(x, scale=1.0, shift=0.0):
    return x * scale + shift


PARTIAL = functools.partial(scaled, scale=2.0)


def call_global_partial(x):
    return PARTIAL(x)


def set_keywords(**keywords: float) -> Callable[[], None]:
    def prepare() -> None:
        PARTIAL.keywords.clear()
        PARTIAL.keywords.update(keywords)

    return prepare


@pytest.mark.parametrize("backend", BACKENDS)
def test_global_partial_keywords_mutated_between_calls_and_restored(backend):
    steps = [
        (set_keywords(scale=2.0), args(BASE)),
        (set_keywords(scale=3.0), args(BASE)),
        (set_keywords(scale=3.0, shift=1.0), args(BASE)),
        (set_keywords(scale=2.0), args(BASE)),
    ]
    run_steps(call_global_partial, backend, steps, graphs=3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_partial_argument_and_closure_keywords(backend):
    p = functools.partial(scaled, shift=1.0)

    def closure(x):
        return p(x)

    def change() -> None:
        p.keywords["shift"] = 5.0

    def restore() -> None:
        p.keywords["shift"] = 1.0

    run_steps(
        closure, backend, [(nothing, args(BASE)), (change, args(BASE)), (restore, args(BASE))], 2
    )
    q1, q2 = functools.partial(scaled, scale=4.0), functools.partial(scaled, scale=5.0)
    run_steps(lambda x, q: q(x), backend, [(nothing, args(BASE, q1)), (nothing, args(BASE, q2))])


# -- an instance attribute shadowing a method --------------------------------------------------


class Helped(torch.nn.Module):
    def forward(self, x):
        return self.helper(x) + 1

    def helper(self, x):
        return x * 2


def set_on(obj: Any, name: str, value: Any) -> Callable[[], None]:
    return lambda: setattr(obj, name, value)


def removed(obj: Any, name: str) -> Callable[[], None]:
    return lambda: obj.__dict__.pop(name, None)


HELPED = Helped()


def call_global_module(x):
    return HELPED(x)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["helper", "forward"])
def test_a_method_set_on_the_instance_after_the_first_call_then_removed(backend, name):
    HELPED.__dict__.pop(name, None)
    steps = [
        (removed(HELPED, name), args(BASE)),
        (set_on(HELPED, name, lambda x: x - 7), args(BASE)),
        (removed(HELPED, name), args(BASE)),
    ]
    try:
        run_steps(call_global_module, backend, steps, graphs=2)
    finally:
        HELPED.__dict__.pop(name, None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_method_set_on_the_instance_before_the_first_call(backend):
    m = Helped()
    steps = [
        (set_on(m, "helper", lambda x: x * 10), args(BASE, m)),
        (removed(m, "helper"), args(BASE, m)),
    ]
    run_steps(lambda x, mod: mod(x), backend, steps, graphs=2)


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Helped()

    def forward(self, x):
        return self.inner(x) + self.inner.helper(x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_submodules_method_shadowed_and_a_compiled_module_forward(backend):
    outer = Outer()
    steps = [
        (nothing, args(BASE)),
        (set_on(outer.inner, "helper", lambda x: x + 100), args(BASE)),
        (set_on(outer.inner, "forward", lambda x: x * 0), args(BASE)),
        (lambda: (removed(outer.inner, "helper")(), removed(outer.inner, "forward")()), args(BASE)),
    ]
    run_steps(outer, backend, steps, graphs=3)


class Plain:
    def method(self, x):
        return x + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_plain_objects_method_shadowed_or_replaced_on_its_class(backend):
    obj = Plain()
    original = Plain.method
    steps = [
        (nothing, args(BASE)),
        (set_on(obj, "method", lambda x: x * 3), args(BASE)),
        (removed(obj, "method"), args(BASE)),
        (set_on(Plain, "method", lambda self, x: x - 3), args(BASE)),
        (set_on(Plain, "method", original), args(BASE)),
    ]
    try:
        run_steps(lambda x: obj.method(x), backend, steps, graphs=3)
    finally:
        Plain.method = original  # type: ignore[method-assign]


# -- torch.nn.functional monkeypatched ---------------------------------------------------------


def doubled(x, inplace=False):
    return x * 2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "name, fn",
    [
        ("relu", lambda x: F.relu(x)),
        ("gelu", lambda x: torch.nn.functional.gelu(x)),
        ("relu", torch.nn.ReLU()),  # library code reading F.relu
    ],
)
def test_a_patched_functional_is_seen_and_restoring_it_reuses_the_graph(backend, name, fn):
    original = getattr(F, name)
    steps = [
        (set_on(F, name, original), args(BASE - 6)),
        (set_on(F, name, doubled), args(BASE - 6)),
        (set_on(F, name, original), args(BASE - 6)),
    ]
    try:
        run_steps(fn, backend, steps, graphs=2)
    finally:
        setattr(F, name, original)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_patched_torch_function_and_a_rebound_global(backend):
    original = torch.sigmoid
    steps = [
        (set_on(torch, "sigmoid", original), args(BASE)),
        (set_on(torch, "sigmoid", torch.tanh), args(BASE)),
    ]
    try:
        run_steps(lambda x: torch.sigmoid(x), backend, steps, graphs=2)
    finally:
        torch.sigmoid = original
    steps = [
        (set_activation(torch.relu), args(BASE - 6)),
        (set_activation(torch.abs), args(BASE - 6)),
    ]
    run_steps(call_activation, backend, steps, graphs=2)


ACTIVATION = torch.relu


def call_activation(x):
    return ACTIVATION(x)


def set_activation(fn: Any) -> Callable[[], None]:
    def prepare() -> None:
        global ACTIVATION
        ACTIVATION = fn

    return prepare


# -- __code__ replaced -------------------------------------------------------------------------


def helper_code(x):
    return x + 1


def _other_code(x):
    return x * 5


def _other_method(self, x):
    return x * 5


ORIGINAL_CODE = helper_code.__code__


def call_helper_code(x):
    return helper_code(x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_helpers_code_replaced_and_restored(backend):
    steps = [
        (set_on(helper_code, "__code__", ORIGINAL_CODE), args(BASE)),
        (set_on(helper_code, "__code__", _other_code.__code__), args(BASE)),
        (set_on(helper_code, "__code__", ORIGINAL_CODE), args(BASE)),
    ]
    try:
        run_steps(call_helper_code, backend, steps, graphs=2)
    finally:
        helper_code.__code__ = ORIGINAL_CODE


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_closure_helpers_or_methods_code_replaced(backend):
    def inner(x):
        return x - 1

    code = inner.__code__
    steps = [(nothing, args(BASE)), (set_on(inner, "__code__", _other_code.__code__), args(BASE))]
    run_steps(lambda x: inner(x), backend, steps, graphs=2)
    inner.__code__ = code
    obj = Plain()
    method_code = Plain.method.__code__
    other = _other_method.__code__
    steps = [(nothing, args(BASE)), (set_on(Plain.method, "__code__", other), args(BASE))]
    try:
        run_steps(lambda x: obj.method(x), backend, steps, graphs=2)
    finally:
        Plain.method.__code__ = method_code


# -- dict subclass with its own __getitem__ ----------------------------------------------------


class Doubling(dict):
    def __getitem__(self, key):
        return super().__getitem__(key) * 2


DOUBLING = Doubling(a=3.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dict_subclass_getitem_runs_on_a_fresh_compile(backend):
    run_steps(lambda x: x * DOUBLING["a"], backend, [(nothing, args(BASE))], graphs=1)
    run_steps(lambda x, d: x + d["b"], backend, [(nothing, args(BASE, Doubling(b=4.0)))])

    def made_inside(x):
        d = Doubling(c=5.0)
        return x * d["c"]

    check_like_eager(made_inside, BASE, backend=backend)


# -- dict views after a mutation ---------------------------------------------------------------


def views_live_in_the_trace(x):
    d = {"a": 1, "b": 2}
    keys, values, items = d.keys(), d.values(), d.items()
    d["c"] = 5
    del d["a"]
    return x * len(keys) + sum(values) + len(list(items)), ("c" in keys, list(items))


def view_of_an_argument(x, d):
    values = d.values()
    d["z"] = 3
    return x + sum(values), list(d.keys())


def values_changed_while_iterating(x):
    d = {"a": 1, "b": 2, "c": 3}
    for _, v in d.items():
        x = x + v
        d["c"] = 10  # read by the loop when it gets there, as in CPython
    return x


def size_changed_while_iterating(x):
    d = {"a": 1}
    it = iter(d.items())
    d["b"] = 2
    try:
        for _, v in it:
            x = x + v
    except RuntimeError as e:
        return x - 100, str(e)
    return x, ""


def returned_view(x):
    d = {"a": x}
    view = d.keys()
    d["b"] = x
    return view, d


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "fn", [views_live_in_the_trace, values_changed_while_iterating, size_changed_while_iterating]
)
def test_dict_views_see_later_changes_of_their_dict(backend, fn):
    check_like_eager(fn, BASE, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_view_of_an_argument_dict_and_a_returned_view(backend):
    steps = [(nothing, lambda: (BASE, {"a": 1})), (nothing, lambda: (BASE, {"a": 1, "b": 2}))]
    run_steps(view_of_an_argument, backend, steps)
    compiled = ember.compiler.compile(returned_view, backend=backend)
    view, d = compiled(BASE)
    assert type(view) is type({}.keys()) and list(view) == ["a", "b"]
    d["c"] = 1  # the returned view is the returned dict's
    assert list(view) == ["a", "b", "c"]


GLOBAL_DICT = {"a": 1}
GLOBAL_VALUES = GLOBAL_DICT.values()


def set_global_dict(**items: int) -> Callable[[], None]:
    def prepare() -> None:
        GLOBAL_DICT.clear()
        GLOBAL_DICT.update(items)

    return prepare


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_global_view_of_a_dict_that_changes_between_calls(backend):
    def f(x):
        return x + sum(GLOBAL_VALUES) + len(GLOBAL_VALUES) + len(GLOBAL_DICT.keys())

    steps = [(set_global_dict(a=1), args(BASE)), (set_global_dict(a=1, b=7), args(BASE))]
    run_steps(f, backend, [*steps, (set_global_dict(a=2), args(BASE))])


# -- iterators consumed before the call, or over a list that grows -----------------------------


def add_all(x, it):
    for v in it:
        x = x + v
    return x


def started(it):
    next(it)
    return it


GROWING = [1, 2]


def zip_global(x):
    for a, b in zip(GROWING, GROWING, strict=True):
        x = x + a * b
    return x


def set_growing(*values: int) -> Callable[[], None]:
    return lambda: GROWING.__setitem__(slice(None), list(values))


GLOBAL_ITER: Any = iter(())


def set_global_iter(make: Callable[[], Any]) -> Callable[[], None]:
    def prepare() -> None:
        global GLOBAL_ITER
        GLOBAL_ITER = make()

    return prepare


def sum_global_iter(x):
    return add_all(x, GLOBAL_ITER)


@pytest.mark.parametrize("backend", BACKENDS)
def test_iterators_passed_in_partly_consumed(backend):
    steps = [
        (nothing, lambda: (BASE, map(lambda v: v * 2, [1, 2, 3]))),
        (nothing, lambda: (BASE, started(map(lambda v: v * 2, [1, 2, 3])))),
        (nothing, lambda: (BASE, started(zip([1, 2, 3], [4, 5, 6], strict=True)))),
        (nothing, lambda: (BASE, started(iter(range(5))))),
        (nothing, lambda: (BASE, iter(range(5)))),
    ]
    run_steps(lambda x, it: add_all(x, it) * 1, backend, steps)


@pytest.mark.parametrize("backend", BACKENDS)
def test_iterators_in_a_global_or_closure_and_lists_that_grow(backend):
    steps = [
        (set_global_iter(lambda: iter(range(4))), args(BASE)),
        (set_global_iter(lambda: started(iter(range(4)))), args(BASE)),
        (set_global_iter(lambda: map(abs, GROWING)), args(BASE)),
    ]
    run_steps(sum_global_iter, backend, steps)
    steps = [(set_growing(1, 2), args(BASE)), (set_growing(1, 2, 3), args(BASE))]
    run_steps(zip_global, backend, [*steps, (set_growing(1, 2), args(BASE))], graphs=2)
    source = [1, 2]

    def closure(x):
        return add_all(x, held)

    for extra in ([], [3]):
        source[:] = [1, 2, *extra]
        held = map(lambda v: v + 1, source)  # read by closure
        want = closure(BASE)
        held = map(lambda v: v + 1, source)
        assert_same(ember.compiler.compile(closure, backend=backend)(BASE), want)


# -- namedtuple subclasses with more than fields -----------------------------------------------


class Pair(collections.namedtuple("Pair", "a b")):
    scale = 2

    @property
    def total(self):
        return self.a + self.b

    def scaled(self):
        return self.a * self.scale


class TypedPair(typing.NamedTuple):
    a: float
    b: float

    def diff(self):
        return self.a - self.b


PAIR = Pair(1, 2)
PAIR_WITH_EXTRA = Pair(3, 4)
PAIR_WITH_EXTRA.extra = 5  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_namedtuple_subclass_class_attribute_changed_and_restored(backend):
    def f(x):
        return x * PAIR.scale + PAIR.total + PAIR.scaled()

    def made_inside(x):
        p = Pair(2, 3)
        return x * p.scale + p.scaled()

    steps = [(set_on(Pair, "scale", 2), args(BASE)), (set_on(Pair, "scale", 7), args(BASE))]
    try:
        run_steps(f, backend, [*steps, (set_on(Pair, "scale", 2), args(BASE))], graphs=2)
        run_steps(made_inside, backend, [*steps, (set_on(Pair, "scale", 2), args(BASE))], graphs=2)
    finally:
        Pair.scale = 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_namedtuple_subclass_instance_attribute(backend):
    steps = [
        (set_on(PAIR_WITH_EXTRA, "extra", 5), args(BASE)),
        (set_on(PAIR_WITH_EXTRA, "extra", 6), args(BASE)),
    ]
    try:
        run_steps(lambda x: x * PAIR_WITH_EXTRA.extra + PAIR_WITH_EXTRA.a, backend, steps, graphs=2)
    finally:
        PAIR_WITH_EXTRA.extra = 5  # type: ignore[attr-defined]
    run_steps(lambda x, p: x * p.extra, backend, [(nothing, args(BASE, PAIR_WITH_EXTRA))], graphs=1)
    missing = Pair(1, 1)
    compiled = run_steps(
        lambda x, p: x * getattr(p, "extra", 9), backend, [(nothing, args(BASE, missing))]
    )
    assert compiled.stats.failures == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_namedtuple_subclass_methods_and_properties_as_arguments(backend):
    def f(x, p):
        return x * p.scaled() + p.total, p.diff() if hasattr(p, "diff") else None

    steps = [
        (nothing, args(BASE, Pair(1, 2))),
        (nothing, args(BASE, Pair(3, 2))),
        (nothing, args(BASE, TypedPair(1.0, 4.0))),
    ]
    run_steps(lambda x, p: x * p.diff() if isinstance(p, TypedPair) else f(x, p)[0], backend, steps)


# -- torch ops returning named tuples ----------------------------------------------------------

M = torch.tensor([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0], [1.0, 1.0, 7.0]])

NAMED_RESULTS: list[tuple[str, Callable[[torch.Tensor], Any]]] = [
    ("sort", lambda x: torch.sort(x).values + torch.sort(x, dim=0).indices),
    ("topk", lambda x: torch.topk(x, 2).indices * 1),
    ("max", lambda x: x.max(dim=1).values + x.max(1)[1]),
    ("min", lambda x: torch.min(x, 1).indices * 2),
    ("kthvalue", lambda x: torch.kthvalue(x, 2).values + 1),
    ("mode", lambda x: torch.mode(x).values + 1),
    ("median", lambda x: x.median(dim=1).indices + 1),
    ("aminmax", lambda x: torch.aminmax(x).max - torch.aminmax(x).min),
    ("slogdet", lambda x: torch.linalg.slogdet(x).logabsdet + 1),
    ("eigh", lambda x: torch.linalg.eigh(x @ x.T).eigenvalues.sum() + 1),
    ("qr", lambda x: torch.linalg.qr(x).R.abs() + 1),
    ("frexp", lambda x: torch.frexp(x).exponent * 1),
    ("cummax", lambda x: torch.cummax(x, 0).indices + x.cummin(1).values),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, fn", NAMED_RESULTS, ids=[n for n, _ in NAMED_RESULTS])
def test_fields_of_a_named_tuple_result(backend, name, fn):
    check_like_eager(fn, M, backend=backend)


def unpacked(x):
    values, indices = torch.sort(x)
    r = torch.topk(x, 2)
    return values * 2, indices, r[0], r[-1], len(r), tuple(r)[1] + 1


def returned_whole(x):
    return torch.sort(x * 2), x.max(dim=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_named_tuple_results_unpacked_indexed_and_returned_with_their_type(backend):
    check_like_eager(unpacked, M, backend=backend)
    check_like_eager(returned_whole, M, backend=backend)  # assert_same checks the type
    got = ember.compiler.compile(returned_whole, backend=backend)(M)
    assert type(got[0]) is torch.return_types.sort and got[0].values.shape == M.shape


# -- activation checkpointing ------------------------------------------------------------------


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x, scale=1.0):
        return torch.sin(self.linear(x)) * scale


def grads_like_eager(fn: Callable[..., Any], backend: str, *inputs: torch.Tensor) -> None:
    params = [p for m in (BLOCK,) for p in m.parameters()]
    leaves = [t for t in inputs if t.requires_grad] + params

    def run(f):
        for t in leaves:
            t.grad = None
        out = f(*inputs)
        if out.requires_grad:  # not when reentrant checkpointing had no input needing grad
            out.sum().backward()
        grads = [t.grad.clone() if t.grad is not None else None for t in leaves]
        return out.detach(), grads, out.requires_grad

    want = run(fn)
    compiled = ember.compiler.compile(fn, backend=backend)
    got = run(compiled)
    torch.testing.assert_close(got[0], want[0])
    assert got[2] == want[2]
    for g, w in zip(got[1], want[1], strict=True):
        assert (g is None) == (w is None)
        if w is not None:
            torch.testing.assert_close(g, w)
    assert compiled.stats.failures == [] and compiled.stats.graphs == 1


torch.manual_seed(0)
BLOCK = Block()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_gradients_equal_eager(backend, reentrant):
    def f(x):
        y = checkpoint_module.checkpoint(BLOCK, x, use_reentrant=reentrant)
        return checkpoint_module.checkpoint(lambda a: a.cos() * 2, y, use_reentrant=reentrant)

    grads_like_eager(f, backend, torch.randn(3, 4, requires_grad=True))
    grads_like_eager(f, backend, torch.randn(3, 4))  # only the parameters need grad


@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpoint_keyword_arguments(backend):
    def f(x):
        return checkpoint_module.checkpoint(BLOCK, x, use_reentrant=False, scale=3.0)

    grads_like_eager(f, backend, torch.randn(2, 4, requires_grad=True))

    def bad(x):
        return checkpoint_module.checkpoint(BLOCK, x, use_reentrant=True, scale=3.0)

    want = outcome(bad, torch.randn(2, 4))
    assert want[0] == "raise"
    assert outcome(ember.compiler.compile(bad, backend=backend), torch.randn(2, 4)) == want


@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpoint_with_dropout_recomputes_with_the_forwards_mask(backend):
    """Nodes of the region are recomputed in backward (ember.aotgraph.mincut); a dropout
    inside draws once, in forward, so backward sees the forward's mask, as eager's RNG
    replay gives."""
    lin = torch.nn.Linear(4, 16)

    def f(x):
        def block(t):
            return torch.nn.functional.dropout(lin(t).relu(), 0.5, training=True).sin()

        return checkpoint_module.checkpoint(block, x, use_reentrant=False).square()

    x = torch.randn(6, 4, requires_grad=True)
    compiled = ember.compiler.compile(f, backend=backend)
    results = []
    for fn in (f, compiled):
        torch.manual_seed(3)
        x.grad, lin.weight.grad = None, None
        out = fn(x)
        out.sum().backward()
        results.append((out.detach(), x.grad.clone(), lin.weight.grad.clone()))
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want)
    assert compiled.stats.graphs == 1


class Stack(torch.nn.Module):
    """Containers read whole: iterated, measured, indexed from the end, sliced."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])
        self.heads = torch.nn.ModuleDict({"a": torch.nn.Linear(4, 4)})
        self.tail = torch.nn.Sequential(torch.nn.Linear(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layers[-1](x) * len(self.layers)
        for name in self.heads:
            y = y + self.heads[name](x)
        for layer in self.layers[1:]:
            y = layer(y)
        for layer in self.layers:
            y = layer(y)
        return self.tail(y)


CHANGES: dict[str, Callable[[Stack], None]] = {
    "list_append": lambda m: m.layers.append(torch.nn.Linear(4, 4)),
    "list_insert": lambda m: m.layers.insert(0, torch.nn.Linear(4, 4)),
    "list_delete": lambda m: m.layers.__delitem__(0),
    "dict_add": lambda m: m.heads.update({"b": torch.nn.Linear(4, 4)}),
    "dict_pop": lambda m: (m.heads.update({"b": torch.nn.Linear(4, 4)}), m.heads.pop("a")),
    "sequential_append": lambda m: m.tail.append(torch.nn.ReLU()),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("change", CHANGES)
def test_a_container_module_changed_after_compiling_recompiles(backend, change):
    """``layers.append(...)`` after the first call: the graph that ran over two layers
    would silently skip the third; the children's names are guarded, so it recompiles."""
    torch.manual_seed(0)
    model = Stack()
    compiled = ember.compiler.compile(model, backend=backend)
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        CHANGES[change](model)
        torch.testing.assert_close(compiled(x), model(x))
    assert compiled.stats.graphs == 2, compiled.stats
