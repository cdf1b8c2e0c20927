"""The model zoo, forward and backward, traced to aten graphs with make_fx, against eager."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from models import ZOO
from torch import nn
from torch.func import functional_call
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph

TOL = {"atol": 1e-4, "rtol": 1e-4}


def _model(name: str) -> tuple[nn.Module, tuple[Any, ...]]:
    model, args = ZOO[name].make()
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0  # random masks are torch's generator's business, not the compiler's
    return model, args


def _printed_by(compiled: Any, options: Any) -> None:
    """Under the Triton options, the Triton printer took the graph (no fallback to C++)."""
    if options is not None:
        assert compiled.target is not None and compiled.target.printer == "triton"


@pytest.mark.parametrize("name", sorted(ZOO))
def test_forward(name: str, options: Any) -> None:
    model, args = _model(name)
    with torch.no_grad():
        gm = make_fx(model)(*args)
        compiled = compile_graph(gm, list(args), options)
        torch.testing.assert_close(compiled(*args), model(*args), **TOL)
    _printed_by(compiled, options)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "cnn-train", "transformer-block", "gpt", "helpers"])
def test_backward(name: str, options: Any) -> None:
    model, args = _model(name)
    params = dict(model.named_parameters())
    names = list(params)

    def step(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ps = dict(zip(names, flat[: len(names)], strict=True))
        out = functional_call(model, ps, flat[len(names) :])
        loss = sum(o.float().pow(2).mean() for o in torch.utils._pytree.tree_leaves(out))
        return (loss, *torch.autograd.grad(loss, list(ps.values())))

    inputs = [p.detach().requires_grad_() for p in params.values()] + list(args)
    gm = make_fx(step)(*inputs)
    compiled = compile_graph(gm, [t.detach() for t in inputs], options)
    _printed_by(compiled, options)
    got = compiled(*[t.detach() for t in inputs])
    want = step(*inputs)
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "cnn-train"])
def test_as_aotgraph_compiler(name: str) -> None:
    """compile_graph as the forward and backward compiler of ember.aotgraph."""
    from ember.aotgraph import aot_compile

    model, args = _model(name)
    reference, _ = _model(name)
    compiled = aot_compile(
        torch.fx.symbolic_trace(model),
        list(args),
        fw_compiler=compile_graph,
        bw_compiler=compile_graph,
    )

    def loss_and_grads(fn: Any, module: nn.Module) -> tuple[Any, ...]:
        out = fn(*args)
        loss = sum(o.pow(2).mean() for o in torch.utils._pytree.tree_leaves(out))
        return (out, *torch.autograd.grad(loss, list(module.parameters())))

    torch.testing.assert_close(
        loss_and_grads(compiled, model), loss_and_grads(reference, reference), **TOL
    )
    for a, b in zip(model.buffers(), reference.buffers(), strict=True):  # BatchNorm statistics
        torch.testing.assert_close(a, b, **TOL)
