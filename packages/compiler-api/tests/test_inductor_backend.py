"""The ``inductor`` backend end to end: capture -> aotgraph -> generated C++ kernels.

The model zoo in training and inference, and optimizer steps, against eager within
tolerance (fused kernels reassociate float arithmetic, so results are close, not
bit-identical); programs with graph breaks and float graph inputs stay correct.
"""

from __future__ import annotations

import pytest
import torch
from models import ZOO
from models.suite import BreakingNet

import ember.compiler

RTOL, ATOL = 1e-4, 1e-5
GRAD_TOL = {"rtol": 1e-3, "atol": 1e-4}


def _pair(name: str) -> tuple[torch.nn.Module, torch.nn.Module, tuple]:
    model, args = ZOO[name].make(0)
    reference, _ = ZOO[name].make(0)
    return model, reference, args


def _flat(out):
    return list(out.values()) if isinstance(out, dict) else [out]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_forward_and_backward_match_eager(name):
    model, reference, args = _pair(name)
    compiled = ember.compiler.compile(model, backend="inductor")
    torch.manual_seed(7)
    got = _flat(compiled(*args))
    torch.manual_seed(7)
    want = _flat(reference(*args))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL)
    sum(g.float().sum() for g in got).backward()
    sum(w.float().sum() for w in want).backward()
    for (key, p), (_, q) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
        if q.grad is None:
            assert p.grad is None, key
        else:
            torch.testing.assert_close(p.grad, q.grad, msg=key, **GRAD_TOL)
    assert compiled.stats.failures == [] and compiled.stats.graphs == 1
    for key, value in reference.state_dict().items():  # BatchNorm running statistics
        torch.testing.assert_close(model.state_dict()[key], value, msg=key, **GRAD_TOL)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "cnn-train"])
def test_sgd_steps_match_eager(name):
    model, reference, args = _pair(name)
    compiled = ember.compiler.compile(model, backend="inductor")
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (model, reference)]
    for _ in range(5):
        for module, opt in zip((compiled, reference), opts, strict=True):
            opt.zero_grad()
            module(*args).square().mean().backward()
            opt.step()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, **GRAD_TOL)


def test_inference_under_no_grad_and_graph_breaks_with_float_inputs(capsys):
    torch.manual_seed(0)
    model = BreakingNet(32, 64)
    compiled = ember.compiler.compile(model, backend="inductor")
    x = torch.randn(8, 32)
    with torch.no_grad():
        for scale in (1.0, 2.0, -3.0):  # new floats reach the resume functions each call
            torch.testing.assert_close(compiled(x * scale), model(x * scale), rtol=RTOL, atol=ATOL)
    assert len(compiled.stats.breaks) == 2 and compiled.stats.failures == []


def test_dropout_fused_into_kernels_trains_consistently():
    """fallback_random=False: the mask comes from ember's generator, the same in both passes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.3), torch.nn.ReLU())
    compiled = ember.compiler.compile(model, options={"fallback_random": False})
    x = torch.randn(8, 16)
    torch.manual_seed(1)
    out = compiled(x)
    out.sum().backward()
    assert compiled.stats.graphs == 1 and compiled.stats.failures == []
    hidden = torch.nn.functional.linear(x, model[0].weight, model[0].bias)
    kept = out != 0  # where the output survived both dropout and relu
    torch.testing.assert_close(out[kept], (hidden / 0.7)[kept])
    # d out / d bias: 1/0.7 where kept, summed over the batch
    torch.testing.assert_close(model[0].bias.grad, kept.float().sum(0) / 0.7)
    torch.manual_seed(1)
    model.zero_grad()
    torch.testing.assert_close(compiled(x), out)  # repeatable under the same seed
