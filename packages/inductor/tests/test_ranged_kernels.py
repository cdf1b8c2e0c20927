"""Kernels over symbolic sizes with outer loops: one body over a range of the collapsed outer
loops, called over all of them on one thread or per thread over its share
(``codegen_ranges``).

Values are compared with eager where threads split the outer points at every kind of
boundary: 3 threads and a parallel threshold of 1 element, so each thread's share starts
and ends in the middle of a row, a tile or a block of rows.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph, decompositions
from ember.inductor.codegen_ranges import range_nest
from ember.inductor.knobs import Knobs, knobs

T = torch.Tensor


def compiled(fn: Callable[..., Any], x: T) -> Any:
    """``fn`` traced with symbolic sizes at ``x`` and compiled (no fallback warning)."""
    gm = make_fx(fn, tracing_mode="symbolic", decomposition_table=decompositions())(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return compile_graph(gm, [x], {"graph_cache": 0})


def _heads(x: T) -> T:  # three outer loops, an odometer
    return (x.view(x.size(0), x.size(1), 2, -1).transpose(1, 2) * 2).contiguous()


def _rows(x: T) -> Any:
    return torch.softmax(x, -1), F.layer_norm(x, x.shape[-1:])  # one outer loop per row


def _columns(x: T) -> Any:
    return x.sum(1), (x * 3).sum(0)  # column kernels: tiles of 16 outputs (and rows of them)


CASES: list[tuple[str, Callable[..., Any], Callable[[int], T]]] = [
    ("heads", _heads, lambda n: torch.randn(n, n + 2, 6)),
    ("rows", _rows, lambda n: torch.randn(n, 2, n + 1)),
    ("columns", _columns, lambda n: torch.randn(3, n + 4, 2 * n + 1)),
]


@pytest.mark.parametrize(("name", "fn", "make"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("threads", [1, 3])
def test_threads_share_every_outer_point(
    name: str, fn: Callable[..., Any], make: Callable[[int], T], threads: int
) -> None:
    with knobs(Knobs(threads=threads, parallel_min_work=1)):
        c = compiled(fn, make(10))
    assert c.source is not None and "ember_share(n, lo, hi)" in c.source
    for n in [2, 3, 5, 7, 16, 17, 33]:
        x = make(n)
        torch.testing.assert_close(c(x), fn(x), msg=f"{name} n={n} threads={threads}")


def test_each_ranged_kernel_is_written_once() -> None:
    """One body per kernel (no serial and parallel copies), a dispatcher that calls it on one
    thread below the threshold, and kernels repeated over layers aliased to the first."""

    def layers(x: T) -> T:
        for _ in range(3):  # the matmuls (aten calls) end each layer's kernel
            x = F.layer_norm(x, x.shape[-1:]).relu()
            x = (x @ x.transpose(-1, -2) / 12) @ x
        return x

    c = compiled(layers, torch.randn(10, 7, 12))
    src = c.source
    assert src is not None
    names = re.findall(r'^extern "C" void (kernel\d+)\(', src, re.M)
    bodies = re.findall(r"^static void __attribute__\(\(noinline\)\) (kernel\d+)_r\(", src, re.M)
    aliases = re.findall(r'__attribute__\(\(alias\("(kernel\d+)"\)\)\);', src)
    assert bodies and len(bodies) == len(set(bodies)) and set(bodies) <= set(names)
    assert not re.search(r"kernel\d+_[sp]\(", src)  # no serial and parallel copies
    assert aliases and set(aliases) <= set(bodies), "no layer's kernel shared"
    assert len(bodies) + len(aliases) == len(names)
    for n in [2, 9, 31]:
        x = torch.randn(n, 5, 12)
        torch.testing.assert_close(c(x), layers(x))


def test_kernels_without_outer_loops_keep_two_versions() -> None:
    """A reduction of a whole tensor has no outer loop to share out: its threads split the
    reduction itself, in a parallel version chosen per call."""
    c = compiled(lambda x: x.sum(), torch.randn(10, 7))
    assert c.source is not None and re.search(r"if \(.* >= \d+\) kernel\d+_p\(", c.source)
    x = torch.randn(3, 70001)
    torch.testing.assert_close(c(x), x.sum(), rtol=1e-4, atol=5e-3)


def test_range_nest_visits_the_points_of_the_loops_in_order() -> None:
    """The odometer's C++, run in Python over every range: the points of the nested loops
    from ``lo`` to ``hi`` in row-major order (tile loops step by their tile)."""
    loops = [("x0", "3", 1), ("x1", "4", 1), ("xb", "37", 16)]
    head, loop, step = range_nest(loops)
    points = [(a, b, c) for a in range(3) for b in range(4) for c in range(0, 37, 16)]
    for lo in range(len(points)):
        for hi in range(lo + 1, len(points) + 1):
            env: dict[str, int] = {"lo": lo}
            for line in head:  # int64_t v = expr;  (C's / of non-negatives is Python's //)
                var, expr = re.fullmatch(r"int64_t (\w+) = (.*);", line).groups()  # type: ignore[union-attr]
                env[var] = eval(expr.replace("/", "//"), {}, env)
            seen = []
            for _ in range(lo, hi):
                seen.append((env["x0"], env["x1"], env["xb"]))
                _advance(step, env)
            assert seen == points[lo:hi], (lo, hi, loop)


def _advance(step: str, env: dict[str, int]) -> None:
    """Run the odometer step ``if ((xb += 16) >= 37) { xb = 0; if (++x1 == 4) ... }``."""
    m = re.fullmatch(
        r"if \(\(?(\+\+(\w+)|(\w+) \+= (\d+)\)?) (==|>=) (\w+)\) \{ \w+ = 0; (.*) \}", step
    )
    if m is None:
        var = step.removeprefix("++").removesuffix(";")
        env[var] += 1
        return
    var = m.group(2) or m.group(3)
    env[var] += int(m.group(4) or 1)
    if env[var] >= int(m.group(6)):
        env[var] = 0
        _advance(m.group(7), env)
