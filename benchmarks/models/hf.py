"""Tiny HuggingFace transformers models, random-init from configs (no weights downloaded).

One copy for the benchmarks (``benchmarks/workloads.py``), the demo and the
real-model tests (``packages/compiler-api/tests``): each :class:`HFModel`
builds a model and its inputs at two sizes (``quick`` for tests and smoke
runs), and says which targets its training loss compares the logits with.
transformers is a test and benchmark dependency only (pinned in
``ci/constraints.txt``); :func:`missing` says why these models cannot be
built when it is not installed.

Every model uses PyTorch's ``scaled_dot_product_attention`` (``"sdpa"``),
what transformers picks by default and what torch.compile users get. Dropout
is 0 and the key/value cache is off (no generation here), so a compiled run
is comparable with eager's step by step.

>>> if missing() is None:  # transformers is installed
...     model, inputs = HF_MODELS["llama"].make(quick=True)
...     print(type(model).__name__, sorted(inputs), tuple(model(**inputs).logits.shape))
... else:
...     print("LlamaForCausalLM ['attention_mask', 'input_ids'] (2, 16, 64)")
LlamaForCausalLM ['attention_mask', 'input_ids'] (2, 16, 64)
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models import not_installed

__all__ = ["ATTENTION", "HF_MODELS", "HFModel", "missing"]

# The attention transformers runs: torch's SDPA kernel, its default since torch 2.1.
ATTENTION = "sdpa"

Inputs = dict[str, torch.Tensor]


def missing() -> str | None:
    """Why the models cannot be built (transformers not installed), or None if they can."""
    return not_installed("transformers", "transformers einops")


@dataclass(frozen=True)
class Sizes:
    """One model's sizes: batch, tokens (or image side), width, layers, heads, vocab/classes."""

    batch: int
    seq: int
    hidden: int
    layers: int
    heads: int
    vocab: int  # tokens, or classes for a classifier


@dataclass(frozen=True)
class HFModel:
    """A transformers model class and config at two sizes, its inputs and training targets."""

    name: str
    model_class: str  # a name in the transformers namespace
    config: Callable[[Sizes], Any]  # sizes -> a transformers config
    inputs: Callable[[Sizes], Inputs]  # sizes -> keyword arguments of forward
    targets: Callable[[Sizes], torch.Tensor]  # sizes -> class indices the logits are scored on
    full: Sizes
    quick: Sizes

    def sizes(self, quick: bool) -> Sizes:
        return self.quick if quick else self.full

    def about(self) -> str:
        s = self.full
        batch = (
            f"{s.batch} images {s.seq}x{s.seq}"
            if self.inputs is _images
            else f"{s.batch}x{s.seq} tokens"
        )
        return f"{self.model_class}: {s.layers} layers, hidden {s.hidden}, {s.heads} heads; {batch}"

    def build(self, quick: bool = False) -> nn.Module:
        """A random-init model (the caller seeds torch), attention set to :data:`ATTENTION`."""
        config = self.config(self.sizes(quick))
        config._attn_implementation = ATTENTION
        model: nn.Module = getattr(_transformers(), self.model_class)(config)
        return model

    def make(self, quick: bool = False, seed: int = 0) -> tuple[nn.Module, Inputs]:
        """``(model, inputs)`` built from ``seed``: call ``model(**inputs)``."""
        torch.manual_seed(seed)
        model = self.build(quick)
        return model, self.inputs(self.sizes(quick))


def loss(out: Any, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of a transformers output's logits against class indices."""
    logits: torch.Tensor = out.logits
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


def _tokens(s: Sizes) -> Inputs:
    return {"input_ids": torch.randint(0, s.vocab, (s.batch, s.seq))}


def _padded(s: Sizes) -> Inputs:
    """Tokens and an attention mask with each row padded after a random length (≥ half)."""
    lengths = torch.randint(s.seq // 2, s.seq + 1, (s.batch, 1))
    mask = (torch.arange(s.seq)[None, :] < lengths).long()
    return {**_tokens(s), "attention_mask": mask}


def _seq2seq(s: Sizes) -> Inputs:
    decoder = torch.randint(0, s.vocab, (s.batch, s.seq // 2))
    return {**_padded(s), "decoder_input_ids": decoder}


def _images(s: Sizes) -> Inputs:
    return {"pixel_values": torch.randn(s.batch, 3, s.seq, s.seq)}


def _transformers() -> Any:
    return importlib.import_module("transformers")


def _gpt2(s: Sizes) -> Any:
    return _transformers().GPT2Config(
        vocab_size=s.vocab, n_positions=s.seq, n_embd=s.hidden, n_layer=s.layers,
        n_head=s.heads, bos_token_id=0, eos_token_id=0,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
    )  # fmt: skip


def _bert(s: Sizes) -> Any:
    return _transformers().BertConfig(
        vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
        num_attention_heads=s.heads, intermediate_size=4 * s.hidden,
        max_position_embeddings=s.seq, num_labels=2,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip


def _llama(s: Sizes) -> Any:
    return _transformers().LlamaConfig(
        vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=4 * s.hidden,
        num_hidden_layers=s.layers, num_attention_heads=s.heads,
        num_key_value_heads=max(1, s.heads // 2), max_position_embeddings=s.seq,
        bos_token_id=0, eos_token_id=1, pad_token_id=None,
        attention_dropout=0.0, use_cache=False,
    )  # fmt: skip


def _t5(s: Sizes) -> Any:
    return _transformers().T5Config(
        vocab_size=s.vocab, d_model=s.hidden, d_kv=s.hidden // s.heads, d_ff=4 * s.hidden,
        num_layers=s.layers, num_heads=s.heads, decoder_start_token_id=0, pad_token_id=0,
        eos_token_id=1, dropout_rate=0.0, use_cache=False,
    )  # fmt: skip


def _vit(s: Sizes) -> Any:
    return _transformers().ViTConfig(
        image_size=s.seq, patch_size=s.seq // 4, hidden_size=s.hidden,
        num_hidden_layers=s.layers, num_attention_heads=s.heads,
        intermediate_size=4 * s.hidden, num_labels=s.vocab,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip


def _next_tokens(s: Sizes) -> torch.Tensor:
    return torch.randint(0, s.vocab, (s.batch, s.seq))


def _decoder_tokens(s: Sizes) -> torch.Tensor:
    return torch.randint(0, s.vocab, (s.batch, s.seq // 2))


def _classes(count: Callable[[Sizes], int]) -> Callable[[Sizes], torch.Tensor]:
    return lambda s: torch.randint(0, count(s), (s.batch,))


HF_MODELS: dict[str, HFModel] = {
    m.name: m
    for m in [
        HFModel("gpt2", "GPT2LMHeadModel", _gpt2, _tokens, _next_tokens,
                Sizes(2, 64, 128, 2, 4, 512), Sizes(2, 16, 32, 2, 2, 64)),
        HFModel("bert", "BertForSequenceClassification", _bert, _padded,
                _classes(lambda s: 2), Sizes(2, 64, 128, 2, 4, 1000), Sizes(2, 16, 32, 2, 2, 64)),
        HFModel("llama", "LlamaForCausalLM", _llama, _padded, _next_tokens,
                Sizes(2, 64, 128, 2, 4, 512), Sizes(2, 16, 32, 2, 2, 64)),
        HFModel("t5", "T5ForConditionalGeneration", _t5, _seq2seq, _decoder_tokens,
                Sizes(2, 64, 128, 2, 4, 512), Sizes(2, 16, 32, 2, 2, 64)),
        HFModel("vit", "ViTForImageClassification", _vit, _images, _classes(lambda s: s.vocab),
                Sizes(4, 32, 128, 2, 4, 10), Sizes(2, 16, 32, 2, 2, 10)),
    ]
}  # fmt: skip
