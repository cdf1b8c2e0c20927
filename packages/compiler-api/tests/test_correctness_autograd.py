"""Autograd correctness (issue 16): gradients, ``None`` grads, grad mode, and the in-place
rules autograd enforces on views, each against eager on every backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import ember.compiler
from ember.compiler.testing import assert_same, outcome

BACKENDS = ["eager", "aot_eager", "inductor"]


def leaves(seed: int = 0) -> list[torch.Tensor]:
    """a, b: (3, 6), c: (6,), each a leaf that requires grad."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, 6), (3, 6), (6,)]
    return [torch.randn(s, generator=g, requires_grad=True) for s in shapes]


def run(fn: Callable[..., Any], fn_leaves: list[torch.Tensor]) -> dict[str, Any]:
    """Call ``fn`` on non-leaf copies of the leaves (so in-place writes are allowed), then
    differentiate the sum of its float outputs: what happened, for comparison."""
    args = [t * 1 for t in fn_leaves]
    kind, value = outcome(fn, *args)
    seen: dict[str, Any] = {"call": kind}
    if kind == "raise":
        seen["error"] = value[0]
        return seen
    outs = [value] if isinstance(value, torch.Tensor) else list(value)
    seen["values"] = [o.detach().clone() for o in outs]
    seen["flags"] = [(o.requires_grad, o.grad_fn is None) for o in outs]
    seen["args"] = [a.detach().clone() for a in args]
    total = [o.sum() for o in outs if o.requires_grad and o.grad_fn is not None]
    if total:
        kind, _ = outcome(lambda: torch.stack(total).sum().backward())
        seen["backward"] = kind
    seen["grads"] = [None if t.grad is None else t.grad.clone() for t in fn_leaves]
    return seen


def check(fn: Callable[..., Any], backend: str, seed: int = 0) -> ember.compiler.Compiled:
    """``fn`` compiled behaves like eager: outputs, flags, mutations, exceptions, and the
    leaves' gradients (``None`` where eager's are)."""
    want = run(fn, leaves(seed))
    compiled = ember.compiler.compile(fn, backend=backend)
    got = run(compiled, leaves(seed))
    assert got.keys() == want.keys(), (got, want)
    for key in want:
        if key == "grads":
            assert [g is None for g in got[key]] == [g is None for g in want[key]], key
            assert_same(
                [g for g in got[key] if g is not None], [g for g in want[key] if g is not None]
            )
        else:
            assert_same(got[key], want[key])
    return compiled


# --- gradients through inputs written in place (CopySlices in eager) -------------------


def write_element(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    c[..., 0] = 1.5  # the overwritten element gets no gradient
    return [c]


def scale_row(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    a[:1] *= 2
    return a


def square_view(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    v1 = a.unsqueeze(0)
    v1.mul_(v1)  # saves v1, then overwrites it: eager's backward raises
    return v1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [write_element, scale_row, square_view])
def test_gradient_through_a_mutated_input(fn: Callable[..., Any], backend: str) -> None:
    check(fn, backend)


def test_a_saved_then_overwritten_input_raises_in_backward() -> None:
    got = run(ember.compiler.compile(square_view, backend="aot_eager"), leaves())
    assert got["backward"] == "raise"


# --- undefined gradients stay undefined: None, not zeros -------------------------------


def unused_across_a_break(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    v2 = b * 0.5  # an output of graph 1 that nothing differentiated uses
    s3 = float(c.detach().mean())  # graph break
    v7 = v2 + b + s3
    del v7
    return c * 1


def two_outputs(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    return a * 2, b.sin(), (a * b).sum(0) + c


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_leaf_reached_only_through_unused_outputs_has_no_grad(backend: str) -> None:
    compiled = check(unused_across_a_break, backend)
    assert compiled.stats.graphs == 2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("used", [(0,), (1,), (0, 2), (2,)])
def test_partly_used_outputs_give_none_only_where_eager_does(
    backend: str, used: tuple[int, ...]
) -> None:
    compiled = ember.compiler.compile(two_outputs, backend=backend)
    want_leaves, got_leaves = leaves(), leaves()
    want = two_outputs(*want_leaves)
    got = compiled(*got_leaves)
    sum(want[k].sum() for k in used).backward()  # type: ignore[union-attr]
    sum(got[k].sum() for k in used).backward()  # type: ignore[union-attr]
    for w, g in zip(want_leaves, got_leaves, strict=True):
        assert (g.grad is None) == (w.grad is None)
        if w.grad is not None:
            assert_same(g.grad, w.grad)


# --- grad mode inside the compiled function --------------------------------------------


def view_under_no_grad(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    with torch.no_grad():
        v3 = b[:, ::2]
    return [a, v3]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_view_made_under_no_grad_carries_no_gradient(backend: str) -> None:
    check(view_under_no_grad, backend)


def written_after_no_grad_view(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    v2 = a * 0.5
    with torch.no_grad():
        v7 = v2[:, ::2]
    v7.clamp_(-1, 1)  # eager raises: a view made under no_grad, written with grad on
    return [v7]


@pytest.mark.parametrize("backend", BACKENDS)
def test_writing_a_view_made_under_no_grad_raises_as_in_eager(backend: str) -> None:
    """The graph returns the view and the write runs after it (a break): the view came back
    rebuilt with grad on, and the write went through (was: no error; eager raises)."""
    check(written_after_no_grad_view, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_view_made_under_no_grad_in_a_no_grad_call(backend: str) -> None:
    compiled = ember.compiler.compile(lambda x: x[1:], backend=backend)
    x = torch.randn(4, requires_grad=True)
    with torch.no_grad():
        got, want = compiled(x), x[1:]
    assert (got.requires_grad, got.grad_fn) == (want.requires_grad, want.grad_fn)
    assert compiled.stats.failures == []


# --- autograd's in-place rules on views ------------------------------------------------


def write_chunk(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    v1, v2 = c.chunk(2, dim=-1)
    v1.add_(1)
    return v2


def write_split(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    rows = (a * 2).split(1)
    rows[1].mul_(3)
    return rows[0]


def write_unbind(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    first, *_ = b.unbind(0)
    first.zero_()
    return b


def write_expanded(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    v2 = c.expand(2, *c.shape)
    v2.relu_()
    return a


def return_detached(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    v1 = a.detach()
    v2 = torch.sin(a)
    del v2
    return (v1,)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [write_chunk, write_split, write_unbind, write_expanded])
def test_in_place_writes_eager_refuses_raise(fn: Callable[..., Any], backend: str) -> None:
    want = run(fn, leaves())
    assert want["call"] == "raise"
    check(fn, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_returned_detach_does_not_require_grad(backend: str) -> None:
    check(return_detached, backend)
    compiled = ember.compiler.compile(return_detached, backend=backend)
    plain = [t.detach() for t in leaves()]
    assert not compiled(*plain)[0].requires_grad  # the inference path first, then training
    (got,) = compiled(*leaves(1))
    (want,) = return_detached(*leaves(1))
    assert (got.requires_grad, got.grad_fn) == (want.requires_grad, want.grad_fn) == (False, None)


# --- inputs sharing a storage, read only -----------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_input_and_a_view_of_it_each_get_their_own_gradient(backend: str) -> None:
    def fn(b: torch.Tensor, v: torch.Tensor) -> Any:
        unused = [b]  # b is an input of the graph, v a view of it: b gets no gradient here
        del unused
        return torch.where(v > 0, v, v * 2)

    results = []
    for f in (fn, ember.compiler.compile(fn, backend=backend)):
        leaf = leaves()[0]
        b = leaf * 1
        f(b, b[:, 3:]).double().sum().backward()
        results.append(leaf.grad)
    assert_same(results[1], results[0])


# --- gradient-fuzzer gates (issue 16): arguments that are views of one another -----------


def with_row(fn_leaves: list[torch.Tensor]) -> list[torch.Tensor]:
    """The fuzzer's "row" aliasing: ``c`` is a row of ``a``; a and b are non-leaf copies."""
    a, b = fn_leaves[0] * 1, fn_leaves[1] * 1
    return [a, b, a[1]]


def backward_of(fn: Callable[..., Any], args: list[torch.Tensor]) -> tuple[Any, ...]:
    """The call's outcome (the error type where it raises), its outputs, and the outcome of
    differentiating the sum of its outputs that require grad."""
    kind, value = outcome(fn, *args)
    if kind == "raise":
        return (value[0],)
    outs = [value] if isinstance(value, torch.Tensor) else list(value)
    total = [o.sum() for o in outs if o.requires_grad]
    done = outcome(lambda: torch.stack(total).sum().backward()) if total else ("none", None)
    return kind, [o.detach().clone() for o in outs], done[1][0] if done[0] == "raise" else None


def compare_backward(fn: Callable[..., Any], backend: str, args_of: Any = with_row) -> None:
    """Call ``fn`` eagerly and compiled on ``args_of(leaves)``, differentiate the sum of its
    float outputs: the same outputs, exception types (call, backward) and leaf gradients."""
    seen = []
    for f in (fn, ember.compiler.compile(fn, backend=backend)):
        fn_leaves = leaves()
        result = backward_of(f, args_of(fn_leaves))
        grads = [None if t.grad is None else t.grad.clone() for t in fn_leaves]
        seen.append((result, grads))
    (got, grads), (want, want_grads) = seen
    assert (got[0], got[2:]) == (want[0], want[2:])
    if len(want) > 1:
        assert_same(got[1], want[1])
    assert [g is None for g in grads] == [g is None for g in want_grads]
    assert_same([g for g in grads if g is not None], [g for g in want_grads if g is not None])


def view_of_the_wider_input(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    v2 = c * 2  # c (a row of a) is an input of the graph too
    del v2
    return a[:, 1:]  # a view of a, not of c: its gradient reaches all of a


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_returned_view_is_rebuilt_from_the_input_it_views(backend: str) -> None:
    compare_backward(view_of_the_wider_input, backend)


def copy_a_row_into_another_input(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    v3 = a * 1  # a and its row c are both inputs of the graph; b is written
    del v3
    b[0] = c
    return b


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_row_of_an_input_passes_its_gradient_once(backend: str) -> None:
    compare_backward(copy_a_row_into_another_input, backend)


# --- saved values written after the graph: eager checks only the formulas it runs ---------


def unused_then_written(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    v1 = b @ b.t()
    v2 = a.abs()  # live at the break: an output of graph 1, whose node saves a
    s3 = float(v1.detach().mean())  # graph break
    c.sub_(s3)  # writes a row of a: eager never runs abs's formula, so never checks a
    return a, v1, v2.detach()


def used_then_written(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    v1 = b @ b.t()
    v2 = a.abs()  # abs's formula runs in backward: eager raises for the write below
    s3 = float(v1.detach().mean())
    c.sub_(s3)
    return a, v1, v2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [unused_then_written, used_then_written])
def test_a_saved_value_written_after_the_graph(fn: Callable[..., Any], backend: str) -> None:
    compare_backward(fn, backend)


# --- a view from chunk/split made in one graph, written in place after a break -----------


def chunk_of_an_input_across_a_break(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    v1, v2 = a.chunk(2, dim=-1)
    s3 = float(v2.detach().mean())  # graph break: v2 comes back from graph 1
    v2[..., 0] = s3  # eager: "Output 1 of Split is a view ... modified inplace"
    return [b, v1]


def split_of_a_result_across_a_break(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    v1, v2 = (a * 2).split(3, dim=-1)
    s3 = float(v2.detach().mean())
    v1.add_(s3)
    return [v2]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [chunk_of_an_input_across_a_break, split_of_a_result_across_a_break])
def test_a_chunk_written_after_a_break_raises(fn: Callable[..., Any], backend: str) -> None:
    want = run(fn, leaves())
    assert want["call"] == "raise"
    check(fn, backend)


def recomputed_then_written(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    v2 = torch.sigmoid(a)  # eager saves sigmoid's result, never a
    s3 = float(c.detach().mean())  # graph break
    a[:1] *= s3  # the caller's a written after graph 1
    return [v2, a]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_input_eager_never_saves_is_not_saved_to_recompute(backend: str) -> None:
    compare_backward(recomputed_then_written, backend)


# --- an output no gradient reaches: its formula is not run with a zero gradient ----------


def reciprocal_unused(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    v1 = c.reciprocal()  # noqa: F841  (live at the break, reached by no gradient)
    v2 = c * 2
    s3 = float(c.detach().sum())  # graph break
    return [v2 * s3]


def with_a_zero(fn_leaves: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        fn_leaves[2][0] = 0.0
    return [t * 1 for t in fn_leaves]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_unreached_formula_does_not_poison_a_gradient(backend: str) -> None:
    compare_backward(reciprocal_unused, backend, args_of=with_a_zero)


# --- an intermediate restrided in place, then again after a graph break -----------------


def restride_across_a_break(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    v1 = a + a
    v1.t_()  # graph 1 returns t(add): a view of an intermediate, from the autograd.Function
    s2 = float(c.detach().sum())  # graph break
    v1.unsqueeze_(0)  # eager: v1 is no view; ember: "Output 1 of CompiledFunction is a view"
    return [v1 * s2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_intermediate_restrided_again_after_a_break(backend: str) -> None:
    check(restride_across_a_break, backend)
