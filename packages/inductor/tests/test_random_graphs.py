"""Property test: random graphs of pointwise and reduction ops agree with eager."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph

T = torch.Tensor
UNARY: list[Callable[[T], T]] = [
    torch.exp,
    torch.tanh,
    torch.sigmoid,
    torch.relu,
    torch.neg,
    lambda x: x * 0.5 + 1,
    lambda x: torch.sqrt(x.abs()),
]
BINARY: list[Callable[[T, T], T]] = [
    torch.add,
    torch.mul,
    torch.maximum,
    torch.sub,
    lambda a, b: torch.where(a > b, a, b * 2),
]
REDUCE: list[Callable[[T], T]] = [
    lambda x: x.sum(-1, keepdim=True),
    lambda x: x.amax(-1, keepdim=True),
    lambda x: x.mean(0, keepdim=True),
    lambda x: x.amin(0, keepdim=True),
]


@st.composite
def programs(draw: st.DrawFn) -> tuple[list[tuple[int, int, int, int]], tuple[int, int], bool]:
    steps = draw(
        st.lists(
            st.tuples(st.integers(0, 2), st.integers(0, 6), st.integers(0, 99), st.integers(0, 99)),
            min_size=1,
            max_size=8,
        )
    )
    shape = draw(st.sampled_from([(5, 7), (16, 33), (1, 9), (64, 128)]))
    return steps, shape, draw(st.booleans())


def _build(steps: list[tuple[int, int, int, int]]) -> Callable[[T, T], tuple[T, ...]]:
    def f(x: T, y: T) -> tuple[T, ...]:
        values = [x, y]
        for kind, op, a, b in steps:
            u, v = values[a % len(values)], values[b % len(values)]
            if kind == 0:
                values.append(UNARY[op % len(UNARY)](u))
            elif kind == 1:
                values.append(BINARY[op % len(BINARY)](u, v))
            else:
                values.append(REDUCE[op % len(REDUCE)](u))
        return tuple(values[2:])

    return f


def _check(program: tuple[list[tuple[int, int, int, int]], tuple[int, int], bool],
           options: dict[str, Any] | None) -> None:  # fmt: skip
    steps, shape, transposed = program
    g = torch.Generator().manual_seed(len(steps))
    x = torch.randn(shape[::-1] if transposed else shape, generator=g)
    x = x.t() if transposed else x
    y = torch.randn(shape, generator=g)
    f = _build(steps)
    compiled = compile_graph(make_fx(f)(x, y), [x, y], options)
    if options is not None:  # the Triton printer took it (no fallback to C++)
        assert compiled.target is not None and compiled.target.printer == "triton"
    torch.testing.assert_close(compiled(x, y), f(x, y), equal_nan=True, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_graph_matches_eager(
    program: tuple[list[tuple[int, int, int, int]], tuple[int, int], bool],
) -> None:
    _check(program, None)


@pytest.mark.slow
@pytest.mark.interpreted_triton
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_graph_matches_eager_on_triton(
    program: tuple[list[tuple[int, int, int, int]], tuple[int, int], bool],
) -> None:
    """The same graphs through the Triton printer, under its interpreter (issue 20; the
    conftest's autouse fixture sets TRITON_INTERPRET once for all of the test's examples)."""
    _check(program, {"cpu_backend": "triton", "graph_cache": False})
