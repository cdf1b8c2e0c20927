"""The frame hook next to torch: optimizers, and torch's own PEP 523 hook."""

from __future__ import annotations

import pytest
import torch

from ember.capture import hook
from ember.capture.hook import Decision

eval_frame = pytest.importorskip("torch._C._dynamo.eval_frame")  # peer, used only to stack hooks


@pytest.fixture(autouse=True)
def clean_hook():
    hook.reset()
    yield
    hook.reset()
    assert hook.get_callback() is None
    assert hook.state().active_threads == 0


class Seen:
    def __init__(self) -> None:
        self.names: list[str] = []

    def __call__(self, frame: hook.Frame) -> Decision:
        if frame.code.co_filename == __file__:
            self.names.append(frame.code.co_name)
            return Decision.RUN
        return Decision.SKIP


def after_step(x):
    return x + 1


@pytest.mark.parametrize("make_opt", [torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW])
def test_optimizer_step_inside_an_enabled_region_keeps_the_hook(make_opt):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = make_opt(model.parameters(), lr=0.1)
    seen = Seen()
    with hook.intercepting(seen):
        for _ in range(2):
            loss = model(torch.randn(3, 4)).square().sum()
            loss.backward()
            opt.step()  # wrapped in torch._disable_dynamo, which toggles torch's eval-frame state
            opt.zero_grad()
            assert hook.state().installed == "top"
            assert after_step(1) == 2
    assert seen.names == ["after_step", "after_step"]
    assert hook.state().installed == "absent"


def test_ember_over_torchs_hook_restores_it_on_exit():
    torch_prior = eval_frame.set_eval_frame(False)  # torch's run-only mode installs its shim
    try:
        seen = Seen()
        with hook.intercepting(seen):
            assert hook.state().installed == "top"
            after_step(1)
        assert hook.state().installed == "absent"
        assert seen.names == ["after_step"]
    finally:
        eval_frame.set_eval_frame(torch_prior)


def test_torchs_hook_over_ember_keeps_ember_in_the_chain():
    seen = Seen()
    with hook.intercepting(seen):
        torch_prior = eval_frame.set_eval_frame(False)  # torch installs over us, chains to us
        try:
            assert hook.state().installed == "chained"
            after_step(1)  # reaches ember through torch's shim
        finally:
            eval_frame.set_eval_frame(torch_prior)  # torch restores us
        assert hook.state().installed == "top"
        after_step(2)
    assert seen.names == ["after_step", "after_step"]
    assert hook.state().installed == "absent"


def test_torch_keeps_ember_in_its_chain_after_ember_lets_go():
    seen = Seen()
    with hook.intercepting(seen):
        torch_prior = eval_frame.set_eval_frame(False)
    # ember's last thread let go while torch sat on top: ember stays as a pass-through
    assert hook.state().installed == "chained"
    after_step(1)
    eval_frame.set_eval_frame(torch_prior)  # torch puts ember back on top ...
    after_step(2)  # ... and ember's pass-through steps out at the next call
    assert hook.state().installed == "absent"
    assert seen.names == []


def test_torch_compile_inside_an_ember_region():
    seen = Seen()

    def body(x):
        return torch.sin(x) + 1

    compiled = torch.compile(body, backend="eager")
    x = torch.randn(8)
    with hook.intercepting(seen):
        assert torch.equal(compiled(x), body(x))
        assert hook.state().installed == "top"
        after_step(1)
    assert "after_step" in seen.names
    assert hook.state().installed == "absent"
