"""The model zoo under ember.compiler.compile: one graph each, equal to eager, cached, guarded."""

from __future__ import annotations

import copy
import operator
from typing import Any

import pytest
import torch
from models import ZOO

import ember.compiler
from ember.compiler.testing import CompileCounter

CASES = sorted(ZOO)


def assert_same(got: Any, want: Any) -> None:
    if isinstance(want, dict):
        assert got.keys() == want.keys()
        for k in want:
            assert_same(got[k], want[k])
        return
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def run(model: torch.nn.Module, args: tuple[Any, ...], seed: int = 1) -> Any:
    torch.manual_seed(seed)
    return model(*args)


def compiled(name: str) -> tuple[torch.nn.Module, torch.nn.Module, Any, tuple[Any, ...]]:
    model, args = ZOO[name].make()
    reference = copy.deepcopy(model)
    counter = CompileCounter()
    return reference, ember.compiler.compile(model, backend=counter), counter, args


@pytest.mark.parametrize("name", CASES)
def test_one_graph_equal_to_eager_and_cached(name):
    reference, opt, counter, args = compiled(name)
    assert_same(run(opt, args), run(reference, args))
    assert_same(run(opt, args, seed=2), run(reference, args, seed=2))
    assert counter.frame_count == 1, opt.stats.failures
    assert opt.stats.failures == []
    # buffers updated in place (BatchNorm running statistics) match eager too
    for (key, mine), (_, theirs) in zip(
        opt.state_dict().items(), reference.state_dict().items(), strict=True
    ):
        torch.testing.assert_close(mine, theirs, msg=key)


@pytest.mark.parametrize("name", CASES)
def test_new_shape_recompiles_exactly_once(name):
    reference, opt, counter, args = compiled(name)
    run(opt, args)
    bigger = tuple(torch.cat([a, a]) if isinstance(a, torch.Tensor) else a for a in args)
    assert_same(run(opt, bigger), run(reference, bigger))
    run(opt, bigger)
    run(opt, args)
    assert counter.frame_count == 2


@pytest.mark.parametrize("name", CASES)
def test_grad_mode_recompiles_exactly_once(name):
    reference, opt, counter, args = compiled(name)
    run(opt, args)
    with torch.no_grad():
        assert_same(run(opt, args), run(reference, args))
        run(opt, args)
    run(opt, args)
    assert counter.frame_count == 2


@pytest.mark.parametrize("name", [n for n in CASES if n != "gpt"])  # gpt takes integer tokens
def test_dtype_and_requires_grad_recompile_exactly_once(name):
    reference, opt, counter, args = compiled(name)
    run(opt, args)
    wants_grad = tuple(a.clone().requires_grad_() for a in args)
    assert_same(run(opt, wants_grad), run(reference, wants_grad))
    assert counter.frame_count == 2
    opt.double()
    reference.double()
    doubles = tuple(a.double() for a in args)
    assert_same(run(opt, doubles), run(reference, doubles))
    run(opt, doubles)
    assert counter.frame_count == 3


@pytest.mark.parametrize("name", CASES)
def test_custom_backend_receives_the_models_torch_ops(name):
    seen: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
        seen.append(gm)
        assert all(isinstance(t, torch.Tensor) for t in example_inputs)
        return gm.forward

    model, args = ZOO[name].make()
    opt = ember.compiler.compile(model, backend=backend)
    run(opt, args)
    (gm,) = seen
    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert calls, "the graph holds the model's operations"
    for node in calls:
        if node.op == "call_method":
            assert hasattr(torch.Tensor, node.target), node.target
        else:
            module = getattr(node.target, "__module__", None) or ""
            assert node.target in vars(operator).values() or module.startswith("torch"), node
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    params = sum(1 for _ in model.parameters()) + sum(1 for _ in model.buffers())
    assert len(placeholders) <= params + len(args), "parameters are graph inputs, not constants"
    assert not any(n.op == "get_attr" for n in gm.graph.nodes)


def test_parameters_are_inputs_so_updates_are_seen_without_recompiling():
    model, args = ZOO["mlp"].make()
    counter = CompileCounter()
    opt = ember.compiler.compile(model, backend=counter)
    before = run(opt, args)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    after = run(opt, args)
    assert not torch.allclose(before, after)
    assert_same(after, run(model, args))
    assert counter.frame_count == 1


def test_train_eval_switch_recompiles_and_matches():
    reference, opt, counter, args = compiled("cnn-train")
    assert_same(run(opt, args), run(reference, args))
    opt.eval()
    reference.eval()
    assert not opt._orig_mod.training
    assert_same(run(opt, args), run(reference, args))
    assert counter.frame_count == 2
