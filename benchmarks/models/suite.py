"""Models of the benchmark suite that the zoo does not have, at benchmark sizes.

The zoo (``models.ZOO``) pins small models for the tests; the benchmark
runner (``benchmarks/run.py``) reuses its classes at larger sizes and adds
what is here: two plain functions (a pointwise chain, softmax + layer norm),
a GPT-style decoder and a BERT-style encoder without dropout (so that a
training step is deterministic and comparable with eager), and a program
with deliberate graph breaks. None of these is in ``ZOO``.

>>> model = Encoder(vocab=50, dim=16, layers=1, heads=2, context=8)
>>> tokens, mask = torch.randint(0, 50, (2, 8)), torch.ones(2, 8, dtype=torch.bool)
>>> tuple(model(tokens, mask).shape)
(2, 2)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models import Block

__all__ = [
    "BreakingNet",
    "Decoder",
    "Encoder",
    "pointwise_chain",
    "softmax_layernorm",
]


def pointwise_chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Seventeen elementwise ops; eager materialises every intermediate (a fusion target).

    >>> pointwise_chain(torch.zeros(2), torch.zeros(2))
    tensor([0., 0.])
    """
    a = torch.sin(x) * torch.cos(y)
    b = torch.sigmoid(a + y) * 2.0 - 1.0
    c = torch.relu(b - x * 0.5) + torch.tanh(y)
    return c * torch.exp(-(a * a))


def softmax_layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Scaled softmax over the last dimension, a residual, then layer norm (two reductions).

    >>> tuple(softmax_layernorm(torch.randn(2, 4), torch.ones(4), torch.zeros(4)).shape)
    (2, 4)
    """
    probs = torch.softmax(x * (x.shape[-1] ** -0.5), dim=-1)
    return F.layer_norm(x + probs, x.shape[-1:], weight, bias, eps=1e-5)


class Decoder(nn.Module):
    """A GPT-style decoder: token and position embeddings, causal pre-norm blocks, LM head."""

    def __init__(
        self, vocab: int = 512, dim: int = 128, layers: int = 4, heads: int = 4, context: int = 64
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout=0.0) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class EncoderLayer(nn.Module):
    """A post-norm BERT layer: bidirectional attention under a padding mask, GELU MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.ln1 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.ln2 = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])
        x = self.ln1(x + self.out(attn.transpose(1, 2).reshape(b, t, c)))
        return self.ln2(x + self.ff(x))


class Encoder(nn.Module):
    """A BERT-style encoder: token, position and segment embeddings, layers, pooler, classifier."""

    def __init__(
        self,
        vocab: int = 1000,
        dim: int = 128,
        layers: int = 4,
        heads: int = 4,
        context: int = 64,
        classes: int = 2,
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.seg = nn.Embedding(2, dim)
        self.ln = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(EncoderLayer(dim, heads) for _ in range(layers))
        self.pool = nn.Linear(dim, dim)
        self.cls = nn.Linear(dim, classes)

    def forward(self, idx: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        segments = (torch.arange(t, device=idx.device) >= t // 2).long()
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device)) + self.seg(segments)
        x = self.ln(x)
        for layer in self.layers:
            x = layer(x, keep)
        return self.cls(torch.tanh(self.pool(x[:, 0])))


class BreakingNet(nn.Module):
    """A program with deliberate graph breaks: a data-dependent branch and a trip to Python.

    ``item()`` reads a tensor's value on the host and ``if`` branches on it;
    ``tolist()`` leaves torch for a Python computation whose result scales the
    output. A tracer must break the graph at each (or run the frame eagerly).
    """

    def __init__(self, dim: int = 256, hidden: int = 512) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(dim, hidden), nn.GELU())
        self.mid = nn.Linear(hidden, hidden)
        self.dec = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.enc(x)
        if h.mean().item() > 0.0:  # break 1: a branch on a tensor's value
            h = torch.tanh(self.mid(h))
        else:
            h = torch.relu(self.mid(h))
        scales = h.amax(dim=1).tolist()  # break 2: leave torch for plain Python
        scale = 1.0 / (1.0 + max(scales) - min(scales))
        return self.dec(h) * scale
