"""Tiny diffusers models, random-init from configs (no weights downloaded).

The image side of the real-model workloads: a denoising UNet (``UNet2DModel``:
convolutions, group norm, SiLU, attention at the lower resolution, up- and
down-sampling, a sinusoidal timestep embedding) and a VAE (``AutoencoderKL``:
the same blocks without time, encoder and decoder). One copy for the benchmarks
(``benchmarks/workloads.py``) and the real-model tests. diffusers is a test and
benchmark dependency only (pinned in ``ci/constraints.txt``); :func:`missing`
says why the models cannot be built when it is not installed.

The programs compiled are functions of tensors that return the sample tensor
(diffusers returns a dataclass); training scores it against a random target
with mean squared error, as a denoising loss does.

>>> if missing() is None:  # diffusers is installed
...     program, inputs = DIFFUSION_MODELS["unet"].make(quick=True)
...     print(type(program.model).__name__, tuple(program(*inputs).shape))
... else:
...     print("UNet2DModel (2, 3, 16, 16)")
UNet2DModel (2, 3, 16, 16)
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from models import not_installed

__all__ = ["DIFFUSION_MODELS", "DiffusionModel", "missing"]


def missing() -> str | None:
    """Why the models cannot be built (diffusers not installed), or None if they can."""
    return not_installed("diffusers", "diffusers")


@dataclass(frozen=True)
class Sizes:
    """Batch, image side, channels of the two resolutions, group-norm groups."""

    batch: int
    side: int
    channels: tuple[int, int]
    groups: int


class Sample(nn.Module):
    """``model(...).sample``: the tensor a diffusers model returns, as a module's output."""

    def __init__(self, model: nn.Module, call: Callable[..., Any]) -> None:
        super().__init__()
        self.model = model
        self.call = call

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        sample: torch.Tensor = self.call(self.model, *inputs).sample
        return sample


@dataclass(frozen=True)
class DiffusionModel:
    """A diffusers model class and config at two sizes, and its inputs."""

    name: str
    model_class: str  # a name in the diffusers namespace
    config: Callable[[Sizes], dict[str, Any]]
    inputs: Callable[[Sizes], tuple[torch.Tensor, ...]]
    call: Callable[..., Any]  # (model, *inputs) -> the diffusers output
    full: Sizes
    quick: Sizes

    def sizes(self, quick: bool) -> Sizes:
        return self.quick if quick else self.full

    def about(self) -> str:
        s = self.full
        return f"{self.model_class}: channels {s.channels}; {s.batch} images {s.side}x{s.side}"

    def build(self, quick: bool = False) -> Sample:
        """A random-init model (the caller seeds torch) returning its sample tensor."""
        module = importlib.import_module("diffusers")
        model = getattr(module, self.model_class)(**self.config(self.sizes(quick)))
        return Sample(model, self.call)

    def make(self, quick: bool = False, seed: int = 0) -> tuple[Sample, tuple[torch.Tensor, ...]]:
        """``(program, inputs)`` built from ``seed``: call ``program(*inputs)``."""
        torch.manual_seed(seed)
        program = self.build(quick)
        return program, self.inputs(self.sizes(quick))

    def targets(self, quick: bool) -> torch.Tensor:
        """What training compares the sample with (a random image of its shape)."""
        s = self.sizes(quick)
        return torch.randn(s.batch, 3, s.side, s.side)


def _unet(s: Sizes) -> dict[str, Any]:
    return dict(
        sample_size=s.side, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=s.channels, norm_num_groups=s.groups, attention_head_dim=16,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
    )  # fmt: skip


def _vae(s: Sizes) -> dict[str, Any]:
    return dict(
        sample_size=s.side, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=s.channels, norm_num_groups=s.groups, latent_channels=4,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
    )  # fmt: skip


def _noisy(s: Sizes) -> tuple[torch.Tensor, ...]:
    """A noisy image and one diffusion timestep per image."""
    return torch.randn(s.batch, 3, s.side, s.side), torch.randint(0, 1000, (s.batch,))


def _image(s: Sizes) -> tuple[torch.Tensor, ...]:
    return (torch.randn(s.batch, 3, s.side, s.side),)


DIFFUSION_MODELS: dict[str, DiffusionModel] = {
    m.name: m
    for m in [
        DiffusionModel("unet", "UNet2DModel", _unet, _noisy, lambda m, x, t: m(x, t),
                       Sizes(4, 32, (32, 64), 8), Sizes(2, 16, (16, 32), 4)),
        DiffusionModel("vae", "AutoencoderKL", _vae, _image,
                       lambda m, x: m(x, sample_posterior=False),
                       Sizes(4, 32, (32, 64), 8), Sizes(2, 16, (16, 32), 4)),
    ]
}  # fmt: skip
