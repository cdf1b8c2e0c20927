"""Training the model zoo under ``compile(model, backend="aot_eager")``: equal to eager.

Loss, every parameter's gradient, BatchNorm running statistics and five SGD and
Adam steps match eager for the MLP, the CNN with BatchNorm, the transformer
block with dropout (same seed, same masks) and the RNN; under ``no_grad`` the
forward-only (inference) path runs.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from models import ZOO

import ember.compiler
from ember.aotgraph import AOTCompiled
from ember.compiler.backends import aot_eager

TRAINING = ["mlp", "cnn-train", "transformer-block", "rnn"]


def loss_of(out: Any) -> torch.Tensor:
    return out.float().pow(2).mean()


def step(model: torch.nn.Module, args: tuple[Any, ...], seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    loss = loss_of(model(*args))
    loss.backward()
    return loss


def assert_state_equal(mine: torch.nn.Module, theirs: torch.nn.Module) -> None:
    for (key, a), (_, b) in zip(
        mine.state_dict().items(), theirs.state_dict().items(), strict=True
    ):
        torch.testing.assert_close(a, b, msg=key)


def recording() -> tuple[list[AOTCompiled], Any]:
    built: list[AOTCompiled] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        compiled = aot_eager(gm, example_inputs)
        assert isinstance(compiled, AOTCompiled)
        built.append(compiled)
        return compiled

    return built, backend


@pytest.mark.parametrize("name", TRAINING)
def test_loss_grads_and_buffers_match_eager(name):
    model, args = ZOO[name].make()
    reference = copy.deepcopy(model)
    built, backend = recording()
    opt = ember.compiler.compile(model, backend=backend)
    for seed in (1, 2):
        torch.testing.assert_close(step(opt, args, seed), step(reference, args, seed))
        for (key, p), (_, q) in zip(
            model.named_parameters(), reference.named_parameters(), strict=True
        ):
            assert p.grad is not None, key
            torch.testing.assert_close(p.grad, q.grad, msg=key)
        assert_state_equal(model, reference)  # BatchNorm running stats, num_batches_tracked
    assert opt.stats.failures == []
    assert len(built) == 1 and built[0].partition is not None
    assert built[0].inference is None


@pytest.mark.parametrize("name", TRAINING)
def test_outputs_and_gradients_are_bit_identical_to_eager(name):
    # aot_eager runs eager's own kernels in eager's order (no decompositions)
    model, args = ZOO[name].make()
    reference = copy.deepcopy(model)
    opt = ember.compiler.compile(model, backend="aot_eager")
    torch.manual_seed(0)
    mine = opt(*args)
    loss_of(mine).backward()
    torch.manual_seed(0)
    theirs = reference(*args)
    loss_of(theirs).backward()
    assert torch.equal(mine, theirs)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam])
@pytest.mark.parametrize("name", TRAINING)
def test_five_optimizer_steps_match_eager(name, optimizer):
    model, args = ZOO[name].make()
    reference = copy.deepcopy(model)
    opt = ember.compiler.compile(model, backend="aot_eager")
    mine = optimizer(model.parameters(), lr=0.01)
    theirs = optimizer(reference.parameters(), lr=0.01)
    for i in range(5):
        mine.zero_grad()
        theirs.zero_grad()
        torch.testing.assert_close(step(opt, args, i), step(reference, args, i))
        mine.step()
        theirs.step()
        assert_state_equal(model, reference)


def test_dropout_masks_match_eager_with_the_same_seed():
    model, args = ZOO["transformer-block"].make()
    reference = copy.deepcopy(model)
    opt = ember.compiler.compile(model, backend="aot_eager")
    torch.manual_seed(7)
    mine = opt(*args)
    torch.manual_seed(7)
    theirs = reference(*args)
    torch.testing.assert_close(mine, theirs)
    torch.manual_seed(8)
    assert not torch.allclose(opt(*args), mine)  # a new seed draws new masks


@pytest.mark.parametrize("name", ["cnn-train", "mlp"])
def test_inference_path_when_grad_is_off(name):
    model, args = ZOO[name].make()
    reference = copy.deepcopy(model)
    built, backend = recording()
    opt = ember.compiler.compile(model, backend=backend)
    with torch.no_grad():
        out = opt(*args)
        torch.testing.assert_close(out, reference(*args))
    assert not out.requires_grad
    assert_state_equal(model, reference)
    assert len(built) == 1
    assert built[0].training is None and built[0].inference_graph is not None


def test_second_backward_without_retain_graph_errors_like_eager():
    model, args = ZOO["mlp"].make()
    opt = ember.compiler.compile(model, backend="aot_eager")
    out = opt(*args)  # its grad_fn is the compiled backward itself
    out.backward(torch.ones_like(out), retain_graph=True)
    out.backward(torch.ones_like(out))
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.backward(torch.ones_like(out))


def _no_grad_then_break(x):
    with torch.no_grad():
        y = x * 2
    print("a graph break")
    return y + x


def test_no_grad_region_across_a_graph_break_matches_eager(capsys):
    x, x_ref = torch.ones(4, requires_grad=True), torch.ones(4, requires_grad=True)
    compiled = ember.compiler.compile(_no_grad_then_break, backend="aot_eager")
    compiled(x).sum().backward()
    _no_grad_then_break(x_ref).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)  # y carries no gradient in either
