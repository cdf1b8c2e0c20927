"""Whole-tensor reductions split across programs (``triton_split.py``), under Triton's
interpreter against eager: partial results per program, then one combine program; sum,
max/min with NaN, argmax/argmin with ties across programs, Welford, later stages (a mean),
ragged and integer inputs; short reductions keep one program.

Triton must be imported with ``TRITON_INTERPRET=1`` set (see ``test_triton.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph, decompositions

pytestmark = pytest.mark.interpreted_triton  # skipped where no interpreter (conftest)

T = torch.Tensor
OPTIONS = {"cpu_backend": "triton", "graph_cache": False}


def _compiled(fn: Callable[..., Any], *inputs: T, split: bool = True) -> Any:
    gm = make_fx(fn, decomposition_table=decompositions())(*inputs)
    compiled = compile_graph(gm, list(inputs), OPTIONS)
    assert compiled.target is not None and compiled.target.printer == "triton"
    assert ("_part[(_parts,)]" in compiled.source) == split, compiled.source
    torch.testing.assert_close(compiled(*inputs), fn(*inputs), equal_nan=True, rtol=1e-4, atol=1e-3)
    return compiled


def test_sum_mean_and_a_later_stage() -> None:
    x = torch.randn(100, 301)  # 30,100 points: 30 programs, the last one ragged
    compiled = _compiled(lambda x: (x.sum(), x.mean(), (x * 2).exp().sum() + 1), x)
    assert compiled.source.count("_p = torch.empty(") == 2  # sum (shared by mean), sum of exp


def test_max_min_and_their_nan() -> None:
    x = torch.randn(50_000)
    _compiled(lambda x: (x.amax(), x.amin()), x)
    x[31_000] = float("nan")  # in one program's chunk only: the combine still sees it
    _compiled(lambda x: (x.amax(), x.amin(), x.argmax(), x.argmin()), x)


def test_argmax_ties_across_programs_keep_the_first() -> None:
    x = torch.zeros(50_000)
    x[[3_000, 40_000]] = 5.0  # the same largest value in two programs' chunks
    x[[7_000, 45_000]] = -5.0
    _compiled(lambda x: (x.argmax(), x.argmin()), x)
    _compiled(lambda x: (x.argmax(), x.amax()), torch.full((9_000,), float("-inf")))


def test_welford_partials_join() -> None:
    x = torch.randn(120, 250) * 3 + 100  # a large mean: a naive sum of squares would drift
    compiled = _compiled(lambda x: torch.var_mean(x, correction=0), x)
    assert "_pm = torch.empty(" in compiled.source  # (mean, m2, n) partials
    _compiled(lambda x: (x.var(), x.std()), x)


def test_integer_and_half_precision_inputs() -> None:
    i = torch.randint(-1000, 1000, (70, 100))
    _compiled(lambda i: (i.sum(), i.amax(), i.argmin()), i)
    h = torch.randn(80, 100, dtype=torch.float16)
    _compiled(lambda h: (h.amax(), h.float().sum()), h)


def test_short_reductions_and_two_pass_ones_keep_one_program() -> None:
    _compiled(lambda x: x.sum(), torch.randn(30, 100), split=False)  # 3,000 points
    x = torch.randn(100, 300)
    _compiled(lambda x: ((x - x.mean()) ** 2).sum(), x, split=False)  # reads the whole mean
    _compiled(lambda x: x.sum(1), x, split=False)  # an outer loop: programs over rows
