"""Compiled optimizer steps: ``compile(opt.step)`` and a training step that calls it.

After three steps the parameters and every state tensor equal eager's (the compiled
update keeps the step count a tensor, as torch's compiled path does, so the match is to
float32 rounding). The first step of an optimizer with lazy state runs eagerly (it fills
the state in); every later step reuses one graph, also when an LR scheduler changes the
learning rate between steps.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ember.compiler

OPTIMIZERS: list[tuple[str, dict[str, Any]]] = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("Adam", {"lr": 0.1}),
    ("Adam", {"lr": 0.1, "amsgrad": True, "weight_decay": 0.1}),
    ("AdamW", {"lr": 0.1}),
    ("RMSprop", {"lr": 0.01}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.9, "centered": True}),
    ("Adagrad", {"lr": 0.1}),
    ("NAdam", {"lr": 0.1}),  # (stacks two lists of step sizes while compiling, as Adam one)
]
IDS = [f"{name}-{'-'.join(map(str, kw.values()))}" for name, kw in OPTIMIZERS]
STEPS = 3


def _params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(3))]


def _set_grads(params: list[torch.nn.Parameter], k: int) -> None:
    g = torch.Generator().manual_seed(k)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def _assert_same(ref: Any, mine: Any, ref_opt: Any, my_opt: Any) -> None:
    for a, b in zip(ref, mine, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
        assert ref_opt.state[a].keys() == my_opt.state[b].keys()
        for key, value in ref_opt.state[a].items():
            torch.testing.assert_close(my_opt.state[b][key], value, atol=1e-5, rtol=1e-4)


def _run_steps(name: str, kw: dict[str, Any], foreach: bool | None, backend: str) -> Any:
    ref, mine = _params(), _params()
    ref_opt = getattr(torch.optim, name)(ref, foreach=foreach, **kw)
    my_opt = getattr(torch.optim, name)(mine, foreach=foreach, **kw)
    step = ember.compiler.compile(my_opt.step, backend=backend)
    for k in range(STEPS):
        _set_grads(ref, k)
        _set_grads(mine, k)
        ref_opt.step()
        step()
    _assert_same(ref, mine, ref_opt, my_opt)
    return step


def _step_graphs(stats: ember.compiler.Stats) -> int:
    """Graphs of the step itself (torch.optim imports torch._dynamo at its first step, which
    runs eagerly here: frames CPython runs for that import are compiled too)."""
    return sum(c.code.startswith("Optimizer.profile_hook_step") for c in stats.compiled)


def _lazy_state(name: str, kw: dict[str, Any]) -> bool:
    return not (name == "SGD" and not kw.get("momentum")) and name != "Adagrad"


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "single"])
@pytest.mark.parametrize(("name", "kw"), OPTIMIZERS, ids=IDS)
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_step_matches_eager_in_one_graph(
    backend: str, name: str, kw: dict[str, Any], foreach: bool
) -> None:
    step = _run_steps(name, kw, foreach, backend)
    assert _step_graphs(step.stats) == 1, step.stats
    ours = [f for f in step.stats.failures if f.code.startswith("Optimizer.")]
    assert [f.category for f in ours] == ["first-call"] * int(_lazy_state(name, kw)), ours
    assert not [b for b in step.stats.breaks if b.code.startswith("Optimizer.")]


@pytest.mark.slow
@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "single"])
@pytest.mark.parametrize(
    ("name", "kw"), [OPTIMIZERS[1], OPTIMIZERS[3], OPTIMIZERS[5]], ids=["SGD", "Adam", "AdamW"]
)
def test_step_on_inductor(name: str, kw: dict[str, Any], foreach: bool) -> None:
    step = _run_steps(name, kw, foreach, "inductor")
    assert _step_graphs(step.stats) == 1, step.stats


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> Any:
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_training_step_with_a_scheduler_compiles_the_step_once(backend: str) -> None:
    torch.manual_seed(0)
    ref, mine = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    mine.load_state_dict(ref.state_dict())
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.1, foreach=True)
    my_opt = torch.optim.AdamW(mine.parameters(), lr=0.1, foreach=True)
    ref_lr = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
    my_lr = torch.optim.lr_scheduler.StepLR(my_opt, step_size=1, gamma=0.5)
    train = ember.compiler.compile(_train, backend=backend)
    x = torch.randn(8, 4)
    for _ in range(5):
        expected = _train(ref, ref_opt, x)
        ref_lr.step()
        torch.testing.assert_close(train(mine, my_opt, x), expected, atol=1e-5, rtol=1e-4)
        my_lr.step()
    assert my_opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"] == 0.1 / 32
    _assert_same(list(ref.parameters()), list(mine.parameters()), ref_opt, my_opt)
    # forward, then the step: the LR the scheduler changes is a graph input, not a constant
    # (frames CPython runs at the breaks may be compiled too: the aot backward's forward)
    ours = [c for c in train.stats.compiled if c.code.startswith("_train")]
    assert [c.code.split(" ")[0] for c in ours] == ["_train", "_train.<resume"], ours
    assert ours[1].ops > 20  # the whole update in one graph
    reasons = [b.reason for b in train.stats.breaks if b.code.startswith("_train")]
    assert reasons[0] == "calling .backward() inside compiled code"
    assert "_disable_dynamo" in reasons[1]  # zero_grad runs eagerly, as torch marks it


def test_the_first_step_runs_eagerly_and_says_why() -> None:
    params = _params()
    opt = torch.optim.Adam(params, lr=0.1, foreach=True)
    step = ember.compiler.compile(opt.step, backend="eager")
    _set_grads(params, 0)
    step()
    # (torch.optim imports torch._dynamo at its first step: frames of that import may fail)
    (first,) = [f for f in step.stats.failures if f.category == "first-call"]
    assert first.reason.startswith("a new key in a defaultdict (this call runs eagerly")
    assert first.where is not None and first.where.filename.endswith("adam.py")
    step()
    assert _step_graphs(step.stats) == 1


def test_step_state_mutation_is_seen_by_eager_code() -> None:
    params = _params()
    opt = torch.optim.SGD(params, lr=0.5, momentum=0.9, foreach=True)
    step = ember.compiler.compile(opt.step, backend="aot_eager")
    for k in range(3):
        _set_grads(params, k)
        step()
    buffers = [opt.state[p]["momentum_buffer"] for p in params]
    before = [b.clone() for b in buffers]
    _set_grads(params, 3)
    step()  # the compiled graph writes the very tensors the state dict holds
    assert all(opt.state[p]["momentum_buffer"] is b for p, b in zip(params, buffers, strict=True))
    assert all(not torch.equal(b, old) for b, old in zip(buffers, before, strict=True))


def test_explain_an_optimizer_step() -> None:
    params = _params()
    opt = torch.optim.SGD(params, lr=0.1, foreach=True)
    _set_grads(params, 0)
    out = ember.compiler.explain(opt.step)()  # torch.optim's frame, named by the user
    assert (out.graph_count, out.graph_break_count) == (1, 0), out
    assert out.ops_per_graph[0].count("add_") == 2  # one update per parameter


def test_an_optimizer_that_picks_its_implementation_is_captured() -> None:
    # foreach=None: torch.optim asks which devices have foreach/fused kernels on every step
    step = _run_steps("AdamW", {"lr": 0.1}, None, "eager")
    assert _step_graphs(step.stats) == 1
