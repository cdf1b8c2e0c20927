"""Loop order from memory (looporder.py): kernels on permuted inputs walk memory in sequence.

Properties on random permutations and strides: the order chosen for a dense permuted
layout is its memory order; reordering keeps every element where it was (same set of
(load, store) index pairs); compiled kernels match eager on permuted inputs, static and
symbolic, pointwise and reductions, and their innermost loop is the contiguous one.
"""

from __future__ import annotations

import itertools
import math
import random
import re
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import sympy  # type: ignore[import-untyped]
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph, decompositions, looporder
from ember.inductor.ir import (
    Buffer,
    Expr,
    I,
    Layout,
    Pointwise,
    Program,
    R,
    Reduction,
    load,
)
from ember.inductor.looporder import Order, pick_order, reordered
from ember.inductor.ops import Op, Reduce
from ember.inductor.scheduler import Kernel

T = torch.Tensor


def _permuted(sizes: tuple[int, ...], perm: tuple[int, ...]) -> Layout:
    """A dense layout of ``sizes`` whose dims lie in memory in the order ``perm`` (outermost
    first): ``torch.empty(sizes[perm]).permute(inverse)``'s layout."""
    strides = [0] * len(sizes)
    step = 1
    for d in reversed(perm):
        strides[d] = step
        step *= sizes[d]
    return Layout(sizes, tuple(strides))


def _copy(sizes: tuple[int, ...], src: Layout, dst: Layout) -> tuple[Program, Pointwise]:
    x = Buffer("x", torch.float32, src)
    out = Buffer("buf0", torch.float32, dst)
    node = Pointwise("buf0", sizes, Expr(Op.NEG, torch.float32, (load(x, I[: len(sizes)]),)))
    return Program({"x": x, "buf0": out}, ["x"], [node], []), node


def _points(node: Pointwise, out: Layout) -> set[tuple[Any, Any]]:
    """(load index, store index) at every point of ``node``: the work it does, in no order."""
    (leaf,) = [e for e in _leaves(node.body)]
    got = set()
    for point in itertools.product(*(range(n) for n in node.ranges)):
        sub = dict(zip(I, point, strict=False))
        got.add((int(leaf.arg[1].xreplace(sub)), int(out.index(point))))
    return got


def _leaves(e: Expr) -> list[Expr]:
    return [e] if e.op is Op.LOAD else [x for a in e.args for x in _leaves(a)]


dims = st.lists(st.integers(2, 5), min_size=2, max_size=4).map(tuple)


@settings(max_examples=60, deadline=None)
@given(sizes=dims, data=st.data())
def test_a_dense_permuted_copy_loops_in_memory_order(sizes: tuple[int, ...], data: Any) -> None:
    perm = tuple(data.draw(st.permutations(range(len(sizes)))))
    lay = _permuted(sizes, perm)
    prog, node = _copy(sizes, lay, lay)
    order = pick_order(prog, node)
    assert order.outer == perm
    new, out = reordered(prog, node, order)
    assert list(out.strides) == sorted(out.strides, reverse=True)  # innermost: stride 1
    assert _points(new, out) == _points(node, prog.buffers["buf0"].layout)


@settings(max_examples=60, deadline=None)
@given(sizes=dims, data=st.data())
def test_any_order_keeps_every_element_in_place(sizes: tuple[int, ...], data: Any) -> None:
    n = len(sizes)
    src = _permuted(sizes, tuple(data.draw(st.permutations(range(n)))))
    dst = _permuted(sizes, tuple(data.draw(st.permutations(range(n)))))
    prog, node = _copy(sizes, src, dst)
    order = Order(tuple(data.draw(st.permutations(range(n)))))
    new, out = reordered(prog, node, order)
    assert new.ranges == tuple(sizes[d] for d in order.outer)
    assert _points(new, out) == _points(node, dst)


def test_the_store_breaks_ties_between_strided_loads() -> None:
    # x.t() + y into eager's contiguous output: one load each way, the store decides
    sizes = (6, 5)
    a = Buffer("a", torch.float32, _permuted(sizes, (1, 0)))
    b = Buffer("b", torch.float32, _permuted(sizes, (0, 1)))
    out = Buffer("buf0", torch.float32, Layout.contiguous(sizes))
    body = Expr(Op.ADD, torch.float32, (load(a, I[:2]), load(b, I[:2])))
    node = Pointwise("buf0", sizes, body)
    prog = Program({"a": a, "b": b, "buf0": out}, ["a", "b"], [node], [])
    assert pick_order(prog, node).kept


def test_loops_of_one_point_go_outside_and_unit_orders_are_kept() -> None:
    sizes = (4, 1, 3)
    prog, node = _copy(sizes, _permuted(sizes, (2, 1, 0)), _permuted(sizes, (2, 1, 0)))
    assert pick_order(prog, node).outer == (1, 2, 0)
    prog, node = _copy(sizes, Layout.contiguous(sizes), Layout.contiguous(sizes))
    assert pick_order(prog, node).kept


def test_argmax_keeps_its_reduce_order_and_a_sum_takes_memory_order() -> None:
    x = Buffer("x", torch.float32, _permuted((4, 8), (1, 0)))
    out = Buffer("buf0", torch.int64, Layout.contiguous(()))
    body = load(x, (R[0], R[1]))
    for kind, want in ((Reduce.ARGMAX, (0, 1)), (Reduce.SUM, (1, 0))):
        node = Reduction("buf0", (), (4, 8), kind, body)
        prog = Program({"x": x, "buf0": out}, ["x"], [node], [])
        assert pick_order(prog, node) == Order((), want)


def test_symbolic_strides_order_only_where_the_guards_prove_it() -> None:
    k0, k1 = sympy.symbols("ks0 ks1", integer=True, positive=True)
    sizes = (k0, k1)
    lay = Layout(sizes, (1, k0))  # a transposed [ks0, ks1]
    prog, node = _copy(sizes, lay, lay)
    assert pick_order(prog, node).outer == (1, 0)  # 1 < ks0 for every ks0 >= 2
    unknown = Layout(sizes, (k1, k0))  # which is smaller depends on the sizes
    prog, node = _copy(sizes, unknown, unknown)
    assert pick_order(prog, node).kept


# ---- compiled, against eager --------------------------------------------------------------


def _compile(fn: Callable[..., Any], args: list[T], symbolic: bool) -> Any:
    mode = "symbolic" if symbolic else "real"
    gm = make_fx(fn, tracing_mode=mode, decomposition_table=decompositions())(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile_graph(gm, args, {"graph_cache": False})


def _random_input(rng: random.Random, ndim: int) -> T:
    sizes = [rng.randint(3, 9) for _ in range(ndim)]
    perm = list(range(ndim))
    rng.shuffle(perm)
    base = torch.randn([sizes[p] for p in perm])
    x = base.permute([perm.index(d) for d in range(ndim)])
    if rng.random() < 0.3:  # a window with gaps: every other element of the last dim
        x = torch.randn([sizes[p] for p in perm[:-1]] + [2 * sizes[perm[-1]]])
        x = x[..., ::2].permute([perm.index(d) for d in range(ndim)])
    return x


def _graph(x: T, y: T) -> tuple[T, ...]:
    """Pointwise ops on a permuted input (alone and with a contiguous one) and reductions
    over each dim and all of them, order-sensitive ones included."""
    e = x.exp() * 2 - 1
    outs = [e, x.sigmoid() + y, (x * y).relu(), x.sum(), x.amax(), x.argmax()]
    for d in range(x.dim()):
        outs += [x.sum(d), x.amax(d), x.argmin(d), torch.var_mean(x, d)[0], x.softmax(d)]
    return tuple(outs)


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("seed", range(4))
def test_permuted_inputs_match_eager(seed: int, symbolic: bool) -> None:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    x = _random_input(rng, 2 + seed % 3)
    y = torch.randn(x.shape)
    compiled = _compile(_graph, [x, y], symbolic)
    for got, want in zip(compiled(x, y), _graph(x, y), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert got.stride() == want.stride() or got.dim() == 0


def _innermost_strides(compiled: Any) -> list[sympy.Expr]:
    """The stride along the innermost loop of every access of every pointwise stage."""
    out = []
    for step in compiled.schedule.steps:
        if not isinstance(step, Kernel):
            continue
        for stage in step.stages:
            if stage.is_reduction or not stage.inner:
                continue
            y = sympy.Symbol(f"y{len(stage.inner) - 1}", integer=True, nonnegative=True)
            for s in stage.stores:
                out.append(sympy.diff(s.index, y))
                out += [sympy.diff(e.arg[1], y) for e in _leaves(s.body)]
    return out


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_a_transposed_chain_runs_along_memory(symbolic: bool) -> None:
    x = torch.randn(48, 40).t()

    def f(x: T) -> T:
        return (x.exp() + 1).tanh() * x

    compiled = _compile(f, [x], symbolic)
    torch.testing.assert_close(compiled(x), f(x))
    assert _innermost_strides(compiled) == [1, 1, 1]  # the store and both loads of x
    # x is [40, 48] laid out as 48 rows of 40: the kernel runs over them
    assert re.match(r"kernel0 over \[(48|ks\d+)\]\n  stage \[(40|ks\d+)\]", str(compiled.schedule))


@settings(max_examples=20, deadline=None)
@given(rows=st.sampled_from([32, 48]), cols=st.sampled_from([32, 64]), data=st.data())
def test_a_transposing_copy_is_tiled_and_keeps_every_element(
    rows: int, cols: int, data: Any
) -> None:
    sizes = (rows, cols)
    flip = data.draw(st.booleans())
    src, dst = _permuted(sizes, (1, 0)), _permuted(sizes, (0, 1))
    prog, node = _copy(sizes, *((dst, src) if flip else (src, dst)))
    order = pick_order(prog, node)
    assert order.tile is not None and order.tile[1] == 16
    new, out = reordered(prog, node, order)
    assert new.ranges[-2:] == (16, 16) and math.prod(new.ranges) == rows * cols
    assert _points(new, out) == _points(node, prog.buffers["buf0"].layout)


def test_no_tile_where_sizes_do_not_divide() -> None:
    sizes = (40, 36)
    prog, node = _copy(sizes, _permuted(sizes, (1, 0)), Layout.contiguous(sizes))
    assert pick_order(prog, node).tile is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixed_layouts_are_tiled_and_match_eager(dtype: torch.dtype) -> None:
    x, y = torch.randn(64, 96, dtype=dtype).t(), torch.randn(96, 64, dtype=dtype)

    def f(x: T, y: T) -> tuple[T, T, T]:
        return x + y, x.contiguous() * 2, torch.cat([x, y], 1)  # cat: clamped indices

    compiled = _compile(f, [x, y], symbolic=False)
    for got, want in zip(compiled(x, y), f(x, y), strict=True):
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()
    kernels = [s for s in compiled.schedule.steps if isinstance(s, Kernel)]
    assert all(k.stages[0].inner == (16,) and k.outer[-1] == 16 for k in kernels)


def _row_ops(x: T) -> tuple[T, ...]:
    """Reductions over the last dim (across memory for a transposed x), alone and with the
    passes that follow them over the same rows."""
    return (
        x.amax(-1),
        x.argmax(-1),
        x.softmax(-1),
        torch.nn.functional.layer_norm(x, x.shape[-1:]),
        x.sum(-1),
    )


@pytest.mark.parametrize("perm", [(1, 0), (2, 1, 0), (0, 2, 1), (1, 2, 0)])
def test_reductions_across_memory_read_a_copy_and_match_eager(perm: tuple[int, ...]) -> None:
    torch.manual_seed(len(perm))
    sizes = (80, 64, 24)[: len(perm)]
    x = torch.randn([sizes[p] for p in perm]).permute([perm.index(d) for d in range(len(perm))])
    compiled = _compile(_row_ops, [x], symbolic=False)
    for got, want in zip(compiled(x), _row_ops(x), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    across = x.stride(-1) != 1
    copies = [b for b in compiled.schedule.program.buffers if b.endswith("_r")]
    assert len(copies) == int(across)


def test_a_column_sum_beside_other_readers_keeps_the_column_kernel() -> None:
    # a bias gradient (sum over the batch) beside the pointwise backward of the same gradient
    g = torch.randn(256, 64)

    def f(g: T) -> tuple[T, T, T]:
        return g.sum(0), (g * g.sin()).sum(0), g * 2  # two column sums share one kernel

    compiled = _compile(f, [g], symbolic=False)
    for got, want in zip(compiled(g), f(g), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert not [b for b in compiled.schedule.program.buffers if b.endswith("_r")]


def test_a_row_sum_whose_consumer_runs_along_memory_keeps_the_column_kernel() -> None:
    # RMS norm of a transposed input: its output keeps x's layout, so the scale runs in
    # memory order and only the sum reads across memory, which the column kernel does
    x = torch.randn(64, 96).t()

    def f(x: T) -> T:
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)

    compiled = _compile(f, [x], symbolic=False)
    torch.testing.assert_close(compiled(x), f(x), rtol=1e-4, atol=1e-4)
    assert not [b for b in compiled.schedule.program.buffers if b.endswith("_r")]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_the_monomial_shortcut_agrees_with_the_proof(data: Any) -> None:
    # strides c * ks0**a * ks1**b: the shortcut's answer, where it gives one, is the proof's
    ks = sympy.symbols("ks0 ks1", integer=True, positive=True)

    def monomial() -> Any:
        c = data.draw(st.integers(1, 64))
        return c * math.prod(s ** data.draw(st.integers(0, 2)) for s in ks)

    p, q = monomial(), monomial()
    fast = looporder._monomial_less(p, q)
    proof = looporder.nonnegative(p, least=2) and looporder.nonnegative(q - p - 1, least=2)
    if fast is not None:
        assert fast == proof, (p, q)
    assert looporder._less(p, q) == proof
