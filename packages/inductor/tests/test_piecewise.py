"""Pointwise stages cut where a select changes sides (ember.inductor.piecewise): cat and pad
copy each piece of their output once, with eager's values."""

from __future__ import annotations

import functools
import random

import pytest
import sympy
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph
from ember.inductor.ir import Expr, const
from ember.inductor.ops import Op
from ember.inductor.piecewise import MAX_PIECES, pieces
from ember.inductor.scheduler import Extern, Stage, Store, Y


def _compiled(f, *inputs):
    return compile_graph(make_fx(f)(*inputs), list(inputs))


def _kernel(compiled, reads: str) -> str:
    """The C++ of the kernel whose parameters name ``reads``."""
    for chunk in compiled.source.split('extern "C" void ')[1:]:
        if f"* __restrict__ {reads}" in chunk.split("{", 1)[0]:
            return chunk
    raise AssertionError(f"no kernel reads {reads}")


def test_a_three_way_cat_copies_each_input_once():
    """GPT-2's backward cat of the q, k and v gradients: three contiguous copies, no clamped
    index (a gather) and no select left in the kernel."""
    a, b, c = (torch.randn(128, 128) for _ in range(3))

    def f(a, b, c):
        return torch.cat([a * 2, b + 1, c.sin()], dim=-1)

    compiled = _compiled(f, a, b, c)
    torch.testing.assert_close(compiled(a, b, c), f(a, b, c))  # sin: ember's vector math
    text = _kernel(compiled, "a_1")
    assert "std::min" not in text and "std::max" not in text
    assert " ? " not in text
    assert text.count("y0 from") == 3


def test_rotate_half_is_two_copies():
    """Llama's rotary ``cat((-x2, x1), -1)`` on a query slice."""
    x, cos = torch.randn(2, 4, 16, 32), torch.randn(16, 32)

    def f(x, cos):
        x1, x2 = x[..., :16], x[..., 16:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * cos

    compiled = _compiled(f, x, cos)
    torch.testing.assert_close(compiled(x, cos), f(x, cos))
    assert "std::min" not in _kernel(compiled, "x_1")


CATS = [  # (input shapes, dim)
    ([(3, 5), (3, 7)], -1),
    ([(2, 3, 1), (2, 3, 4), (2, 3, 2)], 2),
    ([(4, 2, 3), (4, 5, 3)], 1),  # not the innermost dimension: nothing to cut
    ([(1, 9)] * 7, -1),  # seven pieces
    ([(2, 1)] * 9, -1),  # nine: more than MAX_PIECES, left as one select chain
    ([(6, 0), (6, 3)], -1),  # an empty input
]


@pytest.mark.parametrize(("shapes", "dim"), CATS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_cat_gives_eagers_values(shapes, dim, dtype):
    inputs = [torch.randn(s).mul(10).to(dtype) for s in shapes]

    def f(*xs):
        return torch.cat([x + 1 for x in xs], dim=dim) * 2

    torch.testing.assert_close(_compiled(f, *inputs)(*inputs), f(*inputs), rtol=0, atol=0)


@pytest.mark.parametrize("pad", [(1, 2), (0, 3), (2, 0), (-1, 2), (3, -2), (1, 1, 2, 0)])
def test_pad_gives_eagers_values(pad):
    x = torch.randn(3, 4, 9)

    def f(x):
        return F.pad(x.exp(), pad, value=0.5) - 1

    torch.testing.assert_close(_compiled(f, x)(x), f(x))  # exp: ember's vector math


def test_random_cats_and_pads_of_slices():
    """Slices, negative steps excluded, of a transposed input into cats and pads of random
    widths: every output element against eager's."""
    rng = random.Random(5)
    for _ in range(12):
        rows, width = rng.randint(1, 6), rng.randint(2, 40)
        x = torch.randn(width, rows).t()  # transposed: strided reads in the pieces
        cut = rng.randint(1, width - 1)
        left, right = rng.randint(0, 4), rng.randint(0, 4)

        f = functools.partial(_cat_and_pad, cut=cut, pads=(left, right))
        torch.testing.assert_close(_compiled(f, x)(x), f(x), rtol=1e-6, atol=1e-6)


def _cat_and_pad(x: torch.Tensor, cut: int, pads: tuple[int, int]) -> torch.Tensor:
    a, b = x[:, :cut], x[:, cut:]
    return F.pad(torch.cat([b.tanh(), a * 3], dim=-1), pads)


def _where(cond: Expr) -> Stage:
    a = Expr(Op.LOAD, torch.float32, (), ("a", Y[0], ()))
    b = Expr(Op.LOAD, torch.float32, (), ("b", Y[0], ()))
    return Stage((10,), (Store("out", Expr(Op.WHERE, torch.float32, (cond, a, b)), Y[0]),))


def _index(e: sympy.Expr) -> Expr:
    return Expr(Op.INDEX, torch.int64, (), e)


@pytest.mark.parametrize(
    ("op", "left", "right", "cut"),
    [
        (Op.LT, _index(Y[0]), const(4, torch.int64), 4),
        (Op.LE, _index(Y[0]), const(4, torch.int64), 5),
        (Op.GT, _index(Y[0] + 2), const(4, torch.int64), 3),
        (Op.GE, _index(Y[0] - 1), const(4, torch.int64), 5),
        (Op.LT, const(4, torch.int64), _index(Y[0]), 5),  # 4 < y0 is y0 > 4
    ],
)
def test_cut_points_of_each_comparison(op, left, right, cut):
    found = pieces(_where(Expr(op, torch.bool, (left, right))), {})
    assert found is not None
    assert [lo for lo, _ in found] == [0, cut]
    reads = [{e.arg[0] for e in piece.stores[0].body.args} or {piece.stores[0].body.arg[0]}
             for _, piece in found]  # fmt: skip
    assert all(len(r) == 1 for r in reads)  # each piece reads one input


def test_no_cut_where_the_comparison_is_not_of_the_innermost_loop():
    x0 = sympy.Symbol("x0", integer=True, nonnegative=True)
    cond = Expr(Op.LT, torch.bool, (_index(x0), const(4, torch.int64)))
    assert pieces(_where(cond), {x0: 8}) is None


def test_too_many_pieces_stay_one_loop():
    body = Expr(Op.LOAD, torch.float32, (), ("a", Y[0], ()))
    for k in range(1, MAX_PIECES + 1):  # MAX_PIECES cuts: MAX_PIECES + 1 pieces
        cond = Expr(Op.LT, torch.bool, (_index(Y[0]), const(k, torch.int64)))
        body = Expr(Op.WHERE, torch.float32, (cond, body, const(float(k), torch.float32)))
    assert pieces(Stage((20,), (Store("out", body, Y[0]),)), {}) is None


SCATTERS = [  # (input shape, dim, start, end, step)
    ((2, 4, 6, 32), 3, 16, None, 1),  # rotate_half's backward: the upper half
    ((2, 4, 6, 32), -1, 0, 16, 1),
    ((5, 7), 0, 1, 4, 1),  # an outer dimension
    ((5, 7), 1, -3, None, 1),
    ((5, 7), 1, 2, 100, 1),  # end past the size
    ((5, 7), 1, 4, 4, 1),  # an empty slice
    ((5, 8), 1, 1, 7, 2),  # a step: the aten call
]


@pytest.mark.parametrize(("shape", "dim", "start", "end", "step"), SCATTERS, ids=str)
def test_slice_scatter_gives_eagers_values(shape, dim, start, end, step):
    x = torch.randn(shape)
    src = torch.randn(x[(slice(None),) * (dim % x.ndim) + (slice(start, end, step),)].shape)

    def f(x, src):
        return torch.slice_scatter(x * 2, src + 1, dim, start, end, step) - 1

    compiled = _compiled(f, x, src)
    torch.testing.assert_close(compiled(x, src), f(x, src), rtol=0, atol=0)
    externs = [s for s in compiled.schedule.steps if isinstance(s, Extern)]
    assert bool(externs) == (step != 1)


def test_rotate_halfs_backward_is_one_kernel_of_two_copies():
    g = torch.randn(2, 4, 64, 32)

    def f(g):
        z = torch.zeros(2, 4, 64, 32)
        upper = torch.slice_scatter(z, -g[..., :16], 3, 16, None)
        return upper + torch.slice_scatter(z, g[..., 16:], 3, 0, 16)

    compiled = _compiled(f, g)
    torch.testing.assert_close(compiled(g), f(g), rtol=0, atol=0)
    assert not [s for s in compiled.schedule.steps if isinstance(s, Extern)]
    text = _kernel(compiled, "arg0_1")
    assert text.count("y0 from") == 2 and " ? " not in text


def test_a_rows_clamp_is_computed_once_before_the_loop():
    """A 2-d pad clamps the row index (an outer loop) inside the loads: computed before the
    inner loop, the loads are contiguous (gcc made gathers of them, 7x slower than eager)."""
    x = torch.randn(64, 48)

    def f(x):
        return F.pad(x, (1, 1, 1, 1))

    compiled = _compiled(f, x)
    torch.testing.assert_close(compiled(x), f(x), rtol=0, atol=0)
    text = _kernel(compiled, "x_1")
    for loop in text.split("#pragma omp simd")[1:]:
        body = loop.split("}", 1)[0]
        assert "std::min" not in body and "std::max" not in body, body
    assert "const int64_t t" in text


def test_rotary_over_heads_cuts_each_heads_half():
    """Llama's rotary on [batch, tokens, heads*dim] viewed per head: the select compares
    ``Mod(y0, 32)``; cut after the loop is split per head, each half is a copy."""

    def f(q, cos, sin):
        q = q.view(2, 8, 4, 32).transpose(1, 2)
        x1, x2 = q[..., :16], q[..., 16:]
        return (q * cos + torch.cat((-x2, x1), dim=-1) * sin).transpose(1, 2).reshape(2, 8, 128)

    q, cos, sin = torch.randn(2, 8, 128), torch.randn(8, 32), torch.randn(8, 32)
    compiled = _compiled(f, q, cos, sin)
    torch.testing.assert_close(compiled(q, cos, sin), f(q, cos, sin))
    text = _kernel(compiled, "arg0_1")
    assert "std::min" not in text and " ? " not in text
    assert text.count("y1 from") == 2
