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


@pytest.mark.parametrize("name", ["gpt2", "llama", "t5"])
def test_with_the_key_value_cache_on_still_one_graph(name):
    """With ``use_cache`` on, the forward builds a cache object (T5's copies its legacy
    config with ``copy.deepcopy`` first) and returns it: made in the trace, rebuilt after."""
    model, inputs = HF_MODELS[name].make(quick=True)
    model.eval()
    with torch.no_grad():
        expected = model(**inputs, use_cache=True)
        compiled = ember.compiler.compile(model, backend="eager", fullgraph=True)
        got = compiled(**inputs, use_cache=True)
    torch.testing.assert_close(got.logits, expected.logits)
    assert expected.past_key_values is not None
    assert type(got.past_key_values) is type(expected.past_key_values)
    assert got.past_key_values.get_seq_length() == expected.past_key_values.get_seq_length()
    assert compiled.stats.graphs == 1


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
    assert grads.keys() == {f"_orig_mod.{k}" for k in expected_grads}  # named as torch does
    for key, grad in expected_grads.items():
        torch.testing.assert_close(grads[f"_orig_mod.{key}"], grad, rtol=1e-3, atol=1e-5, msg=key)
    assert compiled.stats.graphs == 1 and not compiled.stats.breaks


@pytest.mark.parametrize("backend", ["eager", pytest.param("aot_eager", marks=pytest.mark.slow)])
def test_generate_with_compiled_forward_gives_eagers_tokens(backend):
    """Greedy decoding with a key/value cache (a DynamicCache mutated by every forward).

    A backend that takes symbolic sizes compiles the prefill, then one graph for every
    further token (automatic dynamic); the others compile once per cache length, each
    forward captured whole.
    """
    model, inputs = HF_MODELS["llama"].make(quick=True)
    model.config.use_cache = True
    model.generation_config.pad_token_id = 0
    model.eval()
    ids = inputs["input_ids"]
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=6, do_sample=False)
        model.forward = ember.compiler.compile(model.forward, backend=backend)
        got = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(got, expected)
    stats = model.forward.stats
    graphs = 2 if ember.compiler.backends.automatic_dynamic(backend) else 6
    assert stats.graphs == graphs and not stats.breaks and not stats.failures


# -- einops -----------------------------------------------------------------------------------

einops = pytest.importorskip("einops")


class _EinopsBlock(torch.nn.Module):
    """Patches in, attention with einops' functions, packing, layers and reductions."""

    def __init__(self):
        super().__init__()
        from einops.layers.torch import Rearrange, Reduce

        self.proj = torch.nn.Linear(16, 48)
        self.to_tokens = Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=2, p2=2)
        self.pool = Reduce("b n d -> b d", "mean")

    def forward(self, img):
        from einops import einsum, pack, rearrange, reduce, repeat, unpack

        x = self.to_tokens(img)
        q, k, v = rearrange(self.proj(x), "b n (three h d) -> three b h n d", three=3, h=2)
        attention = einsum(q, k, "b h i d, b h j d -> b h i j").softmax(-1)
        out = rearrange(einsum(attention, v, "b h i j, b h j d -> b h i d"), "b h n d -> b n (h d)")
        packed, shapes = pack([out, x[..., :8]], "b n *")
        a, b = unpack(packed, shapes, "b n *")
        y = repeat(self.pool(a), "b d -> b r d", r=2)
        return reduce(y, "b r d -> b d", "max") + b.sum()


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_einops_functions_and_layers_are_one_graph(backend):
    torch.manual_seed(0)
    model = _EinopsBlock()
    img = torch.randn(2, 4, 8, 8, requires_grad=True)
    compiled = ember.compiler.compile(model, backend=backend, fullgraph=True)
    got = compiled(img)
    got.sum().backward()
    grad, img.grad = img.grad, None
    expected = model(img)
    expected.sum().backward()
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(grad, img.grad)
    assert compiled.stats.graphs == 1 and not compiled.stats.breaks
    graph = compiled.stats.compiled[0].graph
    ops = {getattr(n.target, "__name__", "") for n in graph.graph.nodes}
    assert {"rearrange", "einsum", "pack", "unpack", "repeat", "reduce"} <= ops


def test_einops_pattern_and_axis_lengths_are_guarded():
    from einops import rearrange

    def split_heads(x, pattern, heads):
        return rearrange(x, pattern, h=heads) * 2

    compiled = ember.compiler.compile(split_heads, backend="eager")
    x = torch.randn(2, 5, 12)
    for pattern, heads in [("b n (h d) -> b h n d", 3), ("b n (h d) -> b h n d", 4),
                           ("b n (h d) -> b n d h", 4), ("b n (h d) -> b h n d", 3)]:  # fmt: skip
        torch.testing.assert_close(compiled(x, pattern, heads), split_heads(x, pattern, heads))
    assert compiled.stats.graphs == 3  # the repeated first case is served from the cache
