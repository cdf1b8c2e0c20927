"""Aliasing, in-place changes and version counters, compiled against eager PyTorch.

Every case runs eagerly and compiled on fresh copies of the same inputs and compares what a
user can observe: the outputs (values, or the exception type), which outputs and inputs share
storage or are the same object, each output's ``_base``, every input after the call (values,
size, stride, offset, ``requires_grad``, ``_version``) and, where asked, the gradients.
Cases the backends cannot compile must fall back with a recorded reason, never differ.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree

import ember.compiler
from ember.compiler.testing import assert_same, outcome

BACKENDS = ["eager", "aot_eager", "inductor"]


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _relations(args: list[Any], result: Any) -> tuple[Any, ...]:
    """Which tensors (inputs, then outputs) share storage or are one object, and whose
    ``_base`` each output is: the aliasing a user can observe, as plain data."""
    tensors = _tensors(args) + _tensors(result)
    storage = [t.untyped_storage()._cdata for t in tensors]
    shares = tuple(storage.index(s) for s in storage)
    same = tuple(next(k for k, u in enumerate(tensors) if u is t) for t in tensors)
    bases = tuple(
        -1 if t._base is None else next((k for k, u in enumerate(tensors) if u is t._base), -2)
        for t in _tensors(result)
    )
    return shares, same, bases


def _state(t: torch.Tensor) -> tuple[Any, ...]:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.requires_grad, t._version)


def check(
    fn: Callable[..., Any],
    make: Callable[[], list[Any]],
    backend: str,
    *,
    grads: Callable[[list[Any]], list[torch.Tensor]] | None = None,
    calls: int = 1,
) -> Any:
    """Run ``fn`` eagerly and compiled ``calls`` times on fresh ``make()`` inputs; assert
    that everything observable matches. ``grads(args)`` names the leaves whose ``.grad``
    must match after ``sum(outputs).backward()``. Returns the compiled function."""
    compiled = ember.compiler.compile(fn, backend=backend)
    for _ in range(calls):
        want_args, got_args = make(), make()
        want, got = outcome(fn, *want_args), outcome(compiled, *got_args)
        assert got[0] == want[0], (got, want)
        if want[0] == "raise":
            assert got[1][0] is want[1][0], (got, want)
        else:
            assert_same(got[1], want[1])
            assert _relations(got_args, got[1]) == _relations(want_args, want[1])
        for g, w in zip(_tensors(got_args), _tensors(want_args), strict=True):
            assert _state(g) == _state(w), (_state(g), _state(w))
            torch.testing.assert_close(g.detach(), w.detach(), equal_nan=True)
        if grads is not None and want[0] == "value":
            for result in (want[1], got[1]):
                sum(t.sum() for t in _tensors(result) if t.requires_grad).backward()
            for g, w in zip(grads(got_args), grads(want_args), strict=True):
                torch.testing.assert_close(g.grad, w.grad)
    return compiled


def _no_failures(compiled: Any) -> None:
    assert compiled.stats.failures == [], compiled.stats.failures


# -- aliasing between inputs -------------------------------------------------------------------


def add_to_first_read_second(a, b):
    a.add_(1)
    return b * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_tensor_twice_after_distinct_inputs_recompiles(backend):
    compiled = ember.compiler.compile(add_to_first_read_second, backend=backend)
    a, b = torch.ones(3), torch.ones(3)
    assert_same(compiled(a, b), torch.full((3,), 2.0))
    t, u = torch.ones(3), torch.ones(3)
    assert_same(compiled(t, t), add_to_first_read_second(u, u))
    assert_same(t, u)
    assert t._version == u._version
    assert compiled.stats.graphs == 2
    _no_failures(compiled)


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_tensor_twice(backend):
    def make():
        t = torch.arange(3.0)
        return [t, t]

    _no_failures(check(add_to_first_read_second, make, backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_view_written_base_read(backend):
    def f(base, view):
        view.mul_(2)
        return base + 1

    def make():
        base = torch.arange(6.0).reshape(3, 2)
        return [base, base[0]]

    _no_failures(check(f, make, backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_base_written_view_read(backend):
    def f(base, view):
        base.add_(10)
        return view.sum(), view * 1

    def make():
        base = torch.arange(6.0).reshape(3, 2)
        return [base, base[:, 1]]

    _no_failures(check(f, make, backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_other_offset_of_the_same_base_recompiles(backend):
    def f(base, view):
        view.mul_(2)
        return base.sum()

    compiled = ember.compiler.compile(f, backend=backend)
    for row in (0, 1, 2):
        base, ref = torch.arange(6.0).reshape(3, 2), torch.arange(6.0).reshape(3, 2)
        assert_same(compiled(base, base[row]), f(ref, ref[row]))
        assert_same(base, ref)
    assert compiled.stats.graphs == 3
    _no_failures(compiled)


def _two(make: Callable[[torch.Tensor], list[torch.Tensor]], t: torch.Tensor) -> Any:
    return lambda: make(t.clone())


ALIASED_CASES: dict[str, tuple[Callable[..., Any], Callable[[], list[Any]]]] = {
    "returns-the-written-view": (
        lambda base, view: (view.mul_(2), (view, base.view(-1)))[1],
        _two(lambda t: [t, t[1]], torch.arange(6.0).reshape(3, 2)),
    ),
    "overlapping-slices": (
        lambda a, b: (a.add_(1), b * 1)[1],
        _two(lambda t: [t[:4], t[2:]], torch.arange(6.0)),
    ),
    "transposed": (
        lambda a, b: (b.mul_(10), a.sum(0))[1],
        _two(lambda t: [t, t.t()], torch.arange(4.0).reshape(2, 2)),
    ),
    "expanded-read": (
        lambda a, b: (a.add_(1), b.sum())[1],
        _two(lambda t: [t, t.expand(3, 4)], torch.arange(4.0)),
    ),
    "same-tensor-restrided": (
        lambda a, b: (a.t_(), a + b)[1],
        _two(lambda t: [t, t], torch.arange(4.0).reshape(2, 2)),
    ),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(ALIASED_CASES))
def test_aliased_inputs(backend, name):
    fn, make = ALIASED_CASES[name]
    _no_failures(check(fn, make, backend, calls=2))


FALLBACK_CASES: dict[str, tuple[Callable[..., Any], Callable[[], list[Any]], str]] = {
    "two-dtypes": (
        lambda a, b: (a.add_(1), b * 1)[1],
        _two(lambda t: [t, t.view(torch.int32)], torch.arange(4.0)),
        "different dtypes",
    ),
    "restrided-view-of-a-base": (
        lambda base, view: (view.unsqueeze_(0), view.add_(1), base * 1)[2],
        _two(lambda t: [t, t[1]], torch.arange(6.0).reshape(3, 2)),
        "metadata changed in place",
    ),
}


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", list(FALLBACK_CASES))
def test_aliased_inputs_out_of_reach_fall_back_with_a_reason(backend, name):
    fn, make, reason = FALLBACK_CASES[name]
    compiled = check(fn, make, backend)
    assert compiled.stats.failures and reason in compiled.stats.failures[0].reason


@pytest.mark.parametrize("backend", BACKENDS)
def test_aliased_inputs_read_only_and_distinct_again(backend):
    def f(a, b):
        return a + b

    compiled = ember.compiler.compile(f, backend=backend)
    t = torch.arange(4.0)
    assert_same(compiled(t, t), t + t)
    assert_same(compiled(t, torch.ones(4)), t + 1)
    assert_same(compiled(t, t[:]), t + t)
    _no_failures(compiled)


# -- aliasing between outputs ------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "fn",
    [
        lambda x: (torch.remainder(x, 3), x % 3),
        lambda x: (x // 2, torch.div(x, 2, rounding_mode="floor")),
        lambda x: (x + 1, (x + 1).t()),
        lambda x: (x * 2, x * 2, x.view(-1)),
    ],
    ids=["remainder", "floordiv", "sum-and-transpose", "twice-and-view"],
)
def test_equal_outputs_stay_distinct(backend, fn):
    compiled = check(fn, lambda: [torch.arange(6.0).reshape(2, 3)], backend)
    out = compiled(torch.arange(6.0).reshape(2, 3))
    out[0].add_(100)  # mutating one output leaves the others alone, as in eager
    assert float(out[1].max()) < 100
    _no_failures(compiled)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "fn",
    [
        lambda x: (lambda y: (y, y))(x * 2),
        lambda x: (lambda y: (y, y.view(-1), y[0]))(x * 2),
        lambda x: (x, x.view(-1), x.t()),
        lambda x: (x.view(-1), x * 1),
    ],
    ids=["same-object", "views-of-an-output", "views-of-the-input", "view-and-new"],
)
def test_outputs_alias_as_in_eager(backend, fn):
    compiled = check(fn, lambda: [torch.arange(6.0).reshape(2, 3)], backend, calls=2)
    out = compiled(torch.arange(6.0).reshape(2, 3))
    out[0].add_(100)  # what aliases the first output sees the write; nothing else does
    want = fn(torch.arange(6.0).reshape(2, 3))
    want[0].add_(100)
    assert_same(out, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "fn",
    [
        lambda x: (lambda y: (y, y.view(-1), y[0]))(x * 2),
        lambda x: (lambda y: (y, y))(x * 2),
        lambda x: (torch.remainder(x, 3), x % 3),
        lambda x: (x.view(-1), x * 1),
    ],
    ids=["views-of-an-output", "same-object", "remainder", "view-of-the-input"],
)
def test_outputs_alias_as_in_eager_when_training(backend, fn):
    def make():
        return [torch.arange(6.0).reshape(2, 3).requires_grad_()]

    _no_failures(check(fn, make, backend, grads=lambda args: args, calls=2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_aliased_inputs_written_beside_a_gradient(backend):
    def f(w, base, view):
        view.mul_(2)
        return (w * base).sum()

    def make():
        base = torch.arange(6.0).reshape(3, 2)
        return [torch.ones(3, 2, requires_grad=True), base, base[1]]

    _no_failures(check(f, make, backend, grads=lambda args: args[:1], calls=2))


# -- version counters --------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "fn",
    [
        lambda x: (x.add_(1), x.mul_(2), x.sum())[2],
        lambda x: (x[0].add_(1), x[1].add_(1), x.sum())[2],
        lambda x: (x.add_(1), x.sub_(1), x.add_(3), x * 1)[3],
    ],
    ids=["two-ops", "two-views", "three-ops"],
)
def test_version_counter_moves_as_in_eager(backend, fn):
    _no_failures(check(fn, lambda: [torch.ones(2, 3)], backend, calls=2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_versions_with_a_gradient(backend):
    def f(x, buf):
        buf.add_(1)
        buf.mul_(2)
        return (x * buf).sum()

    def make():
        return [torch.ones(3, requires_grad=True), torch.zeros(3)]

    _no_failures(check(f, make, backend, grads=lambda args: [args[0]]))


# -- in-place metadata changes on inputs -------------------------------------------------------


METADATA_CASES: dict[str, Callable[..., Any]] = {
    "t_": lambda x: (x.t_(), x + 1)[1],
    "t_-then-write": lambda x: (x.t_(), x.add_(1), x * 2)[2],
    "t_-returned": lambda x: x.t_(),
    "unsqueeze_": lambda x: (x.unsqueeze_(0), x.sum(0))[1],
    "squeeze_": lambda x: (x.unsqueeze_(1).squeeze_(1), x * 3)[1],
    "transpose_": lambda x: (x.transpose_(0, 1), x.contiguous())[1],
    "as_strided_": lambda x: (x.as_strided_((2, 2), (1, 2)), x.mul_(3), x + 1)[2],
    "resize_-smaller": lambda x: (x.resize_(4), x + 1)[1],
    "view-of-restrided": lambda x: (x.t_(), x[0])[1],
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(METADATA_CASES))
def test_metadata_change_on_an_input(backend, name):
    fn = METADATA_CASES[name]
    _no_failures(check(fn, lambda: [torch.arange(6.0).reshape(3, 2)], backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_argument_that_resizes(backend):
    def f(x, out):
        torch.add(x, 1, out=out)
        return out * 2, out

    _no_failures(check(f, lambda: [torch.arange(6.0).reshape(3, 2), torch.empty(0)], backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_resize_past_the_storage(backend):
    def f(x):
        x.resize_(10)
        x[6:].fill_(7)
        return x * 2

    _no_failures(check(f, lambda: [torch.arange(6.0).reshape(3, 2)], backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_metadata_change_beside_a_gradient(backend):
    def f(w, x):
        x.t_()
        return (w * x).sum()

    def make():
        return [torch.ones(2, 3, requires_grad=True), torch.arange(6.0).reshape(3, 2)]

    _no_failures(check(f, make, backend, grads=lambda args: [args[0]]))


# -- inputs that require grad ------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_place_on_a_leaf_that_requires_grad_raises_as_eager(backend):
    def f(x):
        x.add_(1)
        return x * 2

    check(f, lambda: [torch.ones(3, requires_grad=True)], backend)


NON_LEAF_CASES: dict[str, Callable[..., Any]] = {
    "write-then-read": lambda x: (x.mul_(3), x * x)[1],
    "read-write-read": lambda x: (lambda y: (x.mul_(3), x * y)[1])(x * 2),
    "returned": lambda x: x.add_(1),
    "through-a-view": lambda x: (x[0].mul_(5), x.sin())[1],
    "twice": lambda x: (x.mul_(2), x.add_(x), x.sum())[2],
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(NON_LEAF_CASES))
def test_in_place_on_a_non_leaf_that_requires_grad(backend, name):
    leaves: list[torch.Tensor] = []

    def make():
        leaves.append(torch.arange(1.0, 4.0, requires_grad=True))
        return [leaves[-1] * 1]

    fn = NON_LEAF_CASES[name]
    compiled = ember.compiler.compile(fn, backend=backend)
    for f in (fn, compiled, compiled):
        (x,) = make()
        out = f(x)
        out.sum().backward(retain_graph=True)
        (out.sum() + x.sum()).backward()  # the input's new history, as in eager
    want, got1, got2 = (t.grad for t in leaves)
    torch.testing.assert_close(got1, want)
    torch.testing.assert_close(got2, want)
    _no_failures(check(fn, make, backend))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "fn",
    [
        lambda x: (x.requires_grad_(), x * 2)[1],
        lambda x: (lambda y: (x.requires_grad_(), (x * y).sum())[1])(x * 2),
    ],
    ids=["then-compute", "after-a-computation"],
)
def test_requires_grad_called_inside(backend, fn):
    def leaves(args):
        return [args[0]]

    _no_failures(check(fn, lambda: [torch.arange(3.0)], backend, grads=leaves, calls=2))
    with torch.no_grad():  # the flag is set all the same; the outputs need no gradient
        _no_failures(check(fn, lambda: [torch.arange(3.0)], backend))


# -- round 2: fuzzer gates alias_row, alias_overlap, inplace_self_overlap, cse_outputs,
# inplace_after_break, metadata_inplace_input --------------------------------------------------

ROW_VIEWS: dict[str, Callable[..., Any]] = {
    "slice": lambda c: c[1:],
    "view": lambda c: c.view(-1),
    "reshape": lambda c: c.reshape(2, 3),
}


def _row() -> list[Any]:
    return [torch.randn(3, 6)[1]]  # storage offset 6


def _fresh() -> list[Any]:
    return [torch.randn(6)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(ROW_VIEWS))
@pytest.mark.parametrize("order", ["row-first", "fresh-first"])
def test_output_view_of_an_input_at_another_storage_offset(backend, name, order):
    """The returned view is rebuilt relative to the current input, not the first one's
    storage offset (was: an internal error, or silently another row's values)."""
    fn = ROW_VIEWS[name]
    compiled = ember.compiler.compile(fn, backend=backend)
    makes = [_row, _fresh, _row] if order == "row-first" else [_fresh, _row, _fresh]
    for make in makes:
        torch.manual_seed(len(makes))
        want_args = make()
        torch.manual_seed(len(makes))
        got_args = make()
        want, got = fn(*want_args), compiled(*got_args)
        assert_same(got, want)
        assert got.storage_offset() == want.storage_offset()
        assert _relations(got_args, got) == _relations(want_args, want)


def _overlap() -> list[Any]:
    base = torch.arange(1.0, 19.0).reshape(3, 6)
    return [base[:-1], base[1:]]


def _transposed() -> list[Any]:
    return [torch.arange(1.0, 17.0).reshape(4, 4).t()]


OVERLAP_CASES: dict[str, tuple[Callable[..., Any], Callable[[], list[Any]]]] = {
    # eager raises: both dense and partly overlapping
    "mul-overlapping-args": (lambda a, b: (a.mul_(b), b + a)[1], _overlap),
    "mul-own-row": (lambda b: b.mul_(b[0]), lambda: [torch.arange(1.0, 16.0).reshape(3, 5)]),
    "shift-copy": (lambda x: x[1:].copy_(x[:-1]), lambda: [torch.arange(6.0)]),
    # eager cannot tell, and later rows read the already updated row 0
    "mul-own-row-transposed": (lambda b: b.mul_(b[0]), _transposed),
    # a write to one argument view seen through the other
    "add-then-read-other": (lambda a, b: (a.add_(1), b * 1)[1], _overlap),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(OVERLAP_CASES))
def test_in_place_source_overlapping_its_destination(backend, name):
    fn, make = OVERLAP_CASES[name]
    check(fn, make, backend, calls=2)


def _two_sins(a):
    return torch.sin(a), torch.sin(a)


def _two_sums(a):
    return a.sum(0), a.sum(0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [_two_sins, _two_sums], ids=["sin", "sum"])
def test_equal_outputs_are_distinct_tensors(backend, fn):
    compiled = check(fn, lambda: [torch.arange(12.0).reshape(3, 4)], backend, calls=2)
    x = torch.randn(3, 4)
    out = compiled(x)
    assert out[0] is not out[1]
    out[0].add_(1)  # distinct memory too: a write to one is not seen in the other
    torch.testing.assert_close(out[1], fn(x)[1])


def write_base_and_view_after_break(a, b, c):
    v1 = b.t()
    if a.sum() > 0:  # a break: b and its view v1 are two inputs of the next graph
        pass
    b[0] = c
    v1.add_(v1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_base_and_view_written_after_a_break(backend, sign):
    def make():
        return [torch.full((4, 3), sign), torch.arange(12.0).reshape(4, 3), torch.arange(3.0)]

    check(write_base_and_view_after_break, make, backend, calls=2)


def transpose_in_place(a):
    a.t_()
    return (a,)


def transpose_in_place_twice(a, b):
    a.t_()
    return a, b


@pytest.mark.parametrize("backend", BACKENDS)
def test_metadata_in_place_on_square_inputs(backend):
    check(transpose_in_place, lambda: [torch.arange(9.0).reshape(3, 3)], backend, calls=2)

    def sliced_twice():
        x = torch.arange(18.0).reshape(3, 6)[:, ::2]
        return [x, x]

    check(transpose_in_place_twice, sliced_twice, backend, calls=2)


# -- views of graph outputs ----------------------------------------------------------------


def view_of_an_intermediate_written_after_a_break(x):
    h = x + x
    flat = h.view(-1)
    print("", end="")  # a graph break: h and flat are outputs of the first graph
    flat.add_(1)
    return h, flat[1:]


def two_views_of_one_output(x):
    h = x * 3
    return h, h.t(), h[0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "fn", [view_of_an_intermediate_written_after_a_break, two_views_of_one_output]
)
def test_an_output_that_views_another_is_an_ordinary_view(backend, fn):
    # Returned from the autograd.Function, a view of another output is one of "several
    # views" to autograd, which refuses an in-place write to it (eager's is allowed).
    def leaves(args):
        return [args[0]]

    check(fn, lambda: [torch.arange(4.0).view(2, 2).requires_grad_()], backend, grads=leaves)
    check(fn, lambda: [torch.arange(4.0).view(2, 2)], backend, calls=2)


def _overlap_leaf() -> list[Any]:
    leaf = torch.arange(1.0, 19.0).reshape(3, 6).requires_grad_()
    base = leaf * 1  # not a leaf: views of it may be written, as in eager
    return [base[:-1], base[1:]]


def _leaf_of(args: list[Any]) -> list[torch.Tensor]:
    """The leaf behind :func:`_overlap_leaf`'s views (``base = leaf * 1``)."""
    return [args[0]._base.grad_fn.next_functions[0][0].variable]


VIEW_OF_WHICH: dict[str, Callable[..., Any]] = {
    # the output lies partly outside the first argument: its gradient was dropped there
    "narrow-of-second": lambda a, b: ((a - 1).mean(), b.narrow(-1, 1, 2))[1],
    "last-row-of-second": lambda a, b: b[-1],
    "reshape-of-second": lambda a, b: b.reshape(-1),
    "one-view-of-each": lambda a, b: (a[0], b[-1]),
    "transposed-second": lambda a, b: b.t(),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(VIEW_OF_WHICH))
def test_output_view_of_the_second_of_overlapping_inputs(backend, name):
    """An output viewing ``b`` where ``a`` shares its storage is rebuilt from ``b``, so its
    gradient reaches the rows only ``b`` covers (was: silently zero there)."""
    compiled = check(VIEW_OF_WHICH[name], _overlap_leaf, backend, grads=_leaf_of, calls=2)
    _no_failures(compiled)


def _returns_one_tensor_twice(a, b):
    v1 = b[0]
    return {"row": v1, "same": v1.double(), "input": a, "again": a}  # .double() of float64: v1


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_tensor_returned_twice_is_one_object(backend):
    """``x.double()`` of a float64 ``x`` is ``x``: eager returns one object twice, where the
    runtime made two views of the input (was: ``out["row"] is out["same"]`` False)."""

    def make() -> list[Any]:
        return [torch.arange(3.0, dtype=torch.float64), torch.ones(4, 3, dtype=torch.float64)]

    compiled = check(_returns_one_tensor_twice, make, backend, calls=2)
    out = compiled(*make())
    assert out["row"] is out["same"] and out["input"] is out["again"]
