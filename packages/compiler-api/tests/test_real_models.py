"""Real models from transformers, captured whole and compared with eager.

Tiny random-init models built from configs (``benchmarks/models/hf.py``, float32,
batch 2, 16 tokens; nothing is downloaded). Each forward must be one graph with no
break, as under ``torch.compile``, under ``fullgraph=True``; ``explain()`` must say
so; outputs match eager, and for training the loss and every parameter's gradient.
"""

from __future__ import annotations

import pytest
import torch

import ember.compiler

models = pytest.importorskip("models.hf", reason="benchmarks/ is on the path in the repository")
if models.missing() is not None:
    pytest.skip(models.missing(), allow_module_level=True)

HF_MODELS = models.HF_MODELS
NAMES = ["gpt2", "bert", "llama", "t5", "vit"]


@pytest.fixture(autouse=True)
def fresh():
    ember.compiler.reset()
    yield
    ember.compiler.reset()


def _logits(out):
    return out.logits


@pytest.mark.parametrize("name", NAMES)
def test_inference_is_one_graph_and_matches_eager(name):
    model, inputs = HF_MODELS[name].make(quick=True)
    model.eval()
    with torch.no_grad():
        expected = model(**inputs)
        compiled = ember.compiler.compile(model, backend="inductor", fullgraph=True)
        for _ in range(2):  # the second call is served by the cache
            got = compiled(**inputs)
    assert type(got) is type(expected)
    assert list(got.keys()) == list(expected.keys())
    for key in expected.keys():
        torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=1e-5)
    assert compiled.stats.graphs == 1
    assert not compiled.stats.breaks and not compiled.stats.failures


@pytest.mark.parametrize("name", NAMES)
def test_explain_reports_one_graph_no_break(name):
    model, inputs = HF_MODELS[name].make(quick=True)
    model.eval()
    with torch.no_grad():
        report = ember.compiler.explain(model)(**inputs)
    assert report.graph_count == 1 and report.graph_break_count == 0, str(report)
    assert "Graph count: 1" in str(report)


def _step(model, inputs, targets):
    model.zero_grad(set_to_none=True)
    loss = models.loss(model(**inputs), targets)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_training_step_matches_eager_loss_and_gradients(name, backend):
    spec = HF_MODELS[name]
    model, inputs = spec.make(quick=True)
    model.train()
    targets = spec.targets(spec.sizes(quick=True))
    expected_loss, expected_grads = _step(model, inputs, targets)

    compiled = ember.compiler.compile(model, backend=backend, fullgraph=True)
    loss, grads = _step(compiled, inputs, targets)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-4, atol=1e-5)
    assert grads.keys() == expected_grads.keys()
    for key, grad in expected_grads.items():
        torch.testing.assert_close(grads[key], grad, rtol=1e-3, atol=1e-5, msg=key)
    assert compiled.stats.graphs == 1 and not compiled.stats.breaks
