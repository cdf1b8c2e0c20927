"""The opt-in Philox path (``fallback_random=False``) in the Triton printer, under Triton's
interpreter: the same seed gives the C++ printer's numbers bit for bit (rand, randn,
bernoulli, dropout forward and backward); by default random ops stay eager's aten calls.

Triton must be imported with ``TRITON_INTERPRET=1`` set (see ``test_triton.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph
from ember.inductor.ir import Extern

pytestmark = pytest.mark.interpreted_triton  # skipped where no interpreter (conftest)

aten = torch.ops.aten
T = torch.Tensor
TRITON = {"cpu_backend": "triton", "graph_cache": False, "fallback_random": False}
CPP = {"graph_cache": False, "fallback_random": False}


def _both(fn: Callable[..., Any], *inputs: T, seed: int = 3) -> tuple[Any, Any]:
    """``fn`` compiled by each printer with fused random numbers, each run from ``seed``."""
    gm = make_fx(fn)(*inputs)
    triton = compile_graph(gm, list(inputs), TRITON)
    cpp = compile_graph(gm, list(inputs), CPP)
    assert triton.target is not None and triton.target.printer == "triton"
    assert "_ember_rand" in triton.source and cpp.target is None  # Philox in both
    torch.manual_seed(seed)
    got = triton(*inputs)
    torch.manual_seed(seed)
    return got, cpp(*inputs)


def _identical(got: Any, want: Any) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8)), (
            f"{int((g != w).sum())} of {g.numel()} differ"
        )


def program(x: T) -> tuple[T, ...]:
    y, mask = aten.native_dropout.default(x, 0.3, True)
    coin = aten.bernoulli.p(x, 0.25)
    return y * 2 + 1, mask, torch.rand_like(x), torch.randn(x.shape) * x, coin


def test_rand_randn_dropout_bernoulli_are_the_cpp_numbers_bit_for_bit() -> None:
    x = torch.randn(300, 70)  # 21,000 elements, a ragged last block
    got, want = _both(program, x)
    _identical(got, want)
    z = got[3] / x  # the normals themselves
    assert abs(z.mean().item()) < 0.03 and abs(z.std().item() - 1) < 0.03


def test_reductions_of_random_numbers_and_other_dtypes() -> None:
    """Row kernels (``[XBLOCK, RBLOCK]`` blocks) draw at the same offsets as flat ones;
    a float64 and a float16 ``rand`` round the same float32 number."""

    def fn(x: T) -> tuple[T, ...]:
        r = torch.randn(x.shape)
        noisy = torch.softmax(x + r, -1)
        wide = torch.rand(x.shape, dtype=torch.float64)
        half = torch.rand(x.shape, dtype=torch.float16)
        return noisy, r.amax(1), wide, half

    got, want = _both(fn, torch.randn(37, 129))
    _identical(got[2:], want[2:])  # no arithmetic after the draw
    _identical(got[1:2], want[1:2])  # a max picks a number, exactly
    torch.testing.assert_close(got[0], want[0])  # softmax: another summation order


DRAW = """
@triton.jit
def draw(seeds, offsets, u, n, N: tl.constexpr):
    i = tl.arange(0, N)
    s = tl.load(seeds + i)
    o = tl.load(offsets + i)
    tl.store(u + i, _ember_rand(s, o))
    tl.store(n + i, _ember_randn(s, o))
"""


def test_helpers_are_the_reference_generator_at_64_bit_seeds_and_offsets(tmp_path: Any) -> None:
    """The helpers alone, at seeds and offsets past 32 bits (the high words enter the key
    and counter), against ``philox.uniform``/``normal`` (the reference interpreter's)."""
    import importlib.util
    import sys

    from ember.inductor import philox
    from ember.inductor.triton_prelude import HEADER

    path = tmp_path / "draw.py"
    path.write_text(HEADER + philox.triton_source(True) + DRAW)
    spec = importlib.util.spec_from_file_location("ember_test_draw", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # Triton reads the kernel's source through its module
    spec.loader.exec_module(module)
    g = torch.Generator().manual_seed(0)
    seeds = torch.randint(0, 1 << 62, (64,), generator=g)
    offsets = torch.cat([torch.arange(16), (1 << 32) + torch.arange(16),
                         torch.randint(0, 1 << 62, (32,), generator=g)])  # fmt: skip
    u, n = torch.empty(64), torch.empty(64)
    module.draw[(1,)](seeds, offsets, u, n, N=64)
    _identical((u, n), (philox.uniform(seeds, offsets), philox.normal(seeds, offsets)))
    assert not torch.equal(u[:16], u[16:32])  # the counter's high word counts


def test_dropout_forward_and_backward_are_the_cpp_numbers() -> None:
    """Training through a fused dropout: one mask forward and backward, the C++ one."""
    from ember.aotgraph import aot_compile

    def f(x: T, w: T) -> T:
        return torch.nn.functional.dropout(x @ w, 0.4, training=True) * 3

    x, w = torch.randn(64, 33), torch.randn(33, 17)
    outs = {}
    for name, options in (("triton", TRITON), ("cpp", CPP)):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        fn = aot_compile(
            torch.fx.symbolic_trace(f),
            [xs, ws],
            fw_compiler=lambda gm, ex, o=options: compile_graph(gm, ex, o),
            bw_compiler=lambda gm, ex, o=options: compile_graph(gm, ex, o),
        )
        torch.manual_seed(7)
        y = fn(xs, ws)
        y.sum().backward()
        outs[name] = (y.detach(), xs.grad, ws.grad)
    _identical(outs["triton"], outs["cpp"])  # the same mask, the same products
    y, gx, gw = outs["triton"]
    kept = (y != 0).float()
    assert abs(kept.mean().item() - 0.6) < 0.05
    dy = kept * 3 / 0.6
    torch.testing.assert_close(gx, dy @ w.t(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gw, x.t() @ dy, rtol=1e-4, atol=1e-4)


def test_by_default_random_ops_stay_eagers_aten_calls() -> None:
    x = torch.randn(40, 30)
    compiled = compile_graph(make_fx(program)(x), [x], {"cpu_backend": "triton"})
    assert compiled.target is not None and "_ember_rand" not in compiled.source
    externs = {str(s.target) for s in compiled.schedule.steps if isinstance(s, Extern)}
    assert "aten.randint.low" not in externs
    torch.manual_seed(5)
    got = compiled(x)
    torch.manual_seed(5)
    for g, w in zip(got, program(x), strict=True):
        torch.testing.assert_close(g, w)
