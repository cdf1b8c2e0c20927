"""The benchmark suite: which programs ``benchmarks/run.py`` measures, at which sizes.

A *family* is a program and its inputs at two sizes (``full`` for the real
run, ``quick`` for the smoke run) and, if it has parameters, how to train it
(targets, loss, optimizer). Each family gives an inference *workload*
(``<family>-infer``, run under ``torch.no_grad``) and, when it trains, a
training workload (``<family>-train``: forward, loss, backward, optimizer
step). The program itself is what gets compiled; loss and optimizer run eagerly.

>>> sorted(WORKLOADS)[:3]
['bert-infer', 'bert-train', 'df-unet-infer']
>>> run = WORKLOADS["mlp-train"].prepare(quick=True)
>>> run.step().ndim  # a training step returns the loss
0
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from models import MLP, RNN, ConvNet
from models.diffusion import DIFFUSION_MODELS, DiffusionModel
from models.diffusion import missing as diffusers_missing
from models.hf import HF_MODELS, HFModel, missing
from models.suite import BreakingNet, Decoder, Encoder, pointwise_chain, softmax_layernorm
from torch import nn

__all__ = ["FAMILIES", "QUICK", "WORKLOADS", "Family", "Prepared", "Workload"]

Program = nn.Module | Callable[..., Any]
Inputs = tuple[Any, ...] | dict[str, Any]  # positional arguments, or keyword arguments
Optimizer = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def _sgd(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def _adamw(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3)


def _classes(out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.flatten(0, -2), labels.flatten())


@dataclass(frozen=True)
class Family:
    """A program at two sizes; ``train`` is ``(targets, loss, optimizer)`` if it has parameters."""

    name: str
    about: str
    build: Callable[[bool], tuple[Program, Inputs]]  # quick -> (program, inputs)
    targets: Callable[[bool], Any] | None = None  # quick -> what the loss compares against
    loss: Callable[[Any, Any], torch.Tensor] | None = None
    optimizer: Optimizer | None = None
    missing: Callable[[], str | None] = lambda: None  # why it cannot run here (a package)


def _pointwise(quick: bool) -> tuple[Program, tuple[Any, ...]]:
    n = 256 if quick else 1024
    return pointwise_chain, (torch.randn(n, n), torch.randn(n, n))


def _softmax_ln(quick: bool) -> tuple[Program, tuple[Any, ...]]:
    b, t, d = (4, 32, 64) if quick else (32, 128, 256)
    return softmax_layernorm, (torch.randn(b, t, d), torch.randn(d), torch.randn(d))


def _mlp(quick: bool) -> tuple[Program, tuple[Any, ...]]:
    sizes, batch = ((32, 64, 64, 10), 8) if quick else ((256, 1024, 1024, 10), 64)
    return MLP(sizes), (torch.randn(batch, sizes[0]),)


def _cnn(quick: bool) -> tuple[Program, tuple[Any, ...]]:
    channels, shape = (8, (2, 3, 16, 16)) if quick else (16, (8, 3, 32, 32))
    return ConvNet(channels), (torch.randn(shape),)


def _gpt(quick: bool) -> tuple[Program, tuple[Any, ...]]:
    vocab, dim, layers, heads, t, b = (64, 32, 2, 2, 16, 2) if quick else (512, 128, 4, 4, 64, 4)
    return Decoder(vocab, dim, layers, heads, t), (torch.randint(0, vocab, (b, t)),)


def _bert(quick: bool) -> tuple[Program, tuple[Any, ...]]:
    vocab, dim, layers, heads, t, b = (64, 32, 2, 2, 16, 2) if quick else (1000, 128, 4, 4, 64, 4)
    lengths = torch.randint(t // 2, t + 1, (b, 1))
    keep = torch.arange(t)[None, :] < lengths  # padding mask: True where a token is real
    return Encoder(vocab, dim, layers, heads, t), (torch.randint(0, vocab, (b, t)), keep)


def _rnn(quick: bool) -> tuple[Program, tuple[Any, ...]]:
    inputs, hidden, outputs, b, t = (8, 16, 4, 4, 6) if quick else (32, 128, 8, 16, 32)
    return RNN(inputs, hidden, outputs), (torch.randn(b, t, inputs),)


def _breaks(quick: bool) -> tuple[Program, tuple[Any, ...]]:
    dim, hidden, b = (32, 64, 8) if quick else (256, 512, 64)
    return BreakingNet(dim, hidden), (torch.randn(b, dim),)


def _labels(
    classes: int, full: tuple[int, ...], quick: tuple[int, ...], quick_classes: int | None = None
) -> Callable[[bool], Any]:
    """Targets in ``range(classes)`` (``quick_classes`` at the quick size, if it differs)."""
    return lambda q: torch.randint(
        0, (quick_classes or classes) if q else classes, quick if q else full
    )


def _values(full: tuple[int, ...], quick: tuple[int, ...]) -> Callable[[bool], Any]:
    return lambda q: torch.randn(quick if q else full)


def _hf(model: HFModel) -> Family:
    """A tiny transformers model (``models/hf.py``); its loss is cross-entropy on the logits."""
    sizes = model.sizes
    return Family(
        f"hf-{model.name}", model.about(), lambda q: (model.build(q), model.inputs(sizes(q))),
        lambda q: model.targets(sizes(q)), _logits_loss, _adamw, missing,
    )  # fmt: skip


def _diffusion(model: DiffusionModel) -> Family:
    """A tiny diffusers model (``models/diffusion.py``); its loss is MSE on the sample."""
    return Family(
        f"df-{model.name}", model.about(), model.make, model.targets, F.mse_loss, _adamw,
        diffusers_missing,
    )  # fmt: skip


def _logits_loss(out: Any, labels: torch.Tensor) -> torch.Tensor:
    return _classes(out.logits, labels)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("pointwise", "17 elementwise ops on two 1024x1024 tensors (a function)", _pointwise),
        Family("softmax-ln", "softmax, residual, layer norm, 32x128x256 (a function)", _softmax_ln),
        Family("mlp", "MLP 256-1024-1024-10, batch 64", _mlp,
               _labels(10, (64,), (8,)), _classes, _sgd),
        Family("resnet", "ResNet-style CNN, 16 channels, BatchNorm, 8x3x32x32", _cnn,
               _labels(10, (8,), (2,)), _classes, _sgd),
        Family("gpt", "GPT decoder: vocab 512, dim 128, 4 blocks, 4x64 tokens", _gpt,
               _labels(512, (4, 64), (2, 16), quick_classes=64), _classes, _adamw),
        Family("bert", "BERT encoder: vocab 1000, dim 128, 4 layers, 4x64 tokens, padding", _bert,
               _labels(2, (4,), (2,)), _classes, _adamw),
        Family("rnn", "Elman RNN, Python loop over 32 steps, hidden 128, batch 16", _rnn,
               _values((16, 32, 8), (4, 6, 4)), F.mse_loss, _sgd),
        Family("graph-breaks", "MLP with an item() branch and a tolist() trip, batch 64", _breaks,
               _values((64, 256), (8, 32)), F.mse_loss, _sgd),
        *(_hf(model) for model in HF_MODELS.values()),
        *(_diffusion(model) for model in DIFFUSION_MODELS.values()),
    ]
}  # fmt: skip


@dataclass
class Prepared:
    """A workload made ready: the program to compile, and one step of the workload over it.

    ``compile(fn)`` swaps in a compiled version of the program; ``step()`` then
    runs it (an inference call, or a whole training step returning the loss).
    """

    program: Program
    inputs: Inputs
    mode: str
    step_fn: Callable[[Callable[..., Any]], Any]
    callable: Callable[..., Any] | None = None
    optimizer: torch.optim.Optimizer | None = None
    model: nn.Module | None = None  # "step" mode: the model the whole-step program trains

    def compile(self, make: Callable[[Program], Callable[..., Any]]) -> None:
        self.callable = make(self.program)

    def step(self) -> Any:
        return self.step_fn(self.program if self.callable is None else self.callable)

    def forward(self, fn: Callable[..., Any]) -> Any:
        """One call of ``fn`` on the inputs, with autograd on only when training."""
        with torch.set_grad_enabled(self.mode != "infer"):
            return _call(fn, self.inputs)

    def state(self) -> dict[str, torch.Tensor]:
        """Parameters and buffers after the steps so far (empty for a function)."""
        model = self.model or self.program
        if not isinstance(model, nn.Module):
            return {}
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    def grads(self) -> dict[str, torch.Tensor]:
        """The gradients of the last training step (empty for inference or a function)."""
        model = self.model or self.program
        if not isinstance(model, nn.Module):
            return {}
        named = model.named_parameters()
        return {k: p.grad.detach().clone() for k, p in named if p.grad is not None}

    def drift(self, steps: int) -> float:
        """How far ``steps`` optimizer steps may move a parameter whose gradient is rounding
        noise, in two correct implementations: 0, except under Adam and AdamW, which move
        every parameter by up to ``lr`` a step however small its gradient (attention's key
        bias has an exact gradient of 0, so its moves follow the rounding of each run)."""
        opt = self.optimizer
        if not isinstance(opt, torch.optim.Adam | torch.optim.AdamW):
            return 0.0
        return steps * max(float(g["lr"]) for g in opt.param_groups)


@dataclass(frozen=True)
class Workload:
    """One row group of the report: a family in ``infer``, ``train`` or ``step`` mode.

    ``train`` compiles the model and runs the step around it; ``step`` compiles the whole
    training step (zero_grad, forward, loss, backward, the optimizer's step) as one function,
    so the optimizer's update is compiled and timed too."""

    family: Family
    mode: str  # "infer" | "train" | "step"

    @property
    def name(self) -> str:
        return f"{self.family.name}-{self.mode}"

    def prepare(self, quick: bool = False, seed: int = 0) -> Prepared:
        """Build the program, inputs (and targets, optimizer) from ``seed``."""
        torch.manual_seed(seed)
        program, inputs = self.family.build(quick)
        if isinstance(program, nn.Module):
            program.train(self.mode == "train")
        if self.mode == "infer":
            return Prepared(program, inputs, self.mode, lambda fn: _infer(fn, inputs))
        assert isinstance(program, nn.Module) and self.family.optimizer and self.family.targets
        targets, loss = self.family.targets(quick), self.family.loss
        opt = self.family.optimizer(program.parameters())
        if self.mode == "step":
            model = program

            def whole_step(*args: Any, **kwargs: Any) -> torch.Tensor:
                return _train(model, args or kwargs, targets, loss, opt)

            run = lambda fn: _call(fn, inputs)  # noqa: E731
            return Prepared(whole_step, inputs, self.mode, run, optimizer=opt, model=model)
        step = lambda fn: _train(fn, inputs, targets, loss, opt)  # noqa: E731
        return Prepared(program, inputs, self.mode, step, optimizer=opt)


def _call(fn: Callable[..., Any], inputs: Inputs) -> Any:
    return fn(**inputs) if isinstance(inputs, dict) else fn(*inputs)


def _infer(fn: Callable[..., Any], inputs: Inputs) -> Any:
    with torch.no_grad():
        return _call(fn, inputs)


def _train(
    fn: Callable[..., Any],
    inputs: Inputs,
    targets: Any,
    loss: Any,
    opt: torch.optim.Optimizer,
) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    value: torch.Tensor = loss(_call(fn, inputs), targets)
    value.backward()
    opt.step()
    return value.detach()


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for f in FAMILIES.values()
    for w in [Workload(f, "infer"), *([Workload(f, "train")] if f.optimizer else [])]
}
# the whole training step, optimizer included, compiled as one function (issue 21)
WORKLOADS["gpt-step"] = Workload(FAMILIES["gpt"], "step")

# The smoke run (--quick): a training step, and the graph-breaking program.
QUICK = ["mlp-train", "graph-breaks-infer"]
