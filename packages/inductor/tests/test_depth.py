"""Compile time over depth: a stack of repeated layers compiles each repetition's kernel once.

A transformer repeats one layer N times. Its kernels differ between layers only in the
buffers they read (``primals_10`` in one layer, ``primals_34`` in the next), so the C++
translation unit holds one body per distinct kernel and aliases the repetitions to it
(``codegen_cpp._canonical``). The reuse must be exact: layers of other widths or dtypes keep
their own kernels, and every output equals eager's. Scheduling stays linear in the nodes
(``restage`` derives each node's loop order once).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import ember.inductor.restage as restage_module
from ember.inductor import compile_graph, decompositions
from ember.inductor.lowering import lower_graph

T = torch.Tensor
ALIAS = re.compile(
    r'^extern "C" void (kernel\d+)\(.*__attribute__\(\(alias\("(kernel\d+)"\)\)\);$', re.M
)
KERNEL = re.compile(r'^extern "C" void (kernel\d+)\(', re.M)


def _layer(x: T, w: T, b: T, g: T) -> T:
    """A pre-norm MLP block: layer norm with its own weight, a matmul (an aten call that
    ends the kernel), GELU and the residual."""
    h = F.layer_norm(x, x.shape[-1:], g, b)
    return x + F.gelu(h @ w, approximate="tanh")


def _params(width: int, dtype: torch.dtype, seed: int) -> list[T]:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(width, width, generator=gen) / width**0.5
    g, b = torch.randn(width, generator=gen), torch.randn(width, generator=gen)
    return [t.to(dtype) for t in (w, b, g)]


def _stack(x: T, *params: T) -> T:
    for k in range(0, len(params), 3):
        x = _layer(x.to(params[k].dtype), *params[k : k + 3])
    return x


def _compiled(fn: Callable[..., Any], args: list[T]) -> Any:
    gm = make_fx(fn, decomposition_table=decompositions())(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to aten
        return compile_graph(gm, args, {"graph_cache": 0})


def _kernels(source: str) -> tuple[list[str], dict[str, str]]:
    """Every kernel's name, and each aliased kernel -> the kernel whose body it runs."""
    return KERNEL.findall(source), dict(ALIAS.findall(source))


def test_repeated_layers_share_one_kernel_each() -> None:
    """Six identical layers, each with its own parameters: the middle layers' kernels are
    aliases of one body (they differ only in the names of the parameters and buffers they
    touch; the first and last layers read the graph's input or write its output, so their
    pointers differ in ``__restrict__``), and the compiled stack equals eager."""
    x = torch.randn(4, 8, 32)
    params = [p for k in range(6) for p in _params(32, torch.float32, k)]
    c = _compiled(_stack, [x, *params])
    names, aliases = _kernels(c.source)
    bodies = [n for n in names if n not in aliases]
    assert len(aliases) >= 3, f"the layers' kernels were not shared: {names}"
    assert len(bodies) <= len(names) - 3
    torch.testing.assert_close(c(x, *params), _stack(x, *params))


def test_layers_of_other_widths_or_dtypes_keep_their_kernels() -> None:
    """Layers that differ in width or dtype compute other loops: no kernel of one is an
    alias of a kernel of the other, and each result equals eager's."""
    x = torch.randn(4, 8, 32)
    widths = _params(32, torch.float32, 0) + _params(32, torch.float32, 1)
    widths[3] = torch.randn(32, 48) / 32**0.5  # the second layer widens to 48
    widths[4:6] = [torch.randn(48), torch.randn(48)]

    def wider(x: T, *p: T) -> T:
        h = _layer(x, *p[:3])
        return F.layer_norm(h @ p[3], (48,), p[5], p[4]).relu()

    dtypes = _params(32, torch.float32, 0) + _params(32, torch.float64, 1)
    for fn, params in ((wider, widths), (_stack, dtypes)):
        c = _compiled(fn, [x, *params])
        names, aliases = _kernels(c.source)
        assert not aliases, f"kernels over other shapes or dtypes shared a body: {aliases}"
        assert len(names) >= 2
        # float32 tolerances: the float64 layer carries the float32 layer's rounding
        torch.testing.assert_close(c(x, *params), fn(x, *params), rtol=1e-4, atol=1e-5)


def test_restage_derives_each_loop_order_once(monkeypatch: Any) -> None:
    """``restage`` asked for every pointwise node's loop order once per reduction (24 s of a
    12-layer GPT-2's compile); now once per node, however many reductions share rows."""
    x = torch.randn(64, 128).t()  # rows across memory: softmax's reductions get restaged

    def softmaxes(x: T) -> T:
        for _ in range(6):
            x = torch.softmax(x, -1) * 2 + x
        return x

    prog = lower_graph(make_fx(softmaxes, decomposition_table=decompositions())(x), [x])
    calls = []
    real = restage_module.pick_order
    monkeypatch.setattr(restage_module, "pick_order", lambda p, n: calls.append(n) or real(p, n))
    restage_module.restage(prog)
    assert len(calls) <= len(prog.nodes), f"{len(calls)} loop orders for {len(prog.nodes)} nodes"
