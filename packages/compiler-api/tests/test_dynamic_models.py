"""Dynamic shapes on real models (issue 18): tiny random-init transformers models, one
compiled object per varied dimension, ten batch sizes or ten sequence lengths.
``dynamic=True`` makes one graph, the default (automatic dynamic) at most two, and every
result equals eager's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import ember.compiler

models = pytest.importorskip("models.hf", reason="benchmarks/ is on the path in the repository")
if models.missing() is not None:
    pytest.skip(models.missing(), allow_module_level=True)

BATCHES = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
LENGTHS = [4, 6, 8, 10, 12, 14, 16, 18, 20, 22]  # even: T5's decoder (length // 2) varies too
CASES = [(n, "batch") for n in ["gpt2", "bert", "llama", "t5", "vit"]] + [
    (n, "seq")
    for n in ["gpt2", "bert", "llama", "t5"]  # ViT's image size is fixed
]


@pytest.fixture(autouse=True)
def _fresh():
    ember.compiler.reset()
    yield
    ember.compiler.reset()


# (backend, dynamic, most graphs)
POLICIES = [
    ("eager", True, 1), ("eager", None, 2), ("aot_eager", True, 1), ("aot_eager", None, 2),
    ("inductor", True, 1), ("inductor", None, 2),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "dynamic", "most"), POLICIES)
@pytest.mark.parametrize(("name", "dim"), CASES)
def test_a_sweep_compiles_once_or_twice_and_matches_eager(backend, name, dim, dynamic, most):
    spec = models.HF_MODELS[name]
    model, _ = spec.make(quick=True)
    model.eval()
    base = spec.sizes(True)
    if dim == "seq":  # positions for the longest length
        model = _long_model(spec, max(LENGTHS))
    compiled = ember.compiler.compile(model, backend=backend, dynamic=dynamic)
    for n in BATCHES if dim == "batch" else LENGTHS:
        torch.manual_seed(n)
        inputs = spec.inputs(dataclasses.replace(base, **{dim: n}))
        with torch.no_grad():
            got, want = compiled(**inputs), model(**inputs)
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-5)
    assert not compiled.stats.failures and not compiled.stats.breaks
    assert compiled.stats.graphs <= most


def _long_model(spec, seq):
    torch.manual_seed(0)
    config = spec.config(dataclasses.replace(spec.sizes(True), seq=seq))
    config._attn_implementation = models.ATTENTION
    return getattr(models._transformers(), spec.model_class)(config).eval()


# (batch, length) in a row: both dimensions vary on one object, size 1 among them
BOTH = [(2, 4), (3, 4), (3, 6), (1, 6), (2, 1), (4, 8), (1, 1), (5, 7), (2, 10)]


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_a_sweep_of_both_dimensions_needs_no_more_graphs_than_torch_compile(name, dynamic):
    from torch._dynamo.utils import counters

    spec = models.HF_MODELS[name]
    model = _long_model(spec, 16)
    torch._dynamo.reset()
    counters.clear()
    compiled = ember.compiler.compile(model, backend="eager", dynamic=dynamic)
    peer = torch.compile(model, backend="eager", dynamic=dynamic)
    with torch.no_grad():
        for batch, seq in BOTH:
            torch.manual_seed(batch * 100 + seq)
            inputs = spec.inputs(dataclasses.replace(spec.sizes(True), batch=batch, seq=seq))
            got, want = compiled(**inputs), model(**inputs)
            torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-5)
            peer(**inputs)
    torch._dynamo.reset()
    assert not compiled.stats.failures and not compiled.stats.breaks
    # sizes 1 specialise in both, so each 1 costs a graph; measured 6 (None) and 4 (True)
    assert 0 < compiled.stats.graphs <= counters["stats"]["unique_graphs"]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "backend"), [("gpt2", "eager"), ("llama", "eager"),
                                               ("gpt2", "inductor")])  # fmt: skip
def test_generate_16_tokens_recompiles_at_most_twice(name, backend):
    spec = models.HF_MODELS[name]
    model = _long_model(spec, 32)
    ids = spec.inputs(spec.sizes(True))["input_ids"][:, :6]
    mask = torch.ones_like(ids)
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, max_new_tokens=16, min_new_tokens=16,
                              do_sample=False, pad_token_id=0)  # fmt: skip
        model.forward = ember.compiler.compile(model.forward, backend=backend)
        got = model.generate(ids, attention_mask=mask, max_new_tokens=16, min_new_tokens=16,
                             do_sample=False, pad_token_id=0)  # fmt: skip
    assert torch.equal(got, want) and got.shape[1] == 22
    assert model.forward.stats.graphs <= 2  # the prompt, then one graph for every step
    assert not model.forward.stats.failures and not model.forward.stats.breaks


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_training_gradients_match_eager_over_a_batch_sweep(name):
    spec = models.HF_MODELS[name]
    model, _ = spec.make(quick=True)
    model.eval()  # no dropout: the same numbers both ways; gradients still flow
    compiled = ember.compiler.compile(model, backend="aot_eager", dynamic=True)
    for n in [2, 3, 5, 8]:
        torch.manual_seed(n)
        inputs = spec.inputs(dataclasses.replace(spec.sizes(True), batch=n))
        grads = []
        for run in (compiled, model):
            model.zero_grad(set_to_none=True)
            run(**inputs).logits.square().mean().backward()
            grads.append(
                {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
            )
        assert grads[0].keys() == grads[1].keys()
        for key in grads[1]:
            torch.testing.assert_close(grads[0][key], grads[1][key], rtol=1e-4, atol=1e-5)
    assert compiled.stats.graphs == 1
    assert not compiled.stats.failures and not compiled.stats.breaks


# -- the model zoo (benchmarks/models/suite.py) ---------------------------------------------

from models import ZOO  # noqa: E402  (benchmarks/ is on the path, as for models.hf)

# (case, dim varied in every tensor argument): the batch everywhere, sequence lengths too.
# Not the RNN's length: its Python loop runs once per step, unrolled, so each length is a
# graph of its own (as under torch.compile); its batch is symbolic.
ZOO_CASES = [(name, 0) for name in sorted(ZOO)] + [("transformer-block", 1), ("gpt", 1)]


def resized(args, dim, n):
    """``args`` with size ``dim`` of every tensor made ``n`` (new values, the same kind)."""
    out = []
    for a in args:
        shape = list(a.shape)
        shape[dim] = n
        if a.dtype.is_floating_point:
            out.append(torch.randn(shape))
        else:
            out.append(torch.randint(0, int(a.max()) + 1, shape, dtype=a.dtype))
    return tuple(out)


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "dynamic", "most"), POLICIES)
@pytest.mark.parametrize(("name", "dim"), ZOO_CASES)
def test_the_zoo_over_a_size_sweep(backend, name, dim, dynamic, most):
    model, args = ZOO[name].make()
    compiled = ember.compiler.compile(model, backend=backend, dynamic=dynamic)
    for n in range(2, 12):
        sized = resized(args, dim, n)
        torch.manual_seed(n)
        want = model(*sized)
        torch.manual_seed(n)
        got = compiled(*sized)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not compiled.stats.failures and not compiled.stats.breaks, compiled.stats.failures
    assert compiled.stats.graphs <= most
