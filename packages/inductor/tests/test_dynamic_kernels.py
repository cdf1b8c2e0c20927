"""Kernels for symbolic sizes as lean as static ones (issue 18's speed target).

An attention block traced with symbolic sizes must give the kernels its static trace gives:
views index dimension by dimension (no floor or Mod of a whole flat index, which needs
symbolic loop bounds to simplify), and extern results keep eager's strides (``split``'s
windows are read in place, not copied). Values are compared with eager at several sizes.
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
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph, decompositions, wrapper_bind
from ember.inductor.ir import I
from ember.inductor.reshape import reshape_index
from ember.inductor.scheduler import Kernel

T = torch.Tensor
HEADS = 4


def attention(x: T, w: T, wo: T) -> T:
    b, s, d = x.shape
    q, k, v = (x @ w).split(d, -1)

    def heads(t: T) -> T:
        return t.view(b, s, HEADS, d // HEADS).transpose(1, 2)

    a = torch.softmax(heads(q) @ heads(k).transpose(-1, -2) * 0.125, -1)
    return (a @ heads(v)).transpose(1, 2).reshape(b * s, d) @ wo


def compiled(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn`` traced with symbolic sizes at ``args`` and compiled (no fallback warning, no
    size specialised: the ShapeEnv gains no guard)."""
    gm = make_fx(fn, tracing_mode="symbolic", decomposition_table=decompositions())(*args)
    env = next(
        n.node.shape_env
        for p in gm.graph.find_nodes(op="placeholder")
        for n in p.meta["val"].shape
        if isinstance(n, torch.SymInt)
    )
    guards = len(env.guards)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = compile_graph(gm, list(args), {"graph_cache": 0})
    assert len(env.guards) == guards, env.guards[guards:]
    return out


def _weights() -> tuple[T, T]:
    return torch.randn(32, 96), torch.randn(32, 32)


def _kernels(fn: Any) -> list[Kernel]:
    return [s for s in fn.schedule.steps if isinstance(s, Kernel)]


def _row_major(flat: int, sizes: list[int]) -> list[int]:
    return [(flat // math.prod(sizes[d + 1 :])) % sizes[d] for d in range(len(sizes))]


def _regroup(dims: list[int], rng: random.Random) -> list[int]:
    """``dims`` with random runs of neighbours multiplied together."""
    out, run = [], 1
    for n in dims:
        run *= n
        if rng.random() < 0.5:
            out.append(run)
            run = 1
    return [*out, run]


def test_reshape_index_is_row_major_order() -> None:
    """Every point of a shape maps to the point of the other shape at the same row-major
    position, for random pairs of shapes of the same elements (size-1 dimensions included)
    and for indices that are expressions (``Mod(i0 + 1, n)``), not just loop variables."""
    rng = random.Random(0)
    for case in range(300):
        dims = [rng.choice([1, 2, 3, 4]) for _ in range(rng.randint(1, 4))]
        new, old = _regroup(dims, rng), _regroup(dims, rng)
        shift = case % 2
        idx = [sympy.Mod(I[d] + shift, n) for d, n in enumerate(new)]
        got_index = reshape_index(idx, new, old)
        for point in itertools.product(*[range(n) for n in new]):
            env = dict(zip(I, point, strict=False))
            got = [int(sympy.sympify(e).xreplace(env)) for e in got_index]
            shifted = [(p + shift) % n for p, n in zip(point, new, strict=True)]
            flat = sum(p * math.prod(new[d + 1 :]) for d, p in enumerate(shifted))
            assert got == _row_major(flat, old), (new, old, point, got_index)


def test_reshape_index_of_symbolic_sizes_needs_no_bounds() -> None:
    k = sympy.Symbol("ks0", integer=True, positive=True)
    m = sympy.Symbol("ks1", integer=True, positive=True)
    assert reshape_index(I[:2], (k * m, 8), (m, k, 8)) == [
        sympy.floor(I[0] / k),
        sympy.Mod(I[0], k),
        I[1],
    ]
    assert reshape_index(I[:4], (m, 1, k, 8), (m * k, 8)) == [k * I[0] + I[2], I[3]]


def test_attention_has_the_static_kernels_under_symbolic_sizes() -> None:
    w, wo = _weights()
    x = torch.randn(3, 5, 32)
    dynamic = compiled(attention, x, w, wo)
    static = compile_graph(
        make_fx(attention, decomposition_table=decompositions())(x, w, wo),
        [x, w, wo],
        {"graph_cache": 0},
    )
    assert len(_kernels(dynamic)) == len(_kernels(static)) == 4
    # heads are split and merged dimension by dimension: no floor of a sum of loop variables
    text = "\n".join(str(k) for k in _kernels(dynamic))
    assert not re.search(r"floor\([^()]*[xy]\d[^()]*\+", text), text
    for b, s in [(2, 3), (3, 5), (4, 17), (2, 64)]:
        x = torch.randn(b, s, 32)
        torch.testing.assert_close(dynamic(x, w, wo), attention(x, w, wo), rtol=1e-4, atol=1e-4)


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The sizes of every tensor the wrappers bound while the test runs copy into another
    layout (``_restride``)."""
    seen: list[tuple[int, ...]] = []
    real = wrapper_bind._restride

    def counted(t: T, sizes: Any, strides: Any) -> T:
        seen.append(tuple(t.shape))
        return real(t, sizes, strides)

    monkeypatch.setattr(wrapper_bind, "_restride", counted)
    return seen


def test_split_outputs_are_read_in_place(copies: list[tuple[int, ...]]) -> None:
    w, wo = _weights()
    fn = compiled(attention, torch.randn(3, 5, 32), w, wo)
    (split,) = [s for s in fn.schedule.steps if "split" in str(getattr(s, "target", ""))]
    strides = [fn.schedule.program.buffers[n].layout.strides for n in split.names]
    for b, s in [(2, 3), (3, 7), (5, 16)]:
        x = torch.randn(b, s, 32)
        torch.testing.assert_close(fn(x, w, wo), attention(x, w, wo), rtol=1e-4, atol=1e-4)
        q = (x @ w).split(32, -1)[0]
        assert [sympy.sympify(n).subs(_sizes(fn, x, w, wo)) for n in strides[0]] == list(q.stride())
    assert copies == []  # q, k and v keep eager's strides: no copy per call


def _sizes(fn: Any, *args: T) -> dict[Any, int]:
    """The size symbols' values for the call ``fn(*args)``."""
    prog = fn.schedule.program
    tensors = dict(zip(prog.inputs, args, strict=True))
    read = {"size": T.size, "stride": T.stride}
    return {
        s: read[kind](tensors[name], d) for s, (name, kind, d) in prog.size_vars.sources.items()
    }


def test_an_input_eager_lays_out_otherwise_still_gets_the_right_strides() -> None:
    """An extern whose input is realized compact where eager's is transposed: its result is
    planned compact, checked at run time, and the values are eager's."""

    def f(x: T) -> T:
        y = (x.transpose(0, 1) * 2).cumsum(0)  # cumsum runs as aten on a transposed value
        return y + 1

    fn = compiled(f, torch.randn(5, 3))
    for n, m in [(2, 3), (4, 9), (7, 5)]:
        x = torch.randn(n, m)
        torch.testing.assert_close(fn(x), f(x))


def _two_layers(x: T, w: T, w2: T) -> tuple[T, T]:
    h = (x.sin() @ w).tanh()  # x.sin(): an intermediate a matmul reads, pooled
    return (h @ w2).relu(), h.sum(0)


def test_intermediates_are_pooled_per_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call of the size of the last one takes its intermediates from the pool; a call of
    another size allocates (and the pool then holds that size's set only)."""
    allocs: list[tuple[int, ...]] = []
    real = torch.empty_strided

    def counted(size: Any, stride: Any, **kw: Any) -> T:
        allocs.append(tuple(size))
        return real(size, stride, **kw)

    monkeypatch.setattr(torch, "empty_strided", counted)
    w, w2 = torch.randn(16, 16), torch.randn(16, 4)
    fn = compiled(_two_layers, torch.randn(8, 16), w, w2)
    made, kept = [], []
    for n in [5, 5, 7, 5, 5]:
        x = torch.randn(n, 16)
        allocs.clear()
        kept.append((x, fn(x, w, w2)))
        made.append((n, 16) in allocs)
    assert "_take(_pool)" in fn.wrapper
    assert made == [True, False, True, True, False]
    for x, got in kept:  # earlier results survive later calls
        for g, want in zip(got, _two_layers(x, w, w2), strict=True):
            torch.testing.assert_close(g, want)


def test_pooled_symbolic_wrapper_is_thread_safe(in_threads: Any) -> None:
    w, w2 = torch.randn(16, 16), torch.randn(16, 4)
    fn = compiled(_two_layers, torch.randn(8, 16), w, w2)

    def work(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for k in range(40):
            x = torch.randn(3 + (seed + k) % 4, 16, generator=g)
            for got, want in zip(fn(x, w, w2), _two_layers(x, w, w2), strict=True):
                torch.testing.assert_close(got, want)

    in_threads(work)


def _packed_heads(x: T, w: T) -> T:
    b, s, _ = x.shape  # the view's constants tie the other sizes to 32 and 96
    qkv = (x @ w).view(b, s, 3, HEADS, 8).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]  # select: windows of the matmul's result
    return torch.softmax(q @ k.transpose(-1, -2), -1) @ v


def test_selected_heads_are_windows_not_extern_calls() -> None:
    w = torch.randn(32, 96) * 0.2
    fn = compiled(_packed_heads, torch.randn(2, 5, 32), w)
    targets = [str(s.target) for s in fn.schedule.steps if not isinstance(s, Kernel)]
    assert not any("select" in t for t in targets), targets
    for b, s in [(2, 3), (3, 8), (4, 13)]:
        x = torch.randn(b, s, 32)
        torch.testing.assert_close(fn(x, w), _packed_heads(x, w), rtol=1e-4, atol=1e-4)


def _embed(ids: T, wte: T, wpe: T) -> tuple[T, T]:
    pos = torch.arange(0, ids.size(1))
    h = F.embedding(ids, wte) + F.embedding((pos + 0)[None], wpe)  # as HF GPT-2 makes them
    causal = (pos[None, :] <= pos[:, None]) & (pos[None, :] >= 0)
    return h.sum(-1), causal.float()


def test_embeddings_are_gathered_in_the_kernel() -> None:
    """Token and position embeddings read their tables in the kernel (as in a static
    graph), with eager's IndexError for a token id or a position past the table."""
    wte, wpe = torch.randn(50, 8), torch.randn(16, 8)
    fn = compiled(_embed, torch.randint(0, 50, (2, 5)), wte, wpe)
    assert all(isinstance(s, Kernel) for s in fn.schedule.steps)  # no embedding, no arange
    for b, s in [(2, 3), (3, 9), (4, 16)]:
        ids = torch.randint(0, 50, (b, s))
        for got, want in zip(fn(ids, wte, wpe), _embed(ids, wte, wpe), strict=True):
            torch.testing.assert_close(got, want)
    with pytest.raises(IndexError, match="index out of range in self"):
        fn(torch.randint(0, 50, (2, 17)), wte, wpe)  # position 16 of a 16-row table
    with pytest.raises(IndexError, match="index out of range in self"):
        fn(torch.full((2, 4), 50), wte, wpe)  # token id 50 of a 50-row table


def _residual_norm(x: T, r: T, w: T) -> T:
    b, s, d = x.shape
    h = F.layer_norm(x + r, (d,))
    return h.view(b * s, d) @ w  # the matmul reads the rows as [b*s, d]


def test_layer_norm_is_one_kernel_under_symbolic_sizes() -> None:
    """Statistics over [b, s] and the normalised rows over [b*s, d] share a kernel (the
    rows cut as the statistics' kernel cuts them), as in the static graph."""
    w = torch.randn(16, 8)
    x, r = torch.randn(3, 5, 16), torch.randn(3, 5, 16)
    fn = compiled(_residual_norm, x, r, w)
    static = compile_graph(
        make_fx(_residual_norm, decomposition_table=decompositions())(x, r, w),
        [x, r, w],
        {"graph_cache": 0},
    )
    assert len(_kernels(fn)) == len(_kernels(static)) == 1
    for b, s in [(2, 3), (4, 7), (3, 32)]:
        x, r = torch.randn(b, s, 16), torch.randn(b, s, 16)
        torch.testing.assert_close(fn(x, r, w), _residual_norm(x, r, w), rtol=1e-4, atol=1e-4)


def test_an_index_computed_from_a_symbolic_input_asks_nothing() -> None:
    """The index check of a gather-like lowering looks for an index made of constants; a
    node sized by a symbol is none, and asking whether it is small (``numel <= 65536``)
    guarded on the sizes after capture had made its guards."""

    def f(x: T, i: T) -> T:
        return x.index_select(0, i * 2) + 1

    # 4 indices: a symbol of its own (3 would share the columns' by duck sizing)
    fn = compiled(f, torch.arange(24.0).view(8, 3), torch.tensor([1, 0, 3, 2]))
    for rows, index in [(8, [1, 0, 3, 2]), (11, [4, 0, 5, 2, 1])]:  # other sizes, same kernels
        x, i = torch.randn(rows, 3), torch.tensor(index)
        out = fn(x, i)
        assert torch.equal(out if isinstance(out, T) else out[0], f(x, i))
