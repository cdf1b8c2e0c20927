"""Real image models from diffusers, captured whole and compared with eager.

Tiny random-init models built from configs (``benchmarks/models/diffusion.py``, float32,
2 images 16x16; nothing is downloaded): a UNet (timestep embedding, convolutions, group
norm, attention, up/down-sampling) and a VAE. Library code asks ``torch.is_tensor`` of the
timestep and reads the model's dtype through ``self.parameters()``; each forward must
still be one graph with no break under ``fullgraph=True``, outputs and gradients as eager's.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember.compiler

models = pytest.importorskip(
    "models.diffusion", reason="benchmarks/ is on the path in the repository"
)
if models.missing() is not None:
    pytest.skip(models.missing(), allow_module_level=True)

NAMES = sorted(models.DIFFUSION_MODELS)


@pytest.mark.parametrize("name", NAMES)
def test_inference_is_one_graph_and_matches_eager(name):
    program, inputs = models.DIFFUSION_MODELS[name].make(quick=True)
    program.eval()
    with torch.no_grad():
        expected = program(*inputs)
        compiled = ember.compiler.compile(program, backend="inductor", fullgraph=True)
        for _ in range(2):  # the second call is served by the cache
            got = compiled(*inputs)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert compiled.stats.graphs == 1
    assert not compiled.stats.breaks and not compiled.stats.failures


def test_a_python_number_timestep_takes_eagers_branch():
    """``UNet2DModel`` wraps a non-tensor timestep in a tensor (``torch.is_tensor``)."""
    program, (x, _) = models.DIFFUSION_MODELS["unet"].make(quick=True)
    program.eval()
    with torch.no_grad():
        compiled = ember.compiler.compile(program, backend="eager", fullgraph=True)
        torch.testing.assert_close(compiled(x, 10), program(x, 10))
        torch.testing.assert_close(compiled(x, torch.tensor(10)), program(x, torch.tensor(10)))


@pytest.mark.parametrize("name", NAMES)
def test_explain_reports_one_graph_no_break(name):
    program, inputs = models.DIFFUSION_MODELS[name].make(quick=True)
    program.eval()
    with torch.no_grad():
        report = ember.compiler.explain(program)(*inputs)
    assert report.graph_count == 1 and report.graph_break_count == 0, str(report)


def _step(program, inputs, target):
    program.zero_grad(set_to_none=True)
    loss = F.mse_loss(program(*inputs), target)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in program.named_parameters() if p.grad is not None}


@pytest.mark.slow
@pytest.mark.parametrize(("name", "backend"), [("unet", "inductor"), ("vae", "aot_eager")])
def test_training_step_matches_eager_loss_and_gradients(name, backend):
    spec = models.DIFFUSION_MODELS[name]
    program, inputs = spec.make(quick=True)
    program.train()
    target = spec.targets(quick=True)
    expected_loss, expected_grads = _step(program, inputs, target)

    compiled = ember.compiler.compile(program, backend=backend, fullgraph=True)
    loss, grads = _step(compiled, inputs, target)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-4, atol=1e-5)
    assert grads.keys() == {f"_orig_mod.{k}" for k in expected_grads}  # named as torch does
    for key, grad in expected_grads.items():
        torch.testing.assert_close(grads[f"_orig_mod.{key}"], grad, rtol=1e-3, atol=1e-5, msg=key)
    assert compiled.stats.graphs == 1 and not compiled.stats.breaks
