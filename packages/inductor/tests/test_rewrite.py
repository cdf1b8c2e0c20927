"""Rewrite rules and index simplification, and the trace folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph
from ember.inductor.indexing import simplify_index
from ember.inductor.ir import Buffer, Expr, I, Layout, const, load
from ember.inductor.ops import Op
from ember.inductor.rewrite import ALGEBRA, FOLD, rewrite

x0, x1, y0 = (sympy.Symbol(n, integer=True, nonnegative=True) for n in ("x0", "x1", "y0"))


@pytest.mark.parametrize(
    ("index", "bounds", "want"),
    [
        (sympy.Mod(y0, 8), {y0: 8}, y0),  # cannot wrap
        (sympy.floor(y0 / 8), {y0: 8}, 0),  # cannot reach the next multiple
        (sympy.floor((512 * x0 + y0) / 32768), {x0: 256, y0: 512}, sympy.floor(x0 / 64)),
        (sympy.Mod(512 * x0 + y0, 32768), {x0: 256, y0: 512}, 512 * sympy.Mod(x0, 64) + y0),
        (4 * sympy.Mod(x0, 8) + 32 * sympy.floor(x0 / 8), {x0: 64}, 4 * x0),  # recombined
        (sympy.Mod(x0, 8), {x0: 9}, sympy.Mod(x0, 8)),  # may wrap: kept
    ],
)
def test_simplify_index(index: sympy.Expr, bounds: dict[sympy.Symbol, int], want: object) -> None:
    assert simplify_index(index, bounds) == want


def test_algebra_and_folding() -> None:
    x = load(Buffer("x", torch.float32, Layout.contiguous((8,))), (I[0],))
    f32 = torch.float32
    two = Expr(Op.ADD, f32, (const(1.0, f32), const(1.0, f32)))
    assert rewrite(Expr(Op.POW, f32, (x, two)), ALGEBRA + FOLD) == Expr(Op.MUL, f32, (x, x))
    neg = Expr(Op.NEG, f32, (Expr(Op.NEG, f32, (x,)),))
    assert rewrite(neg, ALGEBRA) == x
    plus_zero = Expr(Op.ADD, f32, (x, const(0.0, f32)))
    assert rewrite(plus_zero, ALGEBRA) == plus_zero  # -0.0 + 0.0 is 0.0: not an identity


def test_trace_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_INDUCTOR_TRACE", "1")
    monkeypatch.setenv("EMBER_INDUCTOR_TRACE_DIR", str(tmp_path))
    x = torch.randn(4, 4)
    compiled = compile_graph(make_fx(lambda x: x.tanh().sum(0) * 3)(x), [x])
    compiled(x)
    (folder,) = tmp_path.iterdir()
    names = sorted(p.name for p in folder.iterdir())
    assert {
        "00_input_graph.txt",
        "02_lower.txt",
        "05_schedule.txt",
        "05_kernels.cpp",
        "06_wrapper.py",
        "compile_command.txt",
        "times.json",
    } <= set(names), names
    assert 'extern "C" void kernel0' in (folder / "05_kernels.cpp").read_text()
    assert "lower" in json.loads((folder / "times.json").read_text())


def test_floor_and_mod_by_a_multiple_of_a_size_drop_the_low_terms() -> None:
    """``(y0 + 128*x0) // (128*ks0) == x0 // ks0`` when ``0 <= y0 < 128``: exact for every
    positive size, checked by brute force (symbolic graphs indexed with run-time division)."""
    import itertools

    import sympy

    from ember.inductor.indexing import simplify_index

    ks0, ks1 = sympy.symbols("ks0 ks1", integer=True, positive=True)
    y0, x0 = sympy.symbols("y0 x0", integer=True, nonnegative=True)
    bounds = {y0: 16, x0: ks0 * ks1}
    cases = [
        sympy.floor((y0 + 16 * x0) / (16 * ks0)),
        sympy.Mod(y0 + 16 * x0, 16 * ks0),
        sympy.floor((y0 + 32 * x0) / (16 * ks0)),
        sympy.Mod(y0 + 8 * x0, 16 * ks0),
    ]
    simple = [simplify_index(e, bounds) for e in cases]
    assert simple[0] == sympy.floor(x0 / ks0)
    for a, b in itertools.product(range(1, 4), range(1, 4)):
        for x, y in itertools.product(range(a * b), range(16)):
            point = {ks0: a, ks1: b, x0: x, y0: y}
            for e, s in zip(cases, simple, strict=True):
                assert int(e.subs(point)) == int(s.subs(point)), (e, s, point)


def _digits(flat: sympy.Expr, sizes: list[sympy.Expr]) -> list[sympy.Expr]:
    """The row-major coordinates of position ``flat`` in ``sizes``, as the lowering writes them."""
    import math

    steps = [math.prod(sizes[j + 1 :]) for j in range(len(sizes))]
    return [sympy.Mod(sympy.floor(flat / s), n) for s, n in zip(steps, sizes, strict=True)]


def test_symbolic_bounds_simplify_and_stay_exact() -> None:
    """Indices of a view of a view over loops with symbolic bounds: the divisions go away
    where they cannot change anything, and every simplified index equals the original at
    every point, for several values of the sizes (brute force)."""
    import itertools
    import math
    import random

    ks0, ks1 = sympy.symbols("ks0 ks1", integer=True, positive=True)
    rng = random.Random(0)
    pool = [sympy.Integer(2), sympy.Integer(3), sympy.Integer(4), ks0, ks1]
    dropped = 0
    for _ in range(40):
        dims = [rng.choice(pool) for _ in range(rng.randint(2, 4))]
        loops = sympy.symbols(f"x0:{len(dims)}", integer=True, nonnegative=True)
        flat = sympy.Add(*[x * math.prod(dims[j + 1 :]) for j, x in enumerate(loops)])
        cut = rng.randint(1, len(dims) - 1)  # the same elements, two dims merged or split
        other = [math.prod(dims[:cut]), *dims[cut:]] if rng.random() < 0.5 else [*dims]
        order = list(range(len(other)))
        rng.shuffle(order)  # a permuted layout: the address of each coordinate
        strides = [math.prod(other[k] for k in order[order.index(j) + 1 :]) for j in order]
        index = sympy.Add(*[d * s for d, s in zip(_digits(flat, other), strides, strict=True)])
        extent = list(dims)  # the loops' sizes: the view's, or past it (a wrap to keep)
        extent[rng.randrange(len(dims))] += rng.choice((0, 0, 1))
        bounds = dict(zip(loops, extent, strict=True))
        simple = simplify_index(index, bounds)
        divisions = (sympy.floor, sympy.Mod)
        dropped += len(index.atoms(*divisions)) - len(simple.atoms(*divisions))
        names = [ks0, ks1, *loops]
        before, after = (sympy.lambdify(names, e, "math") for e in (index, simple))
        for a, b in itertools.product((1, 2, 3), (1, 2)):
            ranges = [range(int(n.subs({ks0: a, ks1: b}))) for n in extent]
            for point in itertools.product(*ranges):
                assert before(a, b, *point) == after(a, b, *point), (index, simple, a, b, point)
    assert dropped > 40  # the point of it: most divisions were proved away


def test_a_split_index_is_put_back_without_a_proof(monkeypatch: pytest.MonkeyPatch) -> None:
    """``a*n*floor(x/n) + a*Mod(x, n)`` is ``a*x`` for any divisor: recombined before any
    floor or Mod is proved against the bounds (a view of a flattened symbolic dimension;
    proving each with symbolic bounds cost 3-12 ms in sympy)."""
    from ember.inductor import indexing

    def unused(*args: object) -> object:
        raise AssertionError("proved a division that recombines")

    monkeypatch.setattr(indexing, "_simplify_floor", unused)
    monkeypatch.setattr(indexing, "_simplify_mod", unused)
    indexing._simplified.cache_clear()
    ks0, ks1 = sympy.symbols("ks0 ks1", integer=True, positive=True)
    i0, i1 = sympy.symbols("i0 i1", integer=True, nonnegative=True)
    split = i1 + 128 * ks0 * sympy.floor(i0 / ks0) + 128 * sympy.Mod(i0, ks0)
    assert simplify_index(split, {i0: ks1 * ks0, i1: 128}) == 128 * i0 + i1
    assert simplify_index(split, {i0: ks1 * ks0 + 5, i1: 128}) == 128 * i0 + i1  # any bound
    static = sympy.Mod(i0, 64) + 64 * sympy.floor(i0 / 64)
    assert simplify_index(static, {i0: 128}) == i0
    indexing._simplified.cache_clear()


def test_symbolic_attention_index_has_no_division() -> None:
    """The softmax-times-values index of a (b*4, t, t) attention view over loops of sizes
    (4*b, t, t), which fusion used to leave as ``(x1 + y0 // t) % t`` and worse."""
    ks0, ks1 = sympy.symbols("ks0 ks1", integer=True, positive=True)
    x0, x1, y0 = sympy.symbols("x0 x1 y0", integer=True, nonnegative=True)
    flat = y0 + x1 * ks1 + x0 * ks1**2
    index = sympy.Add(
        *[
            d * s
            for d, s in zip(
                _digits(flat, [ks0, sympy.Integer(4), ks1, ks1]),
                [4 * ks1**2, ks1**2, ks1, 1],
                strict=True,
            )
        ]
    )
    assert simplify_index(index, {x0: 4 * ks0, x1: ks1, y0: ks1}) == flat


def test_a_flat_loop_over_two_symbolic_dims_indexes_without_division() -> None:
    """``x0 < ks0*ks1`` split into ``(x0 // ks0) % ks1`` and ``x0 % ks0`` (GPT-2's MLP under
    dynamic=True) is ``x0`` again: ``x0 // ks0 <= (ks0*ks1 - 1)/ks0 < ks1``."""
    ks0, ks1 = sympy.symbols("ks0 ks1", integer=True, positive=True)
    x0, y0 = sympy.symbols("x0 y0", integer=True, nonnegative=True)
    index = y0 + 512 * sympy.Mod(x0, ks0) + 512 * ks0 * sympy.Mod(sympy.floor(x0 / ks0), ks1)
    assert simplify_index(index, {x0: ks0 * ks1, y0: 512}) == y0 + 512 * x0
    assert simplify_index(sympy.Mod(sympy.floor(x0 / ks0), ks1), {x0: ks0 * ks1 + 1}) != (
        sympy.floor(x0 / ks0)
    )  # one past the end may wrap: kept
