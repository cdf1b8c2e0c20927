"""ember's model zoo: small but real models used by the tests, the demo and the benchmarks.

Each :class:`Case` builds a fresh model and example inputs from a seed, so
eager and compiled runs can start from identical state.

>>> case = ZOO["mlp"]
>>> model, args = case.make()
>>> tuple(model(*args).shape)
(8, 10)
"""

from __future__ import annotations

import importlib.util
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ZOO", "Case", "not_installed"]


def not_installed(module: str, install: str) -> str | None:
    """Why models that need ``module`` (a test/benchmark dependency) cannot be built here,
    or None when it is installed; ``install`` names what to pip install.

    >>> not_installed("torch", "torch") is None
    True
    """
    if importlib.util.find_spec(module) is None:
        return (
            f"{module} is not installed (a test/benchmark dependency: "
            f"pip install -c ci/constraints.txt {install})"
        )
    return None


@dataclass(frozen=True)
class Case:
    """A named model and how to make it: ``make(seed) -> (model, args)``."""

    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[], tuple[Any, ...]]
    train: bool = False  # run in training mode (dropout, batch statistics)

    def make(self, seed: int = 0) -> tuple[nn.Module, tuple[Any, ...]]:
        torch.manual_seed(seed)
        model = self.build()
        model.train(self.train)
        return model, self.inputs()


class MLP(nn.Module):
    def __init__(self, sizes: tuple[int, ...] = (32, 64, 64, 10)) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(sizes))
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i != last:
                x = self.act(x)
        return x


class ConvNet(nn.Module):
    """A small ResNet-style CNN: conv, BatchNorm, residual block, pooling, classifier."""

    def __init__(self, channels: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU()
        )
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        residual = x
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.bn2(self.conv2(x))
        x = F.relu(x + residual)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


class ConvBN(nn.Module):
    """Conv, eval-mode BatchNorm with statistics far from the identity (so a batch norm
    that freezing failed to fold shows in the values), ReLU, classifier."""

    def __init__(self, bias: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, bias=bias)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 6 * 6, 4)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.weight.uniform_(0.5, 2)
            self.bn.bias.uniform_(-1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device))
        scores = scores.masked_fill(~causal, float("-inf"))
        weights = self.drop(F.softmax(scores, dim=-1))
        out = (weights @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(out)


class Block(nn.Module):
    """A pre-norm transformer block: attention with a causal mask built from shapes, MLP."""

    def __init__(self, dim: int = 32, heads: int = 4, dropout: float = 0.1) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A GPT-style decoder: token and position embeddings, blocks, tied LM head."""

    def __init__(self, vocab: int = 64, dim: int = 32, layers: int = 2, context: int = 16) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.tok.weight.T


class RNN(nn.Module):
    """An Elman RNN whose time loop is Python (unrolled by the compiler)."""

    def __init__(self, inputs: int = 8, hidden: int = 16, outputs: int = 4) -> None:
        super().__init__()
        self.hidden = hidden
        self.cell = nn.RNNCell(inputs, hidden)
        self.out = nn.Linear(hidden, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.shape[0], self.hidden)
        states = []
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
            states.append(h)
        return self.out(torch.stack(states, dim=1))


class Heads(nn.Module):
    """Modules reached through an nn.ModuleDict, chosen by name; keyword arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(16, 32), nn.Tanh())
        self.heads = nn.ModuleDict({"cls": nn.Linear(32, 5), "reg": nn.Linear(32, 1)})

    def forward(
        self, x: torch.Tensor, *, which: tuple[str, ...] = ("cls", "reg")
    ) -> dict[str, Any]:
        h = self.trunk(x)
        return {name: self.heads[name](h) for name in which}


def _scaled(scale: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def apply(t: torch.Tensor) -> torch.Tensor:  # a closure over `scale`
        return t * scale

    return apply


def _norm(x: torch.Tensor, *, eps: float = 1e-5, dim: int = -1) -> torch.Tensor:
    return x / (x.pow(2).mean(dim, keepdim=True) + eps).sqrt()


class Helpers(nn.Module):
    """Helper functions with closures and keyword arguments; *args/**kwargs forwarding."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(12, 12)
        self.scale = _scaled(0.5)

    def mix(self, *tensors: torch.Tensor, **options: Any) -> torch.Tensor:
        total = sum(tensors[1:], tensors[0])
        return _norm(total, **options)

    def forward(self, *args: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.scale(self.proj(self.mix(*args, **kwargs)))


ZOO: dict[str, Case] = {
    c.name: c
    for c in [
        Case("mlp", MLP, lambda: (torch.randn(8, 32),)),
        Case("cnn-eval", ConvNet, lambda: (torch.randn(2, 3, 16, 16),)),
        Case("cnn-train", ConvNet, lambda: (torch.randn(2, 3, 16, 16),), train=True),
        Case("transformer-block", Block, lambda: (torch.randn(2, 8, 32),), train=True),
        Case("gpt", TinyGPT, lambda: (torch.randint(0, 64, (2, 12)),)),
        Case("rnn", RNN, lambda: (torch.randn(4, 6, 8),)),
        Case("moduledict", Heads, lambda: (torch.randn(4, 16),)),
        Case("helpers", Helpers, lambda: (torch.randn(3, 12), torch.randn(3, 12))),
    ]
}
